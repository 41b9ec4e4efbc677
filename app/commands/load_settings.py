"""What `baton simulate` and `baton bench` share: the load they put on a server (drawn from a
workload or replayed from a trace), the key they show it, and how they report."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.setting import setting
from baton.core.simulation.workloads import PREFIX_WORKLOADS, WORKLOADS


@dataclass(frozen=True, slots=True)
class LoadSettings:
    workload: str = setting(
        "mixed",
        choices=(*WORKLOADS, *PREFIX_WORKLOADS),
        help="the synthetic workload: its request classes, their lengths, SLO targets and mix "
        "(core/simulation/workloads.py); bench draws it with --dataset synthetic-chat",
    )
    seed: int = setting(
        0,
        help="seed of every random draw: the requests' lengths and arrival times (simulate and "
        "bench draw the same ones), bench's prompt words, simulate's step-time noise",
    )
    burstiness: float = setting(
        1.0, help="gamma shape of the arrival gaps (1: Poisson; below 1 burstier)"
    )
    length_scale: float = setting(
        1.0,
        help="multiply every prompt and output length of a workload or trace (small models, CPUs)",
    )
    slo_scale: float = setting(
        1.0,
        help="multiply every class's SLO targets (a slow machine needs looser ones; bench: with "
        "--slo-classes)",
    )
    time_scale: float = setting(
        1.0,
        help="a replayed trace (simulate --workload-file, bench --trace-file): multiply every "
        "arrival time (0.5 replays at twice the rate)",
    )
    api_key: str | None = setting(
        None,
        help="the API key to send: to the benchmarked server, or to simulate --calibrate-from's",
        default_text="none",
    )
    json: bool = setting(False, help="print the results as one JSON object, no table")
