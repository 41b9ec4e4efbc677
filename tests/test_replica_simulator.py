"""`baton simulate --replicas N`: N real engines behind the router on one stream of arrivals.
One replica is the single-engine simulation; every arrival is served or refused once; the
routers spread load as documented; shared prefixes hit the cache where `prefix` sends them; and
the CLI's report per router."""

from __future__ import annotations

import json

import pytest

from baton.app.cli import main
from baton.core.config import EngineConfig
from baton.core.simulation.records import summarize
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import SimulationConfig, simulate
from baton.core.simulation.workloads import (
    PREFIX_WORKLOADS,
    LengthDistribution,
    RequestClass,
    WorkloadRequest,
    sample_requests,
)

SHORT = RequestClass(
    "short",
    LengthDistribution(100, 0.0, 100),
    LengthDistribution(8, 0.0, 8),
    8,
    ttft_ms=None,
    tpot_ms=None,
    priority=0,
)


def _key(record):
    return (
        record.request_id,
        record.rejected,
        round(record.first_token_s, 9),
        round(record.finish_s, 9),
        record.num_output_tokens,
    )


def test_one_replica_is_the_single_engine_simulation():
    workload = sample_requests("mixed", 150, 6.0, seed=2)
    config = SimulationConfig()
    single = simulate("slo", workload, config)
    replicas = simulate_replicas("round-robin", "slo", workload, config, 1)
    assert sorted(map(_key, replicas.records)) == sorted(map(_key, single.records))
    assert replicas.num_steps == single.num_steps
    assert replicas.requests_per_replica == [150 - summarize(single.records)["rejected"]]


def test_round_robin_spreads_evenly_and_every_arrival_is_accounted_for():
    workload = [WorkloadRequest(i * 0.01, 64, 8, 8, SHORT) for i in range(40)]
    result = simulate_replicas("round-robin", "fcfs", workload, SimulationConfig(), 4)
    assert result.requests_per_replica == [10, 10, 10, 10]
    assert sorted(r.request_id for r in result.records) == sorted(f"sim-{i}" for i in range(40))
    assert all(r.num_output_tokens == 8 and not r.rejected for r in result.records)


def test_slo_router_sends_an_arrival_to_the_idle_replica():
    # A long prompt occupies replica 0; a short one right after goes to replica 1 and gets
    # its first token in one step, where round-robin's order happens to agree and
    # least-loaded's too: all three beat a single engine, where it waits behind.
    long_then_short = [
        WorkloadRequest(0.0, 4000, 4, 4, SHORT),
        WorkloadRequest(0.001, 64, 4, 4, SHORT),
    ]
    config = SimulationConfig()
    single = {r.request_id: r for r in simulate("fcfs", long_then_short, config).records}
    routed = simulate_replicas("slo", "fcfs", long_then_short, config, 2)
    short = {r.request_id: r for r in routed.records}["sim-1"]
    assert routed.requests_per_replica == [1, 1]
    assert short.ttft_ms < 30 < single["sim-1"].ttft_ms


def test_prefix_router_hits_the_cache_more_than_round_robin():
    workload = sample_requests("mixed-prefix", 160, 8.0, seed=1)
    shared = [r for r in workload if r.prefix_group is not None]
    base, prefixes = PREFIX_WORKLOADS["mixed-prefix"]
    assert 0.2 < len(shared) / len(workload) < 0.4
    assert all(r.prefix_len == prefixes.length for r in shared)
    # The variant is its base workload with prefixes in front: same arrivals, same outputs.
    plain = sample_requests(base, 160, 8.0, seed=1)
    assert [(r.arrival_s, r.output_len) for r in workload] == [
        (r.arrival_s, r.output_len) for r in plain
    ]
    config = SimulationConfig(engine=EngineConfig(enable_prefix_caching=True))
    rates = {
        router: (result.prefix_cache_hits / result.prefix_cache_queries)
        for router in ("prefix", "round-robin")
        for result in [simulate_replicas(router, "slo", workload, config, 4)]
    }
    assert rates["prefix"] > rates["round-robin"] > 0


def test_simulate_cli_reports_one_row_per_router(capsys):
    code = main(
        [
            "simulate",
            "--json",
            "--replicas",
            "2",
            "--router",
            "slo,round-robin",
            "--workload",
            "mixed-prefix",
            "--rate",
            "8",
            "--num-requests",
            "80",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["slo", "round-robin"]
    for router, row in report.items():
        assert row["router"] == router and row["policy"] == "slo" and row["replicas"] == 2
        assert sum(row["requests_per_replica"]) == 80 - row["rejected"]
        assert 0 < row["prefix_cache_hit_rate"] < 1
    assert main(["simulate", "--router", "slo", "--num-requests", "5"]) == 2
    assert "--replicas > 1" in capsys.readouterr().err
    assert main(["simulate", "--replicas", "2", "--router", "random", "--num-requests", "5"]) == 2


def test_replicas_must_be_positive():
    with pytest.raises(ValueError, match="--replicas must be >= 1"):
        simulate_replicas("slo", "slo", [], SimulationConfig(), 0)
