"""`baton simulate`'s report for a terminal: what was simulated, then two tables (throughput and
SLOs, latency), each with one row per policy (or policy and router) and one per request class
beneath it, every line within 80 columns."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

from baton.core.simulation.workloads import LengthStats

WIDTH = 80
# The name column grows with the longest run or class name; each number column is its heading
# and a gap of two spaces, one where the names leave no room for two.
MIN_NAME_WIDTH = 18
# (heading, cell): `cell` formats a row's value, or gives "" where a column does not apply to a
# class row.
Column = tuple[str, Callable[[dict, bool], str]]

THROUGHPUT: list[Column] = [
    ("served/s", lambda row, _: f"{row['throughput_rps']:.2f}"),
    ("goodput/s", lambda row, _: f"{row['goodput_rps']:.2f}"),
    ("SLO met", lambda row, _: f"{row['slo_attainment']:.1%}"),
    # Preemptions are counted per run; a class row has only its per-request maximum.
    ("preempted", lambda row, is_class: "" if is_class else str(row["num_preemptions"])),
    ("max/req", lambda row, _: str(row["max_preemptions_per_request"])),
    ("rejected", lambda row, _: str(row["rejected"])),
]
LATENCY_MS: list[Column] = [
    ("TTFT p50", lambda row, _: _ms(row["ttft_p50_ms"])),
    ("TTFT p99", lambda row, _: _ms(row["ttft_p99_ms"])),
    ("TTFT max", lambda row, _: _ms(row["ttft_max_ms"])),
    ("TPOT p99", lambda row, _: _ms(row["tpot_p99_ms"])),
    ("max wait", lambda row, _: _ms(row["max_wait_ms"])),
]


def print_table(report: dict, headline: str, lengths: LengthStats, max_tokens: str) -> None:
    """`headline` says what was simulated: the arrivals, their rate, the machine."""
    print(textwrap.fill(headline, WIDTH))
    print(
        textwrap.fill(
            f"prompt length mean {lengths.prompt_mean:.0f} (CV {lengths.prompt_cv:.2f}), "
            f"output {lengths.output_mean:.0f} (CV {lengths.output_cv:.2f}), max_tokens "
            f"{max_tokens}",
            WIDTH,
        )
    )
    names = [*report, *(f"  {name}" for row in report.values() for name in row["classes"])]
    name_width = max(MIN_NAME_WIDTH, *(len(name) + 2 for name in names))
    print()
    print("throughput and SLOs")
    _print_rows(report, THROUGHPUT, name_width, with_replicas=True)
    print()
    print("latency (ms)")
    _print_rows(report, LATENCY_MS, name_width, with_replicas=False)


def _print_rows(report: dict, columns: list[Column], name_width: int, with_replicas: bool) -> None:
    headings = [heading for heading, _ in columns]
    gap = 2 if name_width + sum(len(h) + 2 for h in headings) <= WIDTH else 1
    widths = [len(heading) + gap for heading in headings]
    header = f"{'policy':<{name_width}}" + "".join(
        f"{h:>{w}}" for h, w in zip(headings, widths, strict=True)
    )
    print(header)
    print("-" * len(header))

    def line(name: str, row: dict, is_class: bool) -> str:
        cells = [cell(row, is_class) for _, cell in columns]
        return f"{name:<{name_width}}" + "".join(
            f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)
        )

    for name, row in report.items():
        print(line(name, row, is_class=False))
        if with_replicas and "requests_per_replica" in row:
            print(_replica_note(row))
        for class_name, cls in row["classes"].items():
            print(line(f"  {class_name}", cls, is_class=True))


def _replica_note(row: dict) -> str:
    return textwrap.fill(
        f"requests per replica {row['requests_per_replica']}, prefix cache hits "
        f"{row['prefix_cache_hit_rate']:.1%}, routing p50 {row['route_us_p50']:.0f} us "
        f"p99 {row['route_us_p99']:.0f} us (wall)" + _roles_note(row),
        WIDTH,
        initial_indent="  ",
        subsequent_indent="    ",
    )


def _roles_note(row: dict) -> str:
    """The replicas' roles and the KV moved between them, where some replicas prefill only or
    running decodes migrated."""
    roles = row.get("roles") or []
    transfers = row.get("transfers") or {}
    if "prefill" not in roles and not transfers.get("migrations"):
        return ""
    note = f"; roles {'/'.join(role[0].upper() for role in roles)}, {transfers['count']} KV "
    note += f"transfers ({transfers['migrations']} migrations), {transfers['bytes'] / 1e9:.2f} GB"
    if transfers["count"]:
        note += (
            f", latency p50 {transfers['latency_ms_p50']:.1f} ms "
            f"p99 {transfers['latency_ms_p99']:.1f} ms"
        )
    return note


def _ms(value: float | None) -> str:
    """A latency cell; a dash where no request was served to measure it."""
    return "-" if value is None else f"{value:.0f}"
