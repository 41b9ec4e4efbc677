"""The replica router (core/replicas/router.py) over the front end's ledgers
(core/replicas/replica_ledger.py):
the engine's own block hashes, each policy's choice as documented, SLO admission that refuses
only when no replica can make the target, and the ledger kept from per-step outputs."""

from __future__ import annotations

import dataclasses

import pytest

from baton.core.engine_stats import EngineStats
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.outputs import RequestOutput
from baton.core.replicas.replica_ledger import ReplicaLedger, prompt_block_hashes
from baton.core.replicas.router import NoReplicaError, Router, RouteRequest
from baton.core.request import SLO
from baton.core.scheduling.step_cost import CostCoefficients
from tests.factory import make_core_request, make_replica_ledger

BLOCK = 16
SHARED = list(range(500, 564))  # four full blocks of a shared prefix


def _request(request_id: str, prompt: list[int], ttft_ms: float | None = None) -> RouteRequest:
    return RouteRequest.of(request_id, prompt, SLO(ttft_ms=ttft_ms), BLOCK)


def _own(seed: int, length: int = 40) -> list[int]:
    return [seed * 1000 + i for i in range(length)]


def _first_token(ledger: ReplicaLedger, request_id: str, now: float = 0.0) -> None:
    ledger.receive(RequestOutput(request_id, [7], "", 0, 1), now)


def _fill_batch(ledger: ReplicaLedger, count: int, lifetime_s: float) -> None:
    """`count` requests decoding on the replica, which publishes a mean lifetime: with
    `count` = its max_num_seqs, a newcomer waits for a place."""
    for index in range(count):
        request_id = f"busy-{ledger.replica_id}-{index}"
        ledger.add(request_id, 32, SLO(), (), 0.0)
        _first_token(ledger, request_id)
    ledger.publish(dataclasses.replace(ledger.stats, mean_lifetime_s=lifetime_s))


def test_prompt_block_hashes_are_the_engines_own():
    prompt = list(range(70))
    request = make_core_request("a", prompt)
    KVCacheManager(64, BLOCK, enable_prefix_caching=True).cached_prefix(request)
    hashes = prompt_block_hashes(prompt, BLOCK)
    # A 70-token prompt caches 4 full blocks; the last token is always computed.
    assert len(hashes) == 4
    assert list(hashes) == request.block_hashes
    assert prompt_block_hashes(prompt[:64], BLOCK) == hashes[:3]


def test_round_robin_cycles_over_healthy_replicas_and_skips_a_dead_one():
    ledgers = [make_replica_ledger(i) for i in range(3)]
    router = Router("round-robin", ledgers, admission_factor=0)
    first = [router.route(_request(f"r{i}", _own(i)), 0.0).replica_id for i in range(6)]
    assert first == [0, 1, 2, 0, 1, 2]
    ledgers[1].healthy = False
    later = [router.route(_request(f"s{i}", _own(i)), 0.0).replica_id for i in range(4)]
    assert 1 not in later and sorted(later) == [0, 0, 2, 2]


def test_least_loaded_picks_the_fewest_waiting_and_running_tokens():
    ledgers = [make_replica_ledger(i) for i in range(2)]
    router = Router("least-loaded", ledgers, admission_factor=0)
    ledgers[0].add("big", 300, SLO(), (), 0.0)
    ledgers[1].add("small", 100, SLO(), (), 0.0)
    assert router.route(_request("a", _own(1)), 0.0).replica_id == 1
    assert ledgers[1].num_tokens == 140
    # Tokens generated count too: 200 decoded on replica 1 make it the heavier.
    ledgers[1].receive(RequestOutput("small", [1] * 200, "", 100, 200), 0.1)
    assert ledgers[1].num_tokens == 340
    assert router.route(_request("b", _own(2)), 0.1).replica_id == 0
    ledgers[0].receive(RequestOutput("big", [], "", 300, 0, finished=True), 0.2)
    assert ledgers[0].num_tokens == 40 and ledgers[0].request_ids == ["b"]


