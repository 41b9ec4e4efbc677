"""The seam between two engines when a request's decoding moves from one to the other: after its
prompt was computed there (a prefill hand-off, at its first token) or mid-decode (a live
migration, at any later token). Plain data; the KV contents travel beside it through the
executors' `read_kv` / `write_kv` hooks (core/executor.py)."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.request import EngineRequest


@dataclass(frozen=True, slots=True)
class PrefilledRequest:
    """A request whose KV is computed up to its last sampled token: the original request, every
    token it has sampled with when each was ready, the full-block hashes of its computed tokens
    as the source engine's prefix cache had them, the bytes of KV to move, and the source's
    times (the request's TTFT is its first token there). `arrival_time` in `request` is set: it
    is the same request. Seeded sampling and penalties need nothing more: the sampler draws from
    the seed and the output position, and penalises from the tokens."""

    request: EngineRequest
    output_token_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]
    num_kv_bytes: int
    first_scheduled_time: float
    first_token_time: float
    num_cached_tokens: int
    # When each output token was ready, on the source's clock.
    token_times: tuple[float, ...]
    # The prompt's chunks on the source engine, (start, end, num_tokens), for the request's trace.
    prefill_chunks: tuple[tuple[float, float, int], ...] = ()
    num_preemptions: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def first_token_id(self) -> int:
        return self.output_token_ids[0]

    @property
    def num_computed_tokens(self) -> int:
        """Tokens whose KV moves: all but the last sampled, which the next step computes."""
        return self.num_prompt_tokens + len(self.output_token_ids) - 1

    @property
    def migrated(self) -> bool:
        """Whether it moves mid-decode rather than at its first token."""
        return len(self.output_token_ids) > 1
