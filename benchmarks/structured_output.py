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

from app.guided import Tool, required_calls_schema
from app.llm import LLM
from core.request import EngineRequest
from core.sampling_params import SamplingParams
from core.step_stats import StepStats
from core.structured_output import GuideKind, StructuredOutput
from gpu.structured_output import XGrammarCompiler

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


def decode_step_ms(llm: LLM, num_constrained: int, args: argparse.Namespace) -> float:
    """Median decode-only step time of one batch with `num_constrained` constrained rows."""
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
    steps: list[StepStats] = []
    engine.step_listeners.append(steps.append)
    for i in range(args.batch):
        params = constrained if i < num_constrained else free
        prompt = llm.tokenizer.encode(f"Record {i}: the with statement")
        engine.add_request(EngineRequest(f"bench-{time.monotonic_ns()}-{i}", prompt, params))
    while engine.has_unfinished_requests:
        engine.step()
    engine.step_listeners.remove(steps.append)
    decode = [
        s.finished - s.started
        for s in steps
        if s.num_prefill_tokens == 0 and s.num_seqs == args.batch
    ]
    return statistics.median(decode) * 1e3


def compile_times(model: Path) -> dict[str, float]:
    config = json.loads((model / "config.json").read_text())
    times = {}
    for name, (kind, spec) in COMPILE_CASES.items():
        compiler = XGrammarCompiler(model, config["vocab_size"], [config["eos_token_id"]])
        start = time.perf_counter()
        compiler.compile(StructuredOutput(kind, spec))
        times[name] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    compiler.compile(StructuredOutput(kind, spec))
    times["cache hit (same grammar again)"] = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    XGrammarCompiler(model, config["vocab_size"], [config["eos_token_id"]])
    times["vocabulary read (once per server, at first use)"] = (time.perf_counter() - start) * 1e3
    return times


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(args.model, device="cpu", max_num_seqs=args.batch, num_kv_blocks=1024)
    decode_step_ms(llm, args.constrained, args)  # warm-up: compile, caches, allocator
    free_ms, mixed_ms = [], []
    for _ in range(args.rounds):
        free_ms.append(decode_step_ms(llm, 0, args))
        mixed_ms.append(decode_step_ms(llm, args.constrained, args))
    ratios = [m / f for m, f in zip(mixed_ms, free_ms, strict=True)]
    report = {
        "free_step_ms": free_ms,
        "mixed_step_ms": mixed_ms,
        "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios),
        "compile_ms": compile_times(Path(args.model)),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"decode step, {args.batch} free:      " + " ".join(f"{t:6.1f}" for t in free_ms) + " ms")
    print(
        f"decode step, {args.constrained} constrained: "
        + " ".join(f"{t:6.1f}" for t in mixed_ms)
        + " ms"
    )
    per_round = " ".join(f"{r:.3f}" for r in ratios)
    print(f"ratio per round: {per_round}; median {report['ratio_median']:.3f}")
    for name, ms in report["compile_ms"].items():
        print(f"compile {name}: {ms:.2f} ms")


if __name__ == "__main__":
    main()