def test_prefix_router_follows_the_cached_prefix_and_balances_the_rest():
    ledgers = [make_replica_ledger(i) for i in range(3)]
    router = Router("prefix", ledgers, admission_factor=0)
    assert router.route(_request("a", SHARED + _own(1)), 0.0).replica_id == 0
    # Replica 0 is now the most loaded, yet holds the prefix: the same prefix goes there.
    route = router.route(_request("b", SHARED + _own(2)), 0.0)
    assert route.replica_id == 0 and route.cached_blocks == 4
    # A prompt sharing only the first block follows it too; one sharing none balances.
    assert router.route(_request("c", SHARED[:16] + _own(3)), 0.0).replica_id == 0
    assert router.route(_request("d", _own(4)), 0.0).replica_id in (1, 2)


def test_ledger_prefix_record_forgets_beyond_the_replicas_cache():
    ledger = make_replica_ledger(0, num_kv_blocks=4)
    first = prompt_block_hashes([*SHARED, 0], BLOCK)
    ledger.add("a", 65, SLO(), first, 0.0)
    assert ledger.cached_blocks(first) == 4
    ledger.add("b", 33, SLO(), prompt_block_hashes(_own(5), BLOCK), 0.0)
    # Two newer blocks pushed the two oldest out: the chain breaks at the first.
    assert ledger.cached_blocks(first) == 0


def test_slo_router_sends_to_the_lowest_predicted_ttft():
    ledgers = [make_replica_ledger(i, max_num_seqs=2) for i in range(2)]
    _fill_batch(ledgers[0], 2, lifetime_s=10.0)
    router = Router("slo", ledgers, admission_factor=3.0)
    # Replica 0's batch is full: a place frees every 5 s there; replica 1 is idle.
    route = router.route(_request("a", _own(1), ttft_ms=2000), 0.0)
    assert route.replica_id == 1
    assert route.forecast.ttft_s < 0.1
    assert ledgers[0].predict(40, 0, 2000, 0.0).ttft_s > 4.0


def test_slo_router_breaks_a_near_tie_by_prefix_affinity():
    cost = CostCoefficients(base_s=0.01, per_prefill_token_s=0.0, per_decode_token_s=2e-4)
    ledgers = [make_replica_ledger(i, cost=cost) for i in range(2)]
    router = Router("slo", ledgers, admission_factor=3.0)
    assert router.route(_request("a", SHARED + _own(1), ttft_ms=500), 0.0).replica_id == 0
    _first_token(ledgers[0], "a")
    # Replica 0 runs one decode: its prediction is a decode's cost above replica 1's, within
    # a step of it, so the cached prefix decides.
    assert ledgers[0].predict(104, 4, 500, 0.0).ttft_s > ledgers[1].predict(104, 0, 500, 0.0).ttft_s
    assert router.route(_request("b", SHARED + _own(2), ttft_ms=500), 0.0).replica_id == 0
    # Without a shared prefix the lower prediction wins.
    assert router.route(_request("c", _own(3), ttft_ms=500), 0.0).replica_id == 1


def test_slo_router_breaks_a_near_tie_toward_the_replica_holding_fewer_tokens():
    cost = CostCoefficients(base_s=0.01, per_prefill_token_s=1e-5, per_decode_token_s=2e-4)
    ledgers = [make_replica_ledger(i, cost=cost) for i in range(2)]
    router = Router("slo", ledgers, admission_factor=3.0)
    # Replica 0 decodes two long requests; replica 1 owes one short prompt's prefill.
    for request_id in ("long-a", "long-b"):
        ledgers[0].add(request_id, 300, SLO(), (), 0.0)
        _first_token(ledgers[0], request_id)
    ledgers[1].add("short", 100, SLO(), (), 0.0)
    zero, one = (ledger.predict(40, 0, 500, 0.0).ttft_s for ledger in ledgers)
    # Replica 0's forecast is lower, by less than a step: a tie, which load decides.
    assert zero < one < zero + cost.base_s
    assert ledgers[0].num_tokens > ledgers[1].num_tokens
    assert router.route(_request("a", _own(1), ttft_ms=500), 0.0).replica_id == 1


