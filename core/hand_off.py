"""Requests crossing between engines: a prefill-only request handed off at its first token, a
running one migrated at its next, and one another engine handed off going on decoding here. The
engine owns one `HandOffs`; the request travels as a `PrefilledRequest` (core/prefilled.py) and
its KV through the executors' `KVTransfer` hooks (core/executor.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from baton.core.executor import Executor, KVTransfer
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.prefilled import PrefilledRequest
from baton.core.request import EngineRequest, FinishReason, Request
from baton.core.scheduling.scheduler import Scheduler
from baton.core.text.output_processor import OutputProcessor


@dataclass(slots=True)
class HandOffs:
    """The engine's requests leaving for another engine, and those arriving from one."""

    scheduler: Scheduler
    kv_cache: KVCacheManager
    executor: Executor
    outputs: OutputProcessor
    clock: Callable[[], float]
    # Draft tokens are state outside a request's tokens: such an engine migrates nothing.
    speculates: bool
    # Bytes of KV one token holds in the executor's cache, for the transfer's size.
    kv_bytes_per_token: int = 0
    # Requests to hand off at their next sampled token: prefill-only ones (`at_first_token`)
    # and those to migrate (`migrate`).
    _due: set[str] = field(default_factory=set, init=False)
    # Handed off, whose blocks wait for the transfer to end (`release`).
    _held: dict[str, Request] = field(default_factory=dict, init=False)

    def at_first_token(self, request_id: str) -> None:
        """Hand a request just added off once its first token is sampled (prefill only)."""
        self._due.add(request_id)

    def migrate(self, request_id: str) -> bool:
        """Hand a running request off at its next sampled token (a live migration): its output
        then carries a `PrefilledRequest` for another engine to go on decoding it, as a
        prefill-only request's first token does. False, changing nothing, for a request not
        here, not past its first token, or whose state lives outside its tokens: a grammar's
        matcher, or draft tokens under speculative decoding."""
        request = self.scheduler.requests.get(request_id)
        if (
            request is None
            or request.first_token_time is None
            or request.sampling_params.structured_output is not None
            or request.pooled is not None
            or self.speculates
        ):
            return False
        self._due.add(request_id)
        return True

    def is_due(self, request_id: str) -> bool:
        """Whether the request leaves at the token just sampled (one that did not end it)."""
        return request_id in self._due

    def discard(self, request_id: str) -> None:
        """The request finished here: it no longer leaves."""
        self._due.discard(request_id)

    def hand_off(self, request: Request) -> PrefilledRequest:
        """Stop serving a request at the token just sampled (its first, for a prefill-only one):
        its blocks stay held for the transfer, and the rest of it is the other engine's. The
        text held back for a stop string stays unsent: the other engine holds it back too."""
        self.scheduler.hand_off(request)
        self.outputs.remove(request.request_id)
        self._due.discard(request.request_id)
        self._held[request.request_id] = request
        assert request.first_scheduled_time is not None and request.first_token_time is not None
        spec = EngineRequest(
            request.request_id,
            request.prompt_token_ids,
            request.sampling_params,
            request.priority,
            request.slo,
            request.arrival_time,
            request.trace_context,
        )
        return PrefilledRequest(
            spec,
            tuple(request.token_ids[request.num_prompt_tokens :]),
            self.kv_cache.computed_block_hashes(request),
            request.num_computed_tokens * self.kv_bytes_per_token,
            request.first_scheduled_time,
            request.first_token_time,
            request.num_cached_tokens or 0,
            tuple(request.token_times),
            tuple(request.prefill_chunks),
            request.num_preemptions,
        )

    def read_kv(self, request_id: str) -> object:
        """The KV contents of a handed-off request's computed tokens, read by the executor from
        the blocks it still holds."""
        return cast(KVTransfer, self.executor).read_kv(self.kv_cache.block_table(request_id))

    def release(self, request_id: str) -> None:
        """The transfer of a handed-off request's KV has ended (or failed): free its blocks."""
        request = self._held.pop(request_id, None)
        if request is not None:
            self.kv_cache.free(request)

    def add_prefilled(self, prefilled: PrefilledRequest, kv: object | None) -> Request:
        """Go on decoding a request another engine prefilled or migrated (its hand-off output),
        with the KV contents that engine's executor read (`read_kv`); None when the executor
        needs none (a simulated one). Without room for it now it recomputes its tokens here."""
        spec = prefilled.request
        assert spec.arrival_time is not None, "a prefilled request keeps its arrival time"
        request = Request.admit(spec, spec.sampling_params, spec.arrival_time)
        request.token_ids.extend(prefilled.output_token_ids)
        request.num_computed_tokens = prefilled.num_computed_tokens
        request.first_scheduled_time = prefilled.first_scheduled_time
        request.first_token_time = prefilled.first_token_time
        # Paced from its landing: its next token is due one TPOT target after it, whatever the
        # transfer cost or its pace was on the other engine (`SLOPolicy.tpot_allowance_s`).
        num_behind = len(prefilled.output_token_ids) - 1
        target_s = 0.0 if spec.slo.tpot_ms is None else spec.slo.tpot_ms / 1000
        request.pace_start_time = self.clock() - target_s * num_behind
        request.num_cached_tokens = prefilled.num_cached_tokens
        request.num_preemptions = prefilled.num_preemptions
        request.token_times.extend(prefilled.token_times)
        request.prefill_chunks.extend(prefilled.prefill_chunks)
        if self.scheduler.add_prefilled(request, prefilled.block_hashes) and kv is not None:
            table = self.kv_cache.block_table(request.request_id)
            try:
                cast(KVTransfer, self.executor).write_kv(table, kv)
            except Exception:
                # A transfer that fails leaves nothing of the request here: its blocks go back.
                self.scheduler.finish_request(request, FinishReason.ERROR, self.clock())
                raise
        self.outputs.add(request)
        return request
