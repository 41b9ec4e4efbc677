"""Live migration served: `baton serve --replicas 2 --migrate auto` (co-located) on a local
Ray. A running decode moved mid-stream to the other replica streams on with the text and token
count of one process, its span and the counters naming the move; a migration whose transfer
fails ends only that request, with a clean error, and frees the blocks on both sides."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

# scripts/setup installs the ray extra: without it these tests fail, they are not skipped.
import ray

from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.replicas.migration import Migration
from tests.server_harness import model_engine, served_replicas
from tests.test_disaggregated_replicas import ENGINE, _request, _run, _settled

PROMPT = [(13 * j) % 400 + 5 for j in range(40)]
MAX_TOKENS = 160
# The move is asked for once the request has this many tokens on its first replica.
MOVE_AT = 4


@pytest.fixture(scope="module")
def served(llama_checkpoint):
    """Two co-located replicas that migrate, behind a front end; yields (url, engine, spans)."""
    with served_replicas(
        llama_checkpoint, ENGINE, DisaggregationSettings(migrate="auto")
    ) as served:
        yield served


@pytest.fixture(scope="module")
def expected(llama_checkpoint) -> tuple[str, int]:
    """The prompt's greedy text and token count from one in-process engine."""
    engine = model_engine(llama_checkpoint, **ENGINE)
    engine.add_request(engine.validator.validate(_request("0", PROMPT, MAX_TOKENS)))
    text, count = "", 0
    while engine.has_unfinished_requests:
        for output in engine.step():
            text += output.new_text
            count += len(output.new_token_ids)
    return text, count


def _force_one_move(engine, monkeypatch) -> list[Migration]:
    """Have the planner move the first decode that reaches `MOVE_AT` tokens to the other
    replica, once, whatever the load: the tiny model never runs past a target."""
    forced: list[Migration] = []

    def choose(source_id: int, now: float) -> Migration | None:
        ledger = engine.ledgers[source_id]
        for request_id, _, _ in ledger.forecast.decodes():
            if not forced and ledger.num_tokens_of(request_id) >= len(PROMPT) + MOVE_AT:
                forced.append(Migration(request_id, source_id, 1 - source_id))
                return forced[0]
        return None

    monkeypatch.setattr(engine.migration, "choose", choose)
    return forced


def test_a_decode_migrated_mid_stream_streams_the_tokens_of_one_process(
    served, expected, monkeypatch
):
    url, engine, spans = served
    forced = _force_one_move(engine, monkeypatch)
    ((kind, text, count),) = _run(url, [PROMPT], MAX_TOKENS)
    assert (kind, text, count) == ("done", *expected)
    (move,) = forced
    total = engine.hand_offs.total
    assert (total.count, total.migrations, total.failed) == (1, 1, 0)
    assert total.num_bytes >= (len(PROMPT) + MOVE_AT) * engine.infos[0].kv_bytes_per_token
    _settled(engine)
    (root,) = [s for s in spans.get_finished_spans() if s.name == "text_completion tiny"]
    assert root.attributes["baton.migration.source_replica"] == move.source
    assert root.attributes["baton.migration.target_replica"] == move.target
    assert root.attributes["baton.migration.bytes"] == total.num_bytes
    children = [s.name for s in spans.get_finished_spans() if s.parent is not None]
    assert "migration" in children and "kv_transfer" not in children
    stats = httpx.get(f"{url}/v1/stats").json()
    received = [r["kv_transfers"]["migrations"] for r in stats["replicas"]]
    assert received[move.target] == 1 and stats["kv_transfers"]["migrations"] == 1
    metrics = httpx.get(f"{url}/metrics").text
    line = f'baton:replica_migrations_total{{replica="{move.target}",role="both"}} 1.0'
    assert line in metrics


def test_a_migration_whose_transfer_fails_ends_only_its_request(served, expected, monkeypatch):
    url, engine, _ = served
    _force_one_move(engine, monkeypatch)
    move = engine.hand_offs.move

    async def move_garbage(prefilled, kv, source, target, timeout_s):
        # The target is handed contents that do not fit its cache: its write fails.
        return await move(prefilled, ray.put(np.zeros(3, np.uint8)), source, target, timeout_s)

    monkeypatch.setattr(engine.hand_offs, "move", move_garbage)
    failed = engine.hand_offs.total.failed
    (result,) = _run(url, [PROMPT], MAX_TOKENS)
    assert result[0] == "error" and "moving this request's decoding" in result[1]
    assert engine.hand_offs.total.failed == failed + 1
    # Nothing hangs and neither side keeps a block of it; the next request is served whole.
    _settled(engine)
    monkeypatch.undo()
    assert _run(url, [PROMPT], MAX_TOKENS)[0] == ("done", *expected)
