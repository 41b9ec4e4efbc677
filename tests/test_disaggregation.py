"""Prefill and decode apart (core/replicas/disaggregation.py, the replica simulator's roles and
transfers): `auto` keeps a prompt that fits one capped step local and sends a longer one through
a prefill replica, lets a prefill replica serve whole requests when the decode replicas cannot
keep the TPOT target, and hands a prefilled request to a decode replica with room; `never` and
`always` are the two fixed layouts; simulated transfers cost latency + bytes / bandwidth, and a
server fits that link to the transfers it measures; the report names roles and transfers."""

from __future__ import annotations

import json

import pytest

from baton.app.cli import main
from baton.core.engine_stats import EngineStats
from baton.core.replicas.disaggregation import DisaggregatingRouter, replica_roles
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.kv_transfer import KVShape, TransferCost, TransferFit
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.replicas.router import Router, RouteRequest
from baton.core.request import SLO
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.scheduling.step_cost_profile import profile_shapes, warm_up
from baton.core.simulation.replica_simulator import simulate_replicas
from baton.core.simulation.simulator import DEFAULT_COST, SimulationConfig
from baton.core.simulation.workloads import LengthDistribution, RequestClass, WorkloadRequest
from tests.factory import make_engine, make_replica_ledger, make_request

BYTES_PER_TOKEN = KVShape(32, 8, 128, 2).bytes_per_token
LINK = TransferCost(0.0005, 50e9)
TIGHT = SLO(ttft_ms=1000, tpot_ms=25)


def _router(mode: str, num_replicas: int = 3, num_prefill: int = 1) -> DisaggregatingRouter:
    ledgers = [
        make_replica_ledger(i, cost=DEFAULT_COST, max_num_batched_tokens=2048, max_num_seqs=128)
        for i in range(num_replicas)
    ]
    router = Router("slo", ledgers, admission_factor=3.0)
    return DisaggregatingRouter(router, num_prefill, mode, LINK, BYTES_PER_TOKEN)


def _decoding(ledger: ReplicaLedger, count: int, slo: SLO = TIGHT) -> None:
    """`count` requests of 100 tokens decoding on the replica, with `slo`'s targets."""
    for index in range(count):
        request_id = f"decoding-{ledger.replica_id}-{index}"
        ledger.add(request_id, 100, slo, (), 0.0)
        ledger.forecast.first_token(request_id, 0.0)


def _request(request_id: str, num_tokens: int) -> RouteRequest:
    return RouteRequest(request_id, num_tokens, TIGHT, ())


def test_auto_keeps_a_short_prompt_local_and_sends_a_long_one_through_a_prefill_replica():
    router = _router("auto")
    for ledger in router.router.replicas[1:]:
        _decoding(ledger, 10)
    # Beside ten decodes a 25 ms step has room for about 200 prompt tokens.
    assert 64 < router.router.replicas[1].forecast.capped_prefill_budget() < 1500
    short = router.route(_request("short", 64), 0.0)
    assert short.replica_id in (1, 2) and not short.split
    long = router.route(_request("long", 1500), 0.0)
    assert long.replica_id == 0 and long.split
    assert router.num_split == 1


LOOSE = SLO(ttft_ms=1000, tpot_ms=60)


@pytest.mark.parametrize(
    ("decoders_slo", "replica_id", "split"), [(LOOSE, 0, True), (TIGHT, 1, False)]
)
def test_a_long_prompt_runs_whole_on_a_decode_replica_only_beside_its_own_tpot_target(
    decoders_slo, replica_id, split
):
    router = _router("auto")
    prefill, *decoders = router.router.replicas
    for index in range(10):
        prefill.add(f"queued-{index}", 2000, TIGHT, (), 0.0)
    for ledger in decoders:
        _decoding(ledger, 10, decoders_slo)
    # The prefill replica's queue makes the long prompt late there; a decode replica can
    # prefill it in time, in chunks capped for its decodes. Beside decodes of its own target
    # that is the co-located layout; beside looser ones the prompt's long context would join
    # steps paced for another target, so it queues for the prefill replica.
    assert prefill.predict(1500, 0, 1000, 0.0).ttft_s > 1.0
    assert decoders[0].predict(1500, 0, 1000, 0.0, 200).ttft_s < 1.0
    placement = router.route(_request("long", 1500), 0.0)
    assert (placement.replica_id, placement.split) == (replica_id, split)


