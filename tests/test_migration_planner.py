"""Choosing live migrations (core/replicas/migration.py) and running them in the replica
simulator: a replica predicted past its decodes' tightest TPOT target sends its tightest, least
KV decode to the replica with the most room where every target is kept; one about to run out of
KV blocks for its decodes sends the smallest decode that covers the shortfall to a replica with
the blocks for it; nothing moves twice, a replica takes part in one move at a time, a request
near its end stays, a prefill replica takes no decode; simulated, moves even out a lopsided
placement, each request moving once, mid-decode, with its answer kept, and spare a full
replica's preemptions."""

from __future__ import annotations

from baton.core.engine_stats import EngineStats
from baton.core.replicas.disaggregation import DisaggregatingRouter
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.kv_transfer import KVShape, TransferCost
from baton.core.replicas.migration import Migration, MigrationPlanner
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import Router
from baton.core.request import SLO
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import DEFAULT_COST, SimulationConfig
from baton.core.simulation.workloads import LengthDistribution, RequestClass, WorkloadRequest
from tests.factory import make_replica_ledger

BYTES_PER_TOKEN = KVShape(32, 8, 128, 2).bytes_per_token
TIGHT = SLO(ttft_ms=1000, tpot_ms=25)
LOOSE = SLO(ttft_ms=1000, tpot_ms=100)


def _planner(
    loads: list[int], num_prefill: int = 0, mode: str = "auto", num_tokens: int = 100
) -> MigrationPlanner:
    """Replicas with `loads[i]` decodes of `num_tokens` each at the TIGHT target, started at 0 s
    and expected to live 5 s; under the default cost a step of more than 70 misses it."""
    ledgers = [
        make_replica_ledger(i, cost=DEFAULT_COST, max_num_batched_tokens=2048, max_num_seqs=128)
        for i in range(len(loads))
    ]
    for ledger, count in zip(ledgers, loads, strict=True):
        ledger.forecast.lifetime_s = 5.0
        for index in range(count):
            _decode(ledger, f"decoding-{ledger.replica_id}-{index}", num_tokens, TIGHT)
    disaggregating = DisaggregatingRouter(
        Router("slo", ledgers, admission_factor=3.0),
        num_prefill,
        "auto",
        TransferCost(0.0005, 50e9),
        BYTES_PER_TOKEN,
    )
    return MigrationPlanner(disaggregating, mode)


def _decode(ledger: ReplicaLedger, request_id: str, num_tokens: int, slo: SLO) -> None:
    ledger.add(request_id, num_tokens, slo, (), 0.0)
    ledger.forecast.first_token(request_id, 0.0)


def test_a_replica_past_its_target_moves_its_tightest_smallest_decode_to_the_most_room():
    planner = _planner([80, 10, 40])
    source = planner.router.router.replicas[0]
    _decode(source, "small", 50, TIGHT)
    _decode(source, "loose-smaller", 10, LOOSE)
    assert planner.choose(1, 1.0) is None and planner.choose(2, 1.0) is None
    move = planner.choose(0, 1.0)
    assert move == Migration("small", 0, 1)
    assert planner.target_of("small") is None
    planner.asked(move)
    assert planner.target_of("small") == 1


def test_a_replica_within_its_target_or_a_planner_set_to_never_moves_nothing():
    assert _planner([60, 0]).choose(0, 1.0) is None
    assert _planner([80, 0], mode="never").choose(0, 1.0) is None


def test_one_move_at_a_time_per_replica_and_none_moves_twice():
    planner = _planner([80, 80, 0, 0])
    first = planner.choose(0, 1.0)
    assert first == Migration("decoding-0-0", 0, 2)
    planner.asked(first)
    # The source and the target are busy until the move ends; another pair may move.
    assert planner.choose(0, 1.0) is None
    second = planner.choose(1, 1.0)
    assert second == Migration("decoding-1-0", 1, 3)
    planner.asked(second)
    planner.ended(first.request_id)
    planner.ended(second.request_id)
    # The ledgers still show it on the source here: it is not chosen again.
    third = planner.choose(0, 1.0)
    assert third == Migration("decoding-0-1", 0, 2)
    planner.asked(third)
    planner.finished(third.request_id)
    assert planner.target_of(third.request_id) is None


