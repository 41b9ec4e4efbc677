"""What one request's output constraint or scoring costs, and what the request bounds let in.

`grammars`: each constraint's verdict under the default bounds (admitted, or the flag that
refuses it) and, for those it compiles, the CPU seconds of its compile, the memory xgrammar says
the compiled grammar holds and the process's RSS growth, on the demo model's vocabulary.
`scoring`: `echo` + `logprobs: 20` over two prompts of 1,000 ids with `n` choices against a
served demo model: status, response size, prompt positions scored, CPU and RSS growth.

    PYTHONPATH=$PWD python benchmarks/request_bounds.py grammars [--all]
    PYTHONPATH=$PWD python benchmarks/request_bounds.py scoring --n 4 16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx
import psutil

from baton.core.request_bounds import RequestBounds
from baton.core.sampling_params import InvalidRequestError
from baton.core.structured_output import GuideKind, StructuredOutput

DEMO_MODEL = Path(__file__).resolve().parent.parent / "app" / "demo_model"
SCHEMA, CHOICE, REGEX = GuideKind.JSON_SCHEMA, GuideKind.CHOICE, GuideKind.REGEX


def word(index: int, length: int) -> str:
    return (f"v{index:06d}" + "x" * length)[:length]


def schema(value: object) -> str:
    return json.dumps(value)


def string(max_length: int) -> dict:
    return {"type": "string", "maxLength": max_length}


def optional_properties(count: int, name_length: int) -> str:
    return schema(
        {"type": "object", "properties": {word(i, name_length): {} for i in range(count)}}
    )


# (name, kind, text): the largest of each shape the defaults admit, then attacks they refuse.
CONSTRAINTS = [
    ("maxLength 1024", SCHEMA, schema(string(1024))),
    ("4 strings of maxLength 256", SCHEMA, schema({"type": "object", "properties": {
        f"s{i}": string(256) for i in range(4)}})),
    ("enum 240 x 256 chars", SCHEMA, schema({"enum": [word(i, 256) for i in range(240)]})),
    ("choices 1024 x 56 chars", CHOICE, schema([word(i, 56) for i in range(1024)])),
    ("230 optional properties, 256-char names", SCHEMA, optional_properties(230, 256)),
    ("regex 2 x 4000-char alternatives", REGEX, "|".join(word(i, 4000) for i in range(2))),
    ("maxLength 5000", SCHEMA, schema(string(5000))),
    ("enum 4 x 16000 chars", SCHEMA, schema({"enum": [word(i, 16000) for i in range(4)]})),
    ("enum 16000 x 16 chars", SCHEMA, schema({"enum": [word(i, 16) for i in range(16000)]})),
    ("choices 256 x 3000 chars", CHOICE, schema([word(i, 3000) for i in range(256)])),
    ("1024 optional properties, 40-char names", SCHEMA, optional_properties(1024, 40)),
    ("regex 2 x 8000-char alternatives", REGEX, "|".join(word(i, 8000) for i in range(2))),
]  # fmt: skip


def grammars(compile_refused: bool) -> None:
    from baton.gpu.structured_output import XGrammarCompiler

    bounds = RequestBounds()
    compiler = XGrammarCompiler(DEMO_MODEL, 4096, [2], cache_bytes=0)
    compiler.compile(StructuredOutput(GuideKind.JSON_OBJECT))  # xgrammar's one-off set-up
    print("| constraint | text | default bounds | compile CPU | grammar | RSS growth |")
    print("|---|---|---|---|---|---|")
    for name, kind, text in CONSTRAINTS:
        constraint = StructuredOutput(kind, text, "guided")
        try:
            bounds.check_constraint(constraint)
            verdict = "admitted"
        except InvalidRequestError as error:
            verdict = "400 " + str(error).split("(")[-1].split(")")[0]
        row = f"| {name} | {len(text):,} B | {verdict} |"
        if verdict != "admitted" and not compile_refused:
            print(row + " | | |", flush=True)
            continue
        process = psutil.Process()
        rss, start = process.memory_info().rss, time.process_time()
        grammar = compiler.compile(constraint).grammar
        seconds = time.process_time() - start
        growth = (process.memory_info().rss - rss) / 1e6
        size = grammar.memory_size_bytes / 1e6
        print(f"{row} {seconds:.2f} s | {size:.2f} MB | {growth:+.0f} MB |", flush=True)


def scoring(choices: list[int]) -> None:
    from tests.server_harness import base_url, model_engine, running_server

    engine = model_engine(DEMO_MODEL, max_model_len=2048)
    scored: list[int] = []
    execute = engine.executor.execute

    def counting(batch):
        scored.append(batch.num_prompt_logprobs)
        return execute(batch)

    engine.executor.execute = counting
    prompts = [[(7 * i + p) % 4000 + 10 for i in range(1000)] for p in range(2)]
    print("| n | status | response | prompt positions scored | CPU | RSS growth |")
    print("|---|---|---|---|---|---|")
    # A client made before the clock starts: making one builds an SSL context, CPU time the
    # measurement would otherwise count.
    with running_server(engine, model_name="demo") as state, httpx.Client(timeout=900) as client:
        for n in choices:
            body = {"prompt": prompts, "echo": True, "logprobs": 20, "n": n, "max_tokens": 1}
            scored.clear()
            process = psutil.Process()
            rss, start = process.memory_info().rss, time.process_time()
            url = f"{base_url(state)}/v1/completions"
            response = client.post(url, json={"model": "demo", **body})
            seconds = time.process_time() - start
            growth = (process.memory_info().rss - rss) / 1e6
            print(
                f"| {n} | {response.status_code} | {len(response.content) / 1e6:.1f} MB | "
                f"{sum(scored):,} | {seconds:.1f} s | {growth:+.0f} MB |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("grammars", "scoring"))
    parser.add_argument("--all", action="store_true", help="compile the refused ones too")
    parser.add_argument("--n", type=int, nargs="+", default=[4, 16], help="choices per prompt")
    args = parser.parse_args()
    if args.part == "grammars":
        grammars(args.all)
    else:
        scoring(args.n)


if __name__ == "__main__":
    main()