def test_never_routes_over_every_replica_and_always_splits_every_request():
    never = _router("never")
    for ledger in never.router.replicas:
        _decoding(ledger, 10)
    placements = [never.route(_request(f"n{i}", 1500), 0.0) for i in range(6)]
    assert {p.replica_id for p in placements} == {0, 1, 2}
    assert not any(p.split for p in placements)
    always = _router("always")
    placements = [always.route(_request(f"a{i}", 16), 0.0) for i in range(3)]
    assert all(p.replica_id == 0 and p.split for p in placements)


def test_auto_serves_a_request_whole_on_a_prefill_replica_when_decode_replicas_are_full():
    router = _router("auto")
    for ledger in router.router.replicas[1:]:
        _decoding(ledger, 80)
    # 81 decodes make a step longer than the 25 ms target on either decode replica.
    placement = router.route(_request("r", 64), 0.0)
    assert placement.replica_id == 0 and not placement.split


def test_a_prefill_replica_with_prompts_queued_decodes_when_decode_replicas_are_full():
    router = _router("auto")
    prefill, *decoders = router.router.replicas
    for index in range(4):
        prefill.add(f"queued-{index}", 1500, TIGHT, (), 0.0)
    for ledger in decoders:
        _decoding(ledger, 80)
    # Its owed prompts do not fill its steps: the planner caps them for the decodes it holds,
    # so the prefill replica's spare decode capacity serves a decode-bound load.
    placement = router.route(_request("whole", 1500), 0.0)
    assert placement.replica_id == 0 and not placement.split
    assert router.hand_off("moved", 1500, TIGHT, (), source=0, now=0.0) == 0


def test_hand_off_goes_to_the_decode_replica_with_room_and_records_it_as_decoding():
    router = _router("auto", num_replicas=4)
    replicas = router.router.replicas
    _decoding(replicas[1], 60)
    _decoding(replicas[2], 5)
    _decoding(replicas[3], 30)
    target = router.hand_off("r", 1500, TIGHT, (), source=0, now=0.0)
    assert target == 2
    assert replicas[2].num_in_flight == 6 and replicas[2].forecast.num_owed == 0
    # With every decode replica past the target, the prefill replica keeps decoding it.
    for ledger in replicas[1:]:
        _decoding(ledger, 100)
    assert router.hand_off("s", 1500, TIGHT, (), source=0, now=0.0) == 0


def test_hand_off_passes_over_a_decode_replica_without_kv_room_for_it():
    router = _router("auto", num_replicas=3)
    _, nearly_full, roomy = router.router.replicas
    # One long decode holds 244 of the replica's 256 blocks: the shortest step, but a
    # 1,500-token prompt's 94 blocks would make it preempt.
    nearly_full.add("long", 3900, TIGHT, (), 0.0)
    nearly_full.forecast.first_token("long", 0.0)
    _decoding(roomy, 10)
    assert router.hand_off("r", 1500, TIGHT, (), source=0, now=0.0) == roomy.replica_id
    # With no decode replica that has the room, the prefill replica keeps it: no move, and
    # its own engine decides when its prompt starts.
    roomy.add("long-too", 3900, TIGHT, (), 0.0)
    roomy.forecast.first_token("long-too", 0.0)
    assert router.hand_off("s", 1500, TIGHT, (), source=0, now=0.0) == 0


def test_hand_off_passes_over_a_decode_replica_that_owes_a_prompt():
    router = _router("auto", num_replicas=3)
    _, chunking, decoding = router.router.replicas
    _decoding(chunking, 5)
    chunking.add("owed", 1500, TIGHT, (), 0.0)
    _decoding(decoding, 20)
    # Its owed prompt fills its steps to the cap, the 25 ms target, leaving no room for a
    # decode already late by its transfer.
    assert router.hand_off("moved", 1500, TIGHT, (), source=0, now=0.0) == decoding.replica_id