def test_a_handed_off_move_lands_on_its_target_or_back_on_a_source_whose_target_died():
    planner = _planner([80, 0, 0])
    replicas = planner.router.router.replicas
    assert planner.hand_off("decoding-0-0", 101, TIGHT, 0, 2.0) is None
    planner.asked(Migration("decoding-0-0", 0, 1))
    planner.asked(Migration("decoding-0-1", 0, 2))
    replicas[0].remove("decoding-0-0")
    assert planner.hand_off("decoding-0-0", 101, TIGHT, 0, 2.0) == 1
    assert replicas[1].num_tokens_of("decoding-0-0") == 101
    assert replicas[1].forecast.decodes() == [("decoding-0-0", 2.0, 0.025)]
    replicas[2].healthy = False
    replicas[0].remove("decoding-0-1")
    assert planner.hand_off("decoding-0-1", 101, TIGHT, 0, 2.0) == 0
    assert replicas[0].num_tokens_of("decoding-0-1") == 101


def test_no_move_without_a_landing_that_keeps_every_target_or_near_the_end():
    # Every other replica would itself miss the target with one more decode.
    assert _planner([80, 72, 72]).choose(0, 1.0) is None
    # Past the expected lifetime, every decode is near its end.
    assert _planner([80, 0]).choose(0, 6.0) is None
    # A target with a tighter target in flight is judged by it.
    planner = _planner([80, 40])
    _decode(planner.router.router.replicas[1], "tighter", 10, SLO(ttft_ms=1000, tpot_ms=18))
    assert planner.choose(0, 1.0) is None


def test_a_prefill_replica_takes_no_moved_decode():
    planner = _planner([0, 80, 75], num_prefill=1)
    assert planner.choose(1, 1.0) is None


def _free_blocks(ledger: ReplicaLedger, num_free: int) -> None:
    """`ledger`'s replica publishes a snapshot with `num_free` of its KV blocks free."""
    usage = 1 - num_free / ledger.num_kv_blocks
    ledger.publish(EngineStats(kv_cache_usage=usage, step_cost=DEFAULT_COST, mean_lifetime_s=5.0))


def _short_of_blocks(free: list[int]) -> MigrationPlanner:
    """Replica 0 runs 10 decodes of 97 tokens, each about to start a block, and three more of
    33, 161 and 400 tokens likewise: 13 blocks in the next steps. Replica `i` has `free[i]` of
    its 256 blocks free and 2 decodes of 97 tokens. Every step is far within the TIGHT target."""
    planner = _planner([10] + [2] * (len(free) - 1), num_tokens=97)
    for ledger, num_free in zip(planner.router.router.replicas, free, strict=True):
        _free_blocks(ledger, num_free)
    source = planner.router.router.replicas[0]
    for request_id, num_tokens in (("small", 33), ("medium", 161), ("big", 400)):
        _decode(source, request_id, num_tokens, TIGHT)
    return planner


def test_a_replica_short_of_blocks_moves_the_smallest_decode_that_covers_it_to_room():
    # 13 blocks needed, 4 free: short 9. "medium" (11 blocks) is the smallest that covers
    # it; replica 1 has 5 free blocks, too few for it, replica 2 has room.
    planner = _short_of_blocks([4, 5, 200])
    assert planner.choose(0, 1.0) == Migration("medium", 0, 2)
    # Replica 1 has room for "medium" (12 blocks, its own 2 decodes' growth kept) but would be
    # left with less than replica 0 then has: the largest decode that leaves it more moves.
    assert _short_of_blocks([4, 14]).choose(0, 1.0) == Migration("decoding-0-0", 0, 1)


