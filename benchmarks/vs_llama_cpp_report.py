"""The figures of `benchmarks/vs_llama_cpp.py`: one measurement per server, shape and round,
their medians over rounds, the ratios of two sides, and the markdown table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

# What is compared, and which way is better: throughput higher, latencies lower.
METRICS = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One `baton bench` run against one freshly started server."""

    side: str
    prompt_len: int
    streams: int
    round: int
    output_tok_s: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    completed: int
    failed: int
    prompt_tokens_per_request: float
    output_tokens_per_request: float
    cold_start_s: float
    peak_rss_mib: float
    load_1min: float
    # The server's CPU time (all its threads) over the client's run, per output token: what the
    # work cost, whatever share of the cores the machine's other processes left it.
    cpu_ms_per_token: float = float("nan")
    # The server's memory on transparent huge pages at the end of the run: weights left on
    # 4 KiB pages stream slower, so a round that got fewer would be slower for that.
    anon_huge_mib: float = float("nan")


@dataclass(frozen=True, slots=True)
class Summary:
    """A side's medians over the rounds of one shape (prompt length, streams)."""

    side: str
    prompt_len: int
    streams: int
    rounds: int
    output_tok_s: float
    ttft_p50_ms: float
    tpot_p50_ms: float
    output_tok_s_each: tuple[float, ...]
    cpu_ms_per_token_each: tuple[float, ...]
    prompt_tokens_per_request: float
    output_tokens_per_request: float
    failed: int
    cold_start_s: float
    peak_rss_mib: float


def summarize(measurements: list[Measurement]) -> list[Summary]:
    """Medians over rounds, one per side and shape, in the order the shapes were first run."""
    groups: dict[tuple[str, int, int], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.side, m.prompt_len, m.streams), []).append(m)
    return [
        Summary(
            side=side,
            prompt_len=prompt_len,
            streams=streams,
            rounds=len(runs),
            output_tok_s=statistics.median(m.output_tok_s for m in runs),
            ttft_p50_ms=statistics.median(m.ttft_p50_ms for m in runs),
            tpot_p50_ms=statistics.median(m.tpot_p50_ms for m in runs),
            output_tok_s_each=tuple(m.output_tok_s for m in runs),
            cpu_ms_per_token_each=tuple(m.cpu_ms_per_token for m in runs),
            prompt_tokens_per_request=statistics.median(m.prompt_tokens_per_request for m in runs),
            output_tokens_per_request=statistics.median(m.output_tokens_per_request for m in runs),
            failed=sum(m.failed for m in runs),
            cold_start_s=statistics.median(m.cold_start_s for m in runs),
            peak_rss_mib=max(m.peak_rss_mib for m in runs),
        )
        for (side, prompt_len, streams), runs in groups.items()
    ]


def ratios(
    summaries: list[Summary],
    numerator: str,
    denominator: str,
    measurements: Sequence[Measurement],
) -> list[dict]:
    """`numerator` over `denominator` for every shape both ran: above 1 is better for the
    numerator in throughput, worse in TTFT and TPOT. The ratios are of the rounds' medians;
    `output_tok_s_by_round` also divides each round's two throughputs, measured minutes apart
    (from `measurements`), so a drift of the machine's speed over the run moves both sides of
    each of them alike."""
    by_shape = {(s.side, s.prompt_len, s.streams): s for s in summaries}
    rows = []
    for s in summaries:
        if s.side != numerator or (denominator, s.prompt_len, s.streams) not in by_shape:
            continue
        other = by_shape[(denominator, s.prompt_len, s.streams)]
        row: dict = {"of": numerator, "to": denominator}
        row |= {"prompt_len": s.prompt_len, "streams": s.streams}
        for metric in METRICS:
            mine, theirs = getattr(s, metric), getattr(other, metric)
            row[metric] = mine / theirs if theirs else None
        row["output_tok_s_by_round"] = _by_round(measurements, numerator, denominator, s)
        rows.append(row)
    return rows


def _by_round(
    measurements: Sequence[Measurement], numerator: str, denominator: str, shape: Summary
) -> list[float]:
    """Each round's throughput of `numerator` over `denominator` at `shape`'s prompt length
    and streams, in round order, for the rounds both ran."""
    rounds: dict[int, dict[str, float]] = {}
    for m in measurements:
        if (m.prompt_len, m.streams) == (shape.prompt_len, shape.streams):
            rounds.setdefault(m.round, {})[m.side] = m.output_tok_s
    return [
        sides[numerator] / sides[denominator]
        for _, sides in sorted(rounds.items())
        if sides.get(numerator) is not None and sides.get(denominator)
    ]


