"""One generation request and its sequence state as the scheduler and step loop see it."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from baton.core.batch import TokenLogprobs
from baton.core.pooling import PooledState
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.speculative.acceptance import DraftRecord


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    # Prompt computed and first token sampled here; decoding goes on in another engine.
    HANDED_OFF = "handed off"


class FinishReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"
    # Refused by SLO admission control after it was queued: it waited past its start bound.
    REFUSED = "refused"


# A target looser than a day is no target; capping it keeps every deadline sum finite.
MAX_SLO_MS = 86_400_000.0
# Priorities travel as 64-bit integers (trace attributes, metrics labels).
PRIORITY_RANGE = (-(2**63), 2**63 - 1)


@dataclass(slots=True, frozen=True)
class SLO:
    """Latency targets in milliseconds, validated on construction; None means no target."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequestError(f"slo.{name} must be a number, got {value!r}", "slo")
            if not 0 < value <= MAX_SLO_MS:
                raise InvalidRequestError(
                    f"slo.{name} must be in (0, {MAX_SLO_MS:.0f}] milliseconds, got {value!r}; "
                    "leave it out for no target",
                    f"slo.{name}",
                )


def check_priority(priority: object) -> None:
    low, high = PRIORITY_RANGE
    if isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high:
        raise InvalidRequestError(
            f"priority must be a 64-bit integer, got {priority!r}", "priority"
        )


@dataclass(slots=True, frozen=True)
class EngineRequest:
    """One request as admission hands it to the engine, built once and passed whole through
    every hop (route → async engine → step thread → engine). `arrival_time` None means when the
    engine receives it; `trace_context` is opaque to core. The prompt list is not copied: no hop
    may change it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0
    slo: SLO = SLO()
    arrival_time: float | None = None
    trace_context: object | None = None


class Request:
    """A prompt and everything generated for it so far.

    `token_ids` holds the prompt followed by the output; the first `num_computed_tokens` of them
    have their keys and values in the KV cache. After preemption that count drops to zero (or to
    the prefix-cache hit) and the tokens are computed again.
    """

    __slots__ = (
        "arrival_time",
        "block_hashes",
        "drafts",
        "finish_reason",
        "finish_time",
        "first_scheduled_time",
        "first_token_time",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "pace_start_time",
        "pooled",
        "preempted_times",
        "prefill_chunks",
        "priority",
        "prompt_logprobs",
        "request_id",
        "resumed_times",
        "sampling_params",
        "slo",
        "status",
        "token_ids",
        "token_times",
        "trace_context",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        arrival_time: float,
        priority: int = 0,
        slo: SLO | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.priority = priority
        self.slo = slo or SLO()
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # Prompt tokens served from the prefix cache the first time the request was scheduled.
        self.num_cached_tokens: int | None = None
        self.num_preemptions = 0
        # Chained hashes of the full blocks of `token_ids`, extended as blocks fill.
        self.block_hashes: list[bytes] = []
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        # When its TPOT pace starts here, if not at its first token: a request prefilled or
        # migrated by another engine lands behind its pace (the transfer), and is paced from its
        # landing, as if its first token had come that many targets before.
        self.pace_start_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: FinishReason | None = None
        # What tracing and metrics read after the request ends, on the engine's clock: when each
        # output token was ready, each prefill chunk as (start, end, num_tokens), and when the
        # request was preempted and readmitted. One float append per token is the whole cost.
        self.token_times: list[float] = []
        self.prefill_chunks: list[tuple[float, float, int]] = []
        self.preempted_times: list[float] = []
        self.resumed_times: list[float] = []
        # Asked for with `prompt_logprobs`: entry i scores prompt token i (the first has no
        # context, so None), filled chunk by chunk as the prompt is computed.
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            None if sampling_params.prompt_logprobs is None else [None]
        )
        # An embedding request's pool, filled as its prompt is computed.
        self.pooled: PooledState | None = (
            None if sampling_params.pooling is None else PooledState(sampling_params.pooling)
        )
        # Speculative decoding's verified drafts: the planner reads the rate, tracing the counts.
        self.drafts = DraftRecord()
        # Opaque to core: what the app's tracing needs to build this request's spans, if any.
        self.trace_context: object | None = None

    @classmethod
    def admit(
        cls, spec: EngineRequest, sampling_params: SamplingParams, arrival_time: float
    ) -> Request:
        """The engine's state for `spec`, with its checked params and its arrival time."""
        request = cls(
            spec.request_id,
            spec.prompt_token_ids,
            sampling_params,
            arrival_time,
            spec.priority,
            spec.slo,
        )
        request.trace_context = spec.trace_context
        return request

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV is not in the cache yet: prefill left, or 1 for a decode."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_logprobs_from(self) -> int | None:
        """The first position whose next prompt token's log-probability is still missing, or
        None when there is none to compute (not asked, or all collected). Entries already
        collected are kept across a preemption, so recomputing the prompt does not repeat them.
        """
        if self.prompt_logprobs is None:
            return None
        position = len(self.prompt_logprobs) - 1
        return position if position < self.num_prompt_tokens - 1 else None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"output={self.num_output_tokens}, computed={self.num_computed_tokens})"
        )