def test_hand_off_from_a_prefill_replica_whose_fit_prices_decodes_at_nothing():
    # A fit learned from prefill chunks alone can clamp every term but the prefill tokens' to
    # zero; with a measured lifetime, spreading the transfer over its decode steps divided by
    # that zero and the hand-off raised, which stopped the front end reading that replica.
    router = _router("auto", num_replicas=2)
    prefiller, decoder = router.router.replicas
    prefill_only = CostCoefficients(0.0, 1e-4, 0.0, 0.0)
    prefiller.publish(EngineStats(step_cost=prefill_only, mean_lifetime_s=2.0))
    _decoding(decoder, 3)
    assert router.hand_off("r", 900, TIGHT, (), source=0, now=0.0) == decoder.replica_id


def test_roles_leave_a_decode_replica_and_settings_name_what_to_change():
    assert [r.value for r in replica_roles(4, 1)] == ["prefill", "decode", "decode", "decode"]
    assert {r.value for r in replica_roles(2, 0)} == {"both"}
    with pytest.raises(ValueError, match="leave a decode replica"):
        replica_roles(2, 2)
    with pytest.raises(ValueError, match="LAYERSxKV_HEADSxHEAD_DIMxDTYPE_BYTES"):
        DisaggregationSettings(kv_shape="32x8x128")
    with pytest.raises(ValueError, match="bandwidth > 0"):
        DisaggregationSettings(kv_transfer_gbps=0)
    assert DisaggregationSettings().kv_bytes_per_token == 131072


# TTFT targets only: admission refuses none of them for the slow transfer's TPOT.
SHORT = RequestClass(
    "short", LengthDistribution(64, 0.0, 64), LengthDistribution(8, 0.0, 8), 64, 500, None, 0
)
LONG = RequestClass(
    "long", LengthDistribution(1500, 0.0, 1500), LengthDistribution(2, 0.0, 2), 64, 2000, None, 0
)


def _workload() -> list[WorkloadRequest]:
    return [
        WorkloadRequest(i * 0.02, c.prompt.median, c.output.median, c.max_tokens, c)
        for i, c in enumerate([SHORT, LONG] * 20)
    ]


def test_simulated_split_requests_move_their_kv_once_and_keep_their_answers():
    workload = _workload()
    # A slow link (1 GB/s), so each transfer outlasts the steps around it.
    settings = DisaggregationSettings(
        prefill_replicas=1, disaggregate="always", kv_transfer_gbps=1.0
    )
    split = simulate_replicas("slo", "slo", workload, SimulationConfig(), 3, settings)
    together = simulate_replicas("slo", "slo", workload, SimulationConfig(), 3)
    assert split.roles == ["prefill", "decode", "decode"] and together.roles == ["both"] * 3
    assert together.transfers == []
    moved = [t.request_id for t in split.transfers]
    assert len(moved) == 40 and set(moved) == {f"sim-{i}" for i in range(40)}
    for transfer in split.transfers:
        prompt = workload[int(transfer.request_id.split("-")[1])].prompt_len
        assert transfer.source == 0 and transfer.target in (1, 2)
        assert transfer.num_bytes == prompt * 131072
        assert transfer.seconds == pytest.approx(0.0005 + prompt * 131072 / 1e9)
    outputs = {r.request_id: r.num_output_tokens for r in split.records}
    assert outputs == {r.request_id: r.num_output_tokens for r in together.records}
    assert sorted(outputs.values()) == [2] * 20 + [8] * 20
    # Decoding began once the KV had landed: the rest of the answer comes after the transfer,
    # which started when the first token reached the front end.
    records = {r.request_id: r for r in split.records}
    for transfer in split.transfers:
        record = records[transfer.request_id]
        assert transfer.started_s >= record.first_token_s
        assert record.finish_s > transfer.started_s + transfer.seconds


