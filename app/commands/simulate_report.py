"""`baton simulate`'s table: what was simulated, then one row per policy (or policy and router)
and one per request class beneath it."""

from __future__ import annotations

from baton.core.simulation.workloads import LengthStats


def print_table(report: dict, headline: str, lengths: LengthStats, max_tokens: str) -> None:
    """`headline` says what was simulated: the arrivals, their rate, the machine."""
    print(headline)
    print(
        f"prompt length mean {lengths.prompt_mean:.0f} (CV {lengths.prompt_cv:.2f}), output "
        f"length mean {lengths.output_mean:.0f} (CV {lengths.output_cv:.2f}), max_tokens "
        f"{max_tokens}"
    )
    header = (
        f"{'policy':<18}{'served/s':>9}{'goodput/s':>10}{'SLO met':>9}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'TTFT max':>10}{'TPOT p99':>10}{'max wait':>10}{'preempt':>9}"
        f"{'max/req':>8}{'rejected':>10}"
    )
    print(header)
    print("-" * len(header))
    for policy, row in report.items():
        print(
            f"{policy:<18}{row['throughput_rps']:>9.2f}{row['goodput_rps']:>10.2f}"
            f"{row['slo_attainment']:>9.1%}{_ms(row['ttft_p50_ms'])}{_ms(row['ttft_p99_ms'])}"
            f"{_ms(row['ttft_max_ms'])}{_ms(row['tpot_p99_ms'])}{_ms(row['max_wait_ms'])}"
            f"{row['num_preemptions']:>9}{row['max_preemptions_per_request']:>8}"
            f"{row['rejected']:>10}"
        )
        if "requests_per_replica" in row:
            print(
                f"  requests per replica {row['requests_per_replica']}, prefix cache hits "
                f"{row['prefix_cache_hit_rate']:.1%}, routing p50 {row['route_us_p50']:.0f} us "
                f"p99 {row['route_us_p99']:.0f} us (wall)"
            )
        for name, cls in row["classes"].items():
            print(
                f"  {name:<16}{cls['throughput_rps']:>9.2f}{cls['goodput_rps']:>10.2f}"
                f"{cls['slo_attainment']:>9.1%}{_ms(cls['ttft_p50_ms'])}{_ms(cls['ttft_p99_ms'])}"
                f"{_ms(cls['ttft_max_ms'])}{_ms(cls['tpot_p99_ms'])}{_ms(cls['max_wait_ms'])}"
                f"{'':>9}{cls['max_preemptions_per_request']:>8}{cls['rejected']:>10}"
            )


def _ms(value: float | None) -> str:
    """A latency cell; a dash where no request was served to measure it."""
    return f"{'-':>10}" if value is None else f"{value:>8.0f}ms"
