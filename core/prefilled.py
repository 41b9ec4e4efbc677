"""The seam between a prefill engine and a decode engine: what crosses it when a request's prompt
was computed on one engine and its decoding goes on in another. Plain data; the KV contents
travel beside it through the executors' `read_kv` / `write_kv` hooks (core/executor.py)."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.request import EngineRequest


@dataclass(frozen=True, slots=True)
class PrefilledRequest:
    """A request whose prompt's KV is computed and whose first token is sampled: the original
    request, that token, the prompt's full-block hashes as the prefill engine's prefix cache had
    them, the bytes of KV to move, and the prefill engine's times (the request's TTFT is its
    first token there). `arrival_time` in `request` is set: it is the same request."""

    request: EngineRequest
    first_token_id: int
    block_hashes: tuple[bytes, ...]
    num_kv_bytes: int
    first_scheduled_time: float
    first_token_time: float
    num_cached_tokens: int
    # The prompt's chunks on the prefill engine, (start, end, num_tokens), for the request's trace.
    prefill_chunks: tuple[tuple[float, float, int], ...] = ()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)