def test_no_move_for_blocks_with_enough_free_or_no_replica_with_room():
    # 13 free blocks cover the decodes' growth: nothing is short.
    assert _short_of_blocks([13, 200]).choose(0, 1.0) is None
    # Short, but no other replica holds even "small" beside its own decodes' growth.
    assert _short_of_blocks([4, 4, 4]).choose(0, 1.0) is None
    # Room, until the prompt it owes takes those blocks as it prefills.
    planner = _short_of_blocks([4, 40])
    planner.router.router.replicas[1].add("owed", 600, TIGHT, (), 1.0)
    assert planner.choose(0, 1.0) is None
    # Room in its snapshot, until a decode handed to it and still in transit lands.
    planner = _short_of_blocks([4, 200])
    _decode(planner.router.router.replicas[1], "in-transit", 3800, TIGHT)
    assert planner.choose(0, 1.0) is None


# Steady decodes at one TPOT target: the long ones are what fills a replica's steps.
LONG = RequestClass(
    "long", LengthDistribution(64, 0.0, 64), LengthDistribution(400, 0.0, 400), 400, 2000, 25, 0
)
SHORT = RequestClass(
    "short", LengthDistribution(64, 0.0, 64), LengthDistribution(4, 0.0, 4), 4, 2000, 25, 0
)


def _attainment(records) -> float:
    met = [
        not r.rejected and r.ttft_ms <= r.ttft_ms_target and r.tpot_ms <= r.tpot_ms_target
        for r in records
    ]
    return sum(met) / len(met)


def _round_robin_runs(workload, config: SimulationConfig) -> dict:
    """The workload over two replicas behind round-robin, without and with migration."""
    return {
        mode: simulate_replicas(
            "round-robin", "slo", workload, config, 2, DisaggregationSettings(migrate=mode)
        )
        for mode in ("never", "auto")
    }


def test_simulated_migrations_even_out_a_lopsided_placement_and_keep_every_answer():
    # Round-robin over two replicas sends every long answer to replica 0: its decodes outgrow
    # the target while replica 1 idles, which moving some of them fixes.
    workload = [
        WorkloadRequest(i / 20, 64, c.output.median, c.max_tokens, c)
        for i, c in enumerate([LONG, SHORT] * 100)
    ]
    runs = _round_robin_runs(workload, SimulationConfig())
    moves = [t for t in runs["auto"].transfers if t.migration]
    assert not any(t.migration for t in runs["never"].transfers)
    assert moves and {(t.source, t.target) for t in moves} == {(0, 1)}
    assert len({t.request_id for t in moves}) == len(moves)
    assert _attainment(runs["auto"].records) > _attainment(runs["never"].records)
    records = {r.request_id: r for r in runs["auto"].records}
    for index, spec in enumerate(workload):
        assert records[f"sim-{index}"].num_output_tokens == spec.output_len
    for move in moves:
        record = records[move.request_id]
        # It moved mid-decode, with the KV of every token but the last it had.
        assert move.started_s > record.first_token_s and record.class_name == "long"
        assert move.num_bytes > 64 * BYTES_PER_TOKEN and move.num_bytes % BYTES_PER_TOKEN == 0
        assert record.finish_s > move.started_s + move.seconds


def test_simulated_migrations_spare_a_full_replica_its_preemptions():
    # Round-robin sends every long answer to replica 0, whose 72 blocks hold two of them whole:
    # as they grow it preempts, while replica 1's short answers leave its blocks free.
    workload = [
        WorkloadRequest(i / 2, 64, c.output.median, c.max_tokens, c)
        for i, c in enumerate([LONG, SHORT] * 20)
    ]
    runs = _round_robin_runs(workload, SimulationConfig(num_kv_blocks=72))
    moves = [t for t in runs["auto"].transfers if t.migration]
    assert {(t.source, t.target) for t in moves} == {(0, 1)}
    assert runs["never"].num_preemptions >= 20
    assert runs["auto"].num_preemptions * 10 < runs["never"].num_preemptions
    assert _attainment(runs["auto"].records) == 1.0 > _attainment(runs["never"].records)
