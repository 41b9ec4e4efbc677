"""What structured output costs a step, and what compiling a grammar costs.

    python benchmarks/structured_output.py                 # the demo model, 64 sequences
    python benchmarks/structured_output.py --rounds 5 --json

Decode step time of a batch of 64 free requests against 32 constrained (a JSON schema whose
array keeps them inside the grammar for the whole run) + 32 free, on the same engine, the two
runs interleaved round by round so machine noise falls on both; only decode-only steps count.
Then compile time per schema with a cold cache (a fresh compiler per schema), and a cache hit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from baton.app.api.guided import Tool, required_calls_schema
from baton.app.llm import LLM
from baton.core.request import EngineRequest
from baton.core.sampling_params import SamplingParams
from baton.core.step_stats import StepStats
from baton.core.structured_output import GuideKind, StructuredOutput
from baton.gpu.structured_output import XGrammarCompiler

DEMO_MODEL = Path(__file__).parent.parent / "app" / "demo_model"
# Long-running: at least 40 items, so no constrained request ends inside the measured steps.
RECORDS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
    },
    "minItems": 40,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city"],
        },
    },
}
COMPILE_CASES = {
    "json_schema: array of records (nested, enums, bounds)": (
        GuideKind.JSON_SCHEMA,
        json.dumps(RECORDS),
    ),
    "json_schema: tool_choice required, one tool": (
        GuideKind.JSON_SCHEMA,
        json.dumps(required_calls_schema([Tool.model_validate(WEATHER_TOOL)], True)),
    ),
    "json_object": (GuideKind.JSON_OBJECT, ""),
    "regex: [a-z]{3}-[0-9]{2,4}": (GuideKind.REGEX, "[a-z]{3}-[0-9]{2,4}"),
    "choice: 4 strings": (GuideKind.CHOICE, json.dumps(["yes", "no", "maybe", "ask again"])),
    "grammar: EBNF arithmetic": (
        GuideKind.GRAMMAR,
        'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
    ),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEMO_MODEL))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--constrained", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared 2-core machine, 2 threads spin against other jobs)",
    )
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def decode_step_ms(llm: LLM, num_constrained: int, args: argparse.Namespace) -> tuple[float, float]:
    """Median decode-only step time of one batch with `num_constrained` constrained rows, as
    wall time and as the process's CPU time (all its threads; what other jobs on a shared
    machine cannot inflate by taking the cores)."""
    engine = llm.engine
    constraint = engine.compile_structured_output(
        SamplingParams(
            structured_output=StructuredOutput(GuideKind.JSON_SCHEMA, json.dumps(RECORDS))
        )
    ).structured_output
    free = SamplingParams(temperature=1.0, max_tokens=args.steps, ignore_eos=True)
    constrained = SamplingParams(
        temperature=1.0, max_tokens=args.steps, structured_output=constraint
    )
    steps: list[tuple[StepStats, float]] = []
    stats: list[StepStats] = []
    engine.step_listeners.append(stats.append)
    for i in range(args.batch):
        params = constrained if i < num_constrained else free
        prompt = llm.tokenizer.encode(f"Record {i}: the with statement")
        engine.add_request(EngineRequest(f"bench-{time.monotonic_ns()}-{i}", prompt, params))
    while engine.has_unfinished_requests:
        cpu = time.process_time()
        engine.step()
        cpu = time.process_time() - cpu
        if stats:
            steps.append((stats.pop(), cpu))
    engine.step_listeners.remove(stats.append)
    decode = [
        (s.finished - s.started, cpu)
        for s, cpu in steps
        if s.num_prefill_tokens == 0 and s.num_seqs == args.batch
    ]
    return (
        statistics.median(wall for wall, _ in decode) * 1e3,
        statistics.median(cpu for _, cpu in decode) * 1e3,
    )


def median_ratio(
    mixed: list[tuple[float, float]], free: list[tuple[float, float]], i: int
) -> float:
    """The median over rounds of mixed / free, each round's pair measured back to back."""
    return statistics.median(m[i] / f[i] for m, f in zip(mixed, free, strict=True))


def compile_times(model: Path, repeats: int = 5) -> dict[str, float]:
    """Median compile time per case, each compile on a fresh compiler (a cold cache)."""
    config = json.loads((model / "config.json").read_text())

    def compiler() -> XGrammarCompiler:
        return XGrammarCompiler(model, config["vocab_size"], [config["eos_token_id"]])

    times = {}
    for name, (kind, spec) in COMPILE_CASES.items():
        runs = []
        for _ in range(repeats):
            fresh = compiler()
            start = time.perf_counter()
            fresh.compile(StructuredOutput(kind, spec))
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs) * 1e3
    start = time.perf_counter()
    fresh.compile(StructuredOutput(kind, spec))
    times["cache hit (same grammar again)"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    compiler()
    times["vocabulary read (once per server, at first use)"] = (time.perf_counter() - start) * 1e3
    return times


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(args.model, device="cpu", max_num_seqs=args.batch, num_kv_blocks=1024)
    decode_step_ms(llm, args.constrained, args)  # warm-up: compile, caches, allocator
    free, mixed = [], []
    for _ in range(args.rounds):
        free.append(decode_step_ms(llm, 0, args))
        mixed.append(decode_step_ms(llm, args.constrained, args))
    report = {
        "free_step_ms_wall_cpu": free,
        "mixed_step_ms_wall_cpu": mixed,
        "ratio_wall_median": median_ratio(mixed, free, 0),
        "ratio_cpu_median": median_ratio(mixed, free, 1),
        "compile_ms": compile_times(Path(args.model)),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name, runs in (("64 free", free), (f"{args.constrained} constrained", mixed)):
        walls = " ".join(f"{wall:6.1f}" for wall, _ in runs)
        cpus = " ".join(f"{cpu:6.1f}" for _, cpu in runs)
        print(f"decode step, {name}: wall {walls} ms; CPU {cpus} ms")
    print(
        f"mixed / free, median over rounds: wall {report['ratio_wall_median']:.3f}, "
        f"CPU {report['ratio_cpu_median']:.3f}"
    )
    for name, ms in report["compile_ms"].items():
        print(f"compile {name}: {ms:.2f} ms")


if __name__ == "__main__":
    main()