def test_simulate_reports_roles_and_transfers(capsys):
    argv = ["simulate", "--replicas", "3", "--router", "slo", "--num-requests", "40"]
    argv += ["--rate", "20", "--prefill-replicas", "1", "--disaggregate", "always"]
    assert main([*argv, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["slo"]
    assert row["roles"] == ["prefill", "decode", "decode"]
    assert row["transfers"]["count"] == 40 - row["rejected"]
    assert row["transfers"]["bytes"] > 0 and row["transfers"]["latency_ms_p99"] > 0.5
    assert main(argv) == 0
    assert "roles P/D/D" in " ".join(capsys.readouterr().out.split())
    assert main([*argv[:-4], "--prefill-replicas", "3"]) == 2
    assert "leaves no decode replica" in capsys.readouterr().err


def test_a_served_link_is_fitted_to_the_transfers_measured():
    prior = TransferCost(0.0005, 50e9)
    fit = TransferFit(prior)
    assert fit.current == prior
    # A link of 2 ms and 1 GB/s, transfers of 0.5 to 14 MB.
    for index in range(60):
        num_bytes = 500_000 + index % 7 * 2_000_000
        fit.observe(num_bytes, 0.002 + num_bytes / 1e9)
    assert fit.current.latency_s == pytest.approx(0.002, rel=0.05)
    assert fit.current.bandwidth_bytes_s == pytest.approx(1e9, rel=0.05)
    assert fit.num_observations == 60


def test_transfers_of_one_size_move_the_latency_and_keep_a_positive_bandwidth():
    fit = TransferFit(TransferCost(0.0005, 50e9))
    for _ in range(40):
        fit.observe(1_000_000, 0.010)
    # What one size can tell: the predicted time of that size is right.
    assert fit.current.seconds(1_000_000) == pytest.approx(0.010, rel=0.02)
    assert fit.current.latency_s >= 0 and fit.current.bandwidth_bytes_s > 0


def test_serve_refuses_prefill_replicas_that_leave_no_decode_replica(capsys):
    argv = ["serve", "--replicas", "2", "--prefill-replicas", "2", "--port", "0"]
    assert main(argv) == 2
    assert (
        "--prefill-replicas 2 leaves no decode replica of --replicas 2" in capsys.readouterr().err
    )


def test_serve_takes_the_migration_flag():
    from baton.app.cli import DISAGGREGATION, parse_args

    args = parse_args(["serve", "--replicas", "2", "--migrate", "auto"])
    assert DISAGGREGATION.build(args).migrate == "auto"
    assert DISAGGREGATION.build(parse_args(["serve"])).migrate == "never"


def _slo_engine(on_batch=None):
    """An `slo` engine on the simulator's default cost, its step-cost model fitted exactly."""
    engine = make_engine(
        num_kv_blocks=1024,
        max_model_len=8192,
        cost=DEFAULT_COST,
        scheduling_policy="slo",
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        on_batch=on_batch,
    )
    warm_up(engine.step_cost_model, DEFAULT_COST.predict, profile_shapes(2048, 64, 8192))
    return engine


def test_a_moved_decode_is_paced_from_its_landing_and_keeps_prefill_capped():
    prefill = _slo_engine()
    moved = make_request("moved", [i % 997 + 1 for i in range(300)], slo=TIGHT, max_tokens=20)
    prefill.add_request(prefill.validator.validate(moved), hand_off=True)
    (output,) = prefill.step()
    handed = output.prefilled
    assert handed is not None
    prefill_tokens: list[int] = []
    decode = _slo_engine(on_batch=lambda batch: prefill_tokens.append(batch.num_prefill_tokens))
    # The transfer took four TPOT targets: counted from its first token, the decode is late.
    decode.clock.now = handed.first_token_time + 4 * TIGHT.tpot_ms / 1000
    decode.add_prefilled(handed)
    long = make_request(
        "long", [i % 997 + 1 for i in range(1500)], slo=SLO(ttft_ms=5000), max_tokens=4
    )
    decode.add_request(decode.validator.validate(long))
    landed_s = decode.clock()
    outputs = decode.step()
    # The planner caps the step's prefill to keep the moved decode's pace from its landing,
    # rather than giving up on it and running the whole prompt beside it.
    assert 0 < prefill_tokens[0] < 1500
    assert any(o.request_id == "moved" and o.new_token_ids for o in outputs)
    assert decode.clock() - landed_s <= TIGHT.tpot_ms / 1000
