"""`baton bench`: an asyncio benchmark client for any OpenAI-compatible server (Baton,
`transformers serve`, vLLM, ...), after the shape of vLLM's benchmark_serving.

It streams completions or chat completions over SSE at a Poisson (or gamma-bursty) request
rate or at a recorded trace's own arrival times, optionally capped in concurrency, and reports
TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), request and token throughput and
goodput, as a table, a JSON file and a PNG of latency CDFs (and goodput against rate when
several rates run).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys

import uvloop

from baton.app.commands.bench_client import BenchRequest, RequestResult, benchmark
from baton.app.commands.bench_settings import DEFAULT_NUM_PROMPTS, BenchSettings
from baton.app.commands.load_settings import LoadSettings
from baton.app.commands.progress import progress_bar
from baton.app.flags import FlagGroup
from baton.core.metrics.latency import SLOOutcome, percentile
from baton.core.sampling_params import SamplingParams
from baton.core.simulation.trace import load_trace
from baton.core.simulation.workloads import WORKLOADS, arrival_rng, arrival_times, sample_requests

BENCH = FlagGroup(BenchSettings, "benchmark")
# Prompts are random words, so the simulator's shared-prefix workloads would share nothing here.
LOAD = FlagGroup(LoadSettings, "load", choices={"workload": tuple(WORKLOADS)})
SAMPLING = FlagGroup(SamplingParams, "sampling", only=("ignore_eos",))
# Ids every byte-level vocabulary has (its 256 bytes), clear of special tokens put first.
TOKEN_ID_LOW, TOKEN_ID_HIGH = 16, 256

# Common English words, about one token each in most vocabularies: prompts of N words are
# prompts of about N tokens; the server's usage.prompt_tokens gives the exact count.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there one all we their can has more when will "
    "would who so if out no time about up them some could what into only other then its two"
)
WORDS = tuple(_WORD_TEXT.split(" "))


def add_bench_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible server (TTFT, TPOT, ITL, goodput)",
        description="Stream requests at a set rate and report latency, throughput and goodput.",
    )
    for group in (BENCH, LOAD, SAMPLING):
        group.add_to(parser)
    parser.set_defaults(handler=run)


def settings_from(args: argparse.Namespace) -> BenchSettings:
    """The benchmark the flags describe, with the load and request flags it shares."""
    return BENCH.build(args, load=LOAD.build(args), ignore_eos=SAMPLING.build(args).ignore_eos)


def run(args: argparse.Namespace) -> int:
    bench = settings_from(args)
    goodput = parse_goodput(bench.goodput)
    requests = make_requests(bench)
    runs = []
    for rate, offsets in schedules(bench, requests):
        label = "all at once" if rate == math.inf else f"rate {rate:g}/s"
        with progress_bar(len(requests), label, "req", quiet=bench.load.json) as bar:
            # On uvloop: the client shares the machine with the server it measures, and uvloop
            # spends less CPU per streamed token than asyncio's loop. (The server is on asyncio's
            # by default, where a socket write lets its step thread run; the client has none.)
            results, duration = uvloop.run(benchmark(bench, requests, offsets, bar.update))
        summary = summarize(results, duration, goodput)
        summary = {"label": bench.label, "request_rate": rate, **summary}
        if bench.dataset == "trace":
            summary["arrivals"] = "request-rate" if bench.request_rate else "trace"
        if not bench.load.json:
            print_summary(summary)
        runs.append((summary, results))
    report = runs[0][0] if len(runs) == 1 else {"runs": [summary for summary, _ in runs]}
    if bench.load.json:
        print(json.dumps(report, indent=2))
    if bench.result_json:
        with open(bench.result_json, "w") as file:
            json.dump(report, file, indent=2)
    if bench.plot:
        plot(runs, bench.plot)
    return 0 if all(summary["completed"] for summary, _ in runs) else 1


def schedules(
    bench: BenchSettings, requests: list[BenchRequest]
) -> list[tuple[float, list[float]]]:
    """Each run's request rate and send times (seconds from its start): a trace's own, or
    gamma-distributed at each --request-rate."""
    if bench.dataset == "trace" and bench.request_rate is None:
        offsets = [request.arrival_s or 0.0 for request in requests]
        span = offsets[-1] - offsets[0]
        return [((len(offsets) - 1) / span if span > 0 else math.inf, offsets)]
    load = bench.load
    return [
        (rate, arrival_times(len(requests), rate, arrival_rng(load.seed), load.burstiness))
        for rate in parse_rates(bench.request_rate or "inf")
    ]


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--request-rate takes numbers or inf, got {text!r}") from None
    if not rates or any(rate <= 0 or math.isnan(rate) for rate in rates):
        raise ValueError("--request-rate must be > 0 (inf sends everything at once)")
    return rates


def parse_goodput(items: list[str]) -> dict[str, float]:
    targets = {}
    for item in items:
        metric, _, value = item.partition(":")
        try:
            target_ms = float(value)
        except ValueError:
            target_ms = math.nan
        if metric not in ("ttft", "tpot", "e2el") or not target_ms > 0:
            raise ValueError(
                f"--goodput takes ttft:MS, tpot:MS or e2el:MS with MS a number > 0, got {item!r}"
            )
        targets[metric] = target_ms
    return targets


def make_requests(bench: BenchSettings) -> list[BenchRequest]:
    rng = random.Random(bench.load.seed)
    if bench.dataset == "random":
        low = max(1, round(bench.input_len * (1 - bench.range_ratio)))
        high = max(low, round(bench.input_len * (1 + bench.range_ratio)))
        out_low = max(1, round(bench.output_len * (1 - bench.range_ratio)))
        out_high = max(out_low, round(bench.output_len * (1 + bench.range_ratio)))
        return [
            BenchRequest(prompt(bench, rng, rng.randint(low, high)), rng.randint(out_low, out_high))
            for _ in range(bench.num_prompts or DEFAULT_NUM_PROMPTS)
        ]
    if bench.dataset == "trace":
        specs = load_trace(
            bench.trace_file,
            time_scale=bench.load.time_scale,
            length_scale=bench.load.length_scale,
            limit=bench.num_prompts,
        )
    else:
        specs = sample_requests(
            bench.load.workload,
            bench.num_prompts or DEFAULT_NUM_PROMPTS,
            math.inf,
            bench.load.seed,
            length_scale=bench.load.length_scale,
        )
    scale = bench.load.slo_scale if bench.slo_classes else None
    return [
        BenchRequest(
            prompt(bench, rng, spec.prompt_len),
            spec.output_len,
            _target(spec.request_class.ttft_ms, scale),
            _target(spec.request_class.tpot_ms, scale),
            spec.request_class.priority if scale is not None else 0,
            spec.arrival_s,
        )
        for spec in specs
    ]


def _target(target_ms: float | None, scale: float | None) -> float | None:
    return None if target_ms is None or scale is None else target_ms * scale


def prompt(bench: BenchSettings, rng: random.Random, length: int) -> str | list[int]:
    if bench.token_prompts:
        return [rng.randrange(TOKEN_ID_LOW, TOKEN_ID_HIGH) for _ in range(length)]
    return words(rng, length)


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def summarize(
    results: list[RequestResult], duration_s: float, goodput: dict[str, float]
) -> dict[str, float | int | str | None]:
    done = [r for r in results if r.ok]
    summary: dict = {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration_s,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": sum(r.output_tokens for r in done),
        "request_throughput": len(done) / duration_s,
        "output_throughput": sum(r.output_tokens for r in done) / duration_s,
        "total_token_throughput": sum(r.prompt_tokens + r.output_tokens for r in done) / duration_s,
        "goodput_rps": sum(meets(r, goodput) for r in done) / duration_s,
        "slo_attainment": sum(meets(r, goodput) for r in done) / len(results),
        "goodput_targets_ms": goodput or None,
    }
    series_ms = {
        "ttft": [r.ttft_s * 1000 for r in done],
        "tpot": [r.tpot_ms for r in done if r.output_tokens > 1],
        "itl": [gap * 1000 for r in done for gap in r.itl_s],
        "e2el": [r.e2el_s * 1000 for r in done],
    }
    for name, values in series_ms.items():
        ordered = sorted(values)
        summary[f"mean_{name}_ms"] = statistics.fmean(ordered) if ordered else None
        for label, q in (("median", 50), ("p90", 90), ("p99", 99)):
            summary[f"{label}_{name}_ms"] = percentile(ordered, q)
    errors = sorted({r.error for r in results if r.error})
    summary["errors"] = errors[:5]
    return summary


def meets(result: RequestResult, goodput: dict[str, float]) -> bool:
    """Within every --goodput target, the request's own class targets (--slo-classes) taking
    the place of --goodput's TTFT and TPOT."""
    ttft_target = result.ttft_target_ms
    tpot_target = result.tpot_target_ms
    outcome = SLOOutcome.judge(
        result.ttft_s * 1000,
        result.tpot_ms,
        result.output_tokens,
        ttft_target_ms=goodput.get("ttft") if ttft_target is None else ttft_target,
        tpot_target_ms=goodput.get("tpot") if tpot_target is None else tpot_target,
    )
    e2el_target = goodput.get("e2el")
    e2el_met = e2el_target is None or result.e2el_s * 1000 <= e2el_target
    return outcome.met is not False and e2el_met


