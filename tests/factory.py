"""The one place tests build engines and requests: an Engine on a SimulatedExecutor and a
simulated clock, and requests with only the fields a test cares about spelled out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from baton.core.batch import Batch
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.engine_stats import EngineStats
from baton.core.replicas.replica_ledger import ReplicaLedger
from baton.core.request import SLO, EngineRequest, Request
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import CostCoefficients
from baton.core.simulation.simulated_executor import SimulatedClock, SimulatedExecutor

VOCAB_SIZE = 1000


def make_engine(
    *,
    num_kv_blocks: int = 256,
    block_size: int = 16,
    vocab_size: int = VOCAB_SIZE,
    max_model_len: int = 4096,
    cost: CostCoefficients | None = None,
    on_batch: Callable[[Batch], None] | None = None,
    clock: SimulatedClock | None = None,
    draft_acceptance: float = 1.0,
    **config: Any,
) -> Engine:
    """An engine without a model or an EOS token: every answer runs to its max_tokens (or to
    the end of the context).

    The executor charges each step `cost` (SimulatedExecutor's default when None) on `clock`,
    which the engine shares, so every timestamp is simulated time; `on_batch` sees each batch
    before it runs; `draft_acceptance` is the chance a right draft token is accepted (the
    executor's). `config` are EngineConfig fields.
    """
    clock = SimulatedClock() if clock is None else clock
    executor = SimulatedExecutor(
        num_kv_blocks,
        block_size,
        vocab_size,
        clock,
        cost,
        on_batch=on_batch,
        draft_acceptance=draft_acceptance,
    )
    return Engine(
        EngineConfig(block_size=block_size, **config),
        executor,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        eos_token_ids=[],
        clock=clock,
    )


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    priority: int = 0,
    slo: SLO | None = None,
    arrival_time: float | None = None,
    **sampling: Any,
) -> EngineRequest:
    """A request as admission hands it to the engine; `sampling` are SamplingParams fields."""
    return EngineRequest(
        request_id,
        prompt_token_ids,
        SamplingParams(**sampling),
        priority=priority,
        slo=SLO() if slo is None else slo,
        arrival_time=arrival_time,
    )


def add_request(engine: Engine, request: EngineRequest) -> Request:
    """Queue `request` as every caller of the engine does: through the engine's validator
    first (InvalidRequestError as admission raises it), never past it."""
    return engine.add_request(engine.validator.validate(request))


def make_core_request(
    request_id: str,
    prompt_token_ids: list[int],
    *,
    arrival_time: float = 0.0,
    priority: int = 0,
    slo: SLO | None = None,
    **sampling: Any,
) -> Request:
    """The engine's own state for a request, for tests of the parts below the engine (KV cache,
    policies, predictors); `sampling` are SamplingParams fields."""
    return Request(
        request_id, prompt_token_ids, SamplingParams(**sampling), arrival_time, priority, slo
    )


def make_replica_ledger(
    replica_id: int,
    *,
    cost: CostCoefficients | None = None,
    max_num_batched_tokens: int = 512,
    max_num_seqs: int = 8,
    max_wait_s: float = 20.0,
    block_size: int = 16,
    num_kv_blocks: int = 256,
) -> ReplicaLedger:
    """The router's view of an idle replica whose published cost fit is `cost`."""
    stats = EngineStats(step_cost=cost or CostCoefficients(base_s=0.01, per_prefill_token_s=1e-4))
    return ReplicaLedger(
        replica_id,
        stats,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_wait_s=max_wait_s,
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
    )
