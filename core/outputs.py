"""What the engine hands back each step: per request, the tokens and text that step produced."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.batch import TokenLogprobs
from baton.core.metrics.latency import tpot_ms
from baton.core.prefilled import PrefilledRequest
from baton.core.request import FinishReason, Request


@dataclass(slots=True)
class RequestTiming:
    """Latency breakdown in milliseconds, from the engine's own clock."""

    queue_ms: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    cached_prompt_tokens: int
    preemptions: int

    @classmethod
    def of(cls, request: Request) -> RequestTiming:
        arrival = request.arrival_time
        first_scheduled = request.first_scheduled_time or arrival
        first_token = request.first_token_time or first_scheduled
        finish = request.finish_time or first_token
        return cls(
            queue_ms=(first_scheduled - arrival) * 1e3,
            ttft_ms=(first_token - arrival) * 1e3,
            tpot_ms=tpot_ms(first_token, finish, request.num_output_tokens),
            e2e_ms=(finish - arrival) * 1e3,
            cached_prompt_tokens=request.num_cached_tokens or 0,
            preemptions=request.num_preemptions,
        )


@dataclass(slots=True)
class RequestOutput:
    """One request's delta from one step; the last one has `finished` set and `timing`."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finished: bool = False
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprobs] | None = None
    # On a request's first output, when it asked for `prompt_logprobs`: one entry per prompt
    # token, None for the first.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    timing: RequestTiming | None = None
    # On an embedding request's final output: its pooled, L2-normalised final hidden state.
    embedding: list[float] | None = None
    # What the client is told when the request failed; `error_detail` is the operator's side
    # (the exception, for logs and traces), never sent to the client.
    error: str | None = None
    error_detail: str | None = None
    # On the final output: when each output token was ready, on the engine's clock (seconds).
    token_times: list[float] | None = None
    # On a prefill-only request's first token: what another engine needs to decode it.
    prefilled: PrefilledRequest | None = None

    @classmethod
    def without_tokens(
        cls, request: Request, error: str | None = None, error_detail: str | None = None
    ) -> RequestOutput:
        """An output with no new tokens: a request ending early, or with `max_tokens` 0."""
        return cls(
            request.request_id,
            [],
            "",
            request.num_prompt_tokens,
            request.num_output_tokens,
            error=error,
            error_detail=error_detail,
        )