def print_summary(summary: dict) -> None:
    rate = summary["request_rate"]
    print(f"==== rate {rate:g}/s: {summary['completed']} completed, {summary['failed']} failed")
    # Every line fits an 80-column terminal.
    print(
        f"duration {summary['duration_s']:.1f} s: {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.1f} output tok/s, "
        f"{summary['total_token_throughput']:.1f} total tok/s"
    )
    print(
        f"goodput {summary['goodput_rps']:.2f} req/s "
        f"({summary['slo_attainment']:.1%} of requests met their targets)"
    )
    print(f"{'ms':<6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name in ("ttft", "tpot", "itl", "e2el"):
        cells = [summary[f"{k}_{name}_ms"] for k in ("mean", "median", "p90", "p99")]
        print(
            f"{name:<6}" + "".join(f"{v:>10.1f}" if v is not None else f"{'-':>10}" for v in cells)
        )
    for error in summary["errors"]:
        print(f"error: {error}", file=sys.stderr)


def plot(runs: list[tuple[dict, list[RequestResult]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = len(runs) > 1
    # Two panels a row, about 1000 pixels wide: legible on a page or a laptop screen without
    # zooming, where one long row of four or five shrank every label.
    rows = 3 if sweep else 2
    fig, grid = plt.subplots(rows, 2, figsize=(10, 3.6 * rows), squeeze=False)
    axes = list(grid.flat)
    if sweep:
        axes[-1].remove()
    metrics_ms = (
        ("TTFT", "requests", lambda r: [r.ttft_s * 1000]),
        ("TPOT", "requests", lambda r: [r.tpot_ms] if r.output_tokens > 1 else []),
        ("ITL", "token gaps", lambda r: [gap * 1000 for gap in r.itl_s]),
        ("E2E latency", "requests", lambda r: [r.e2el_s * 1000]),
    )
    for axis, (title, counted, values_of) in zip(axes, metrics_ms, strict=False):
        for summary, results in runs:
            values = sorted(v for r in results if r.ok for v in values_of(r))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                axis.step(values, fractions, where="post", label=f"{summary['request_rate']:g}/s")
        axis.set_title(f"{title} CDF")
        axis.set_xlabel("ms")
        axis.set_ylabel(f"fraction of {counted}")
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend()
    if sweep:
        axis = axes[4]
        rates = [summary["request_rate"] for summary, _ in runs]
        axis.plot(rates, [s["goodput_rps"] for s, _ in runs], marker="o", label="goodput")
        axis.plot(rates, [s["request_throughput"] for s, _ in runs], marker="s", label="throughput")
        axis.set_title("goodput vs request rate")
        axis.set_xlabel("request rate (req/s)")
        axis.set_ylabel("req/s")
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