def renumbered(runs: list[list[Measurement]]) -> list[Measurement]:
    """Several runs' measurements as one run's: each run's rounds follow the last run's, so a
    round still pairs only measurements taken minutes apart."""
    pooled: list[Measurement] = []
    offset = 0
    for run in runs:
        pooled += [replace(m, round=m.round + offset) for m in run]
        offset += max((m.round for m in run), default=-1) + 1
    return pooled


def token_notes(summaries: list[Summary], output_len: int) -> list[str]:
    """Where the sides did not see the same work: failed requests, answers shorter than
    `output_len`, or prompts that tokenized to different lengths on different sides."""
    notes = []
    prompts: dict[tuple[int, int], dict[str, float]] = {}
    for s in summaries:
        shape = f"prompt {s.prompt_len}, {s.streams} streams"
        if s.failed:
            notes.append(f"{s.side}, {shape}: {s.failed} requests failed")
        if s.output_tokens_per_request != output_len:
            notes.append(
                f"{s.side}, {shape}: {s.output_tokens_per_request:g} output tokens a request, "
                f"not {output_len}"
            )
        prompts.setdefault((s.prompt_len, s.streams), {})[s.side] = s.prompt_tokens_per_request
    for (prompt_len, streams), by_side in prompts.items():
        if len(set(by_side.values())) > 1:
            seen = ", ".join(f"{side} {tokens:g}" for side, tokens in by_side.items())
            notes.append(f"prompt {prompt_len}, {streams} streams: prompt tokens differ ({seen})")
    return notes


def markdown(summaries: list[Summary], ratio_rows: list[dict]) -> str:
    """One row per shape: each side's tok/s (TTFT p50 / TPOT p50 in ms), then the ratios."""
    sides = list(dict.fromkeys(s.side for s in summaries))
    shapes = list(dict.fromkeys((s.prompt_len, s.streams) for s in summaries))
    pairs = list(dict.fromkeys((r["of"], r["to"]) for r in ratio_rows))
    cells = {(s.side, s.prompt_len, s.streams): s for s in summaries}
    header = ["prompt", "streams", *sides, *(f"{a} / {b}" for a, b in pairs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for prompt_len, streams in shapes:
        row = [str(prompt_len), str(streams)]
        for side in sides:
            s = cells.get((side, prompt_len, streams))
            row.append(
                "–"
                if s is None
                else f"{s.output_tok_s:.1f} ({s.ttft_p50_ms:.0f} / {s.tpot_p50_ms:.1f})"
            )
        for a, b in pairs:
            match = [
                r
                for r in ratio_rows
                if (r["of"], r["to"], r["prompt_len"], r["streams"]) == (a, b, prompt_len, streams)
            ]
            row.append(_ratio_cell(match[0]) if match else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def spread(values: Sequence[float]) -> float:
    """How far apart rounds are: the largest over the smallest, less one (0.5 is 50%)."""
    return max(values) / min(values) - 1


def spreads(summaries: list[Summary]) -> str:
    """Each side's rounds by shape: output tok/s and the server's CPU ms per token, each with
    its spread, and the cores the server kept busy (their product), so a slow round shows
    whether the work grew or the cores went elsewhere."""
    lines = [
        "| side | prompt | streams | tok/s by round | spread | CPU ms/token by round | spread "
        "| cores busy by round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        tok_s = ", ".join(f"{v:.1f}" for v in s.output_tok_s_each)
        cpu = ", ".join(f"{v:.2f}" for v in s.cpu_ms_per_token_each)
        cores = ", ".join(
            f"{t * c / 1e3:.2f}"
            for t, c in zip(s.output_tok_s_each, s.cpu_ms_per_token_each, strict=True)
        )
        lines.append(
            f"| {s.side} | {s.prompt_len} | {s.streams} | {tok_s} | "
            f"{spread(s.output_tok_s_each):.0%} | {cpu} | {spread(s.cpu_ms_per_token_each):.0%} "
            f"| {cores} |"
        )
    return "\n".join(lines)


def _ratio_cell(row: dict) -> str:
    """Throughput ratio in bold, the rounds' own ratios where there are several, then the
    TTFT and TPOT ratios."""
    parts = [f"{row[m]:.2f}×" if row[m] is not None else "–" for m in METRICS]
    each = row.get("output_tok_s_by_round") or []
    spread = f"rounds {min(each):.2f}–{max(each):.2f}, " if len(each) > 1 else ""
    return f"**{parts[0]}** ({spread}TTFT {parts[1]}, TPOT {parts[2]})"


def as_json(measurements: list[Measurement], summaries: list[Summary]) -> dict:
    return {
        "measurements": [asdict(m) for m in measurements],
        "summaries": [asdict(s) for s in summaries],
    }