def test_slo_admission_refuses_only_when_no_replica_can_make_the_target():
    ledgers = [make_replica_ledger(i, max_num_seqs=2) for i in range(2)]
    _fill_batch(ledgers[0], 2, lifetime_s=10.0)
    slo_router = Router("slo", ledgers, admission_factor=3.0)
    assert slo_router.choose(_request("a", _own(1), ttft_ms=100), 0.0).replica_id == 1
    # Round-robin's turn lands on replica 0, whose own forecast refuses: a 429 although
    # replica 1 could serve it in time.
    rr_router = Router("round-robin", ledgers, admission_factor=3.0)
    refused = rr_router.route(_request("a", _own(1), ttft_ms=100), 0.0)
    assert refused.replica_id is None and refused.forecast.ttft_s > 0.3
    assert ledgers[0].num_in_flight == 2 and ledgers[1].num_in_flight == 0
    _fill_batch(ledgers[1], 2, lifetime_s=10.0)
    assert slo_router.route(_request("b", _own(2), ttft_ms=100), 0.0).replica_id is None
    # Without a target nothing is refused.
    assert slo_router.route(_request("c", _own(3)), 0.0).replica_id in (0, 1)


def test_router_with_every_replica_down_says_so():
    ledgers = [make_replica_ledger(i) for i in range(2)]
    for ledger in ledgers:
        ledger.healthy = False
    with pytest.raises(NoReplicaError, match="restarting"):
        Router("slo", ledgers, admission_factor=3.0).route(_request("a", _own(1)), 0.0)
    with pytest.raises(ValueError, match="--router must be one of"):
        Router("random", ledgers, admission_factor=3.0)


def test_ledger_settles_prefill_at_the_first_token_and_publishes_the_cost_fit():
    ledger = make_replica_ledger(0)
    ledger.add("a", 200, SLO(ttft_ms=1000), (), 0.0)
    assert ledger.forecast.num_owed == 1
    _first_token(ledger, "a", 0.05)
    assert ledger.forecast.num_owed == 0
    assert ledger.num_tokens == 201
    faster = CostCoefficients(base_s=0.001, per_prefill_token_s=1e-6)
    ledger.publish(EngineStats(step_cost=faster, mean_lifetime_s=2.0))
    assert ledger.forecast.cost_model == faster and ledger.forecast.lifetime_s == 2.0
    ledger.remove("a")
    assert ledger.num_tokens == 0 and ledger.num_in_flight == 0


def test_a_replica_is_stalled_only_when_silent_with_work_in_hand():
    ledger = make_replica_ledger(0)
    # Idle for a long time: silence is no stall.
    assert not ledger.stalled(1000.0, timeout_s=3.0)
    # Work arrives after the idle spell: the timeout counts from then.
    ledger.add("a", 32, SLO(), (), 1000.0)
    assert not ledger.stalled(1002.0, timeout_s=3.0)
    assert ledger.stalled(1003.5, timeout_s=3.0)
    # A step message is progress; a second request does not reset the clock of the first.
    ledger.progressed(1003.5)
    ledger.add("b", 32, SLO(), (), 1006.0)
    assert ledger.stalled(1006.6, timeout_s=3.0)
    # Its work done, it is idle again; a dead replica is not judged.
    ledger.remove("a")
    ledger.remove("b")
    assert not ledger.stalled(2000.0, timeout_s=3.0)
    ledger.add("c", 32, SLO(), (), 2000.0)
    ledger.healthy = False
    assert not ledger.stalled(2010.0, timeout_s=3.0)
