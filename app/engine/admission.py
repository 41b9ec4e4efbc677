"""Admission of one generation request, shared by HTTP and WebSocket: the capacity check that
comes before any work, the model name, a length bound before tokenizing, tokenizing (off the
event loop when long), the engine requests built and validated (the only validation they get)
and their registration. Every refusal is an `APIError`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel
from starlette.requests import ClientDisconnect, Request

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.completion_protocol import CompletionRequest
from baton.app.api.protocol import GenerationRequest, parse_json_object, validate_request
from baton.app.engine.client import EngineDeadError, EngineStream, QueueFullError
from baton.app.engine.compile_pool import compile_constraint
from baton.app.errors import APIError
from baton.app.state import ServerState, server_state
from baton.core.request import SLO, EngineRequest
from baton.core.sampling_params import CONTEXT_LENGTH_EXCEEDED, InvalidRequestError
from baton.core.text.tokenizer import ChatTemplateError, Tokenizer

Body = TypeVar("Body", bound=BaseModel)

# Tokenizing more characters than this would hold the event loop for a millisecond or more,
# delaying every other stream's tokens, so it moves to a worker thread.
MAX_INLINE_TOKENIZE_CHARS = 4096


@dataclass(slots=True)
class AdmittedRequest:
    """An API request's engine requests, built and validated: `num_candidates` per prompt (`n`,
    or `best_of`), prompt by prompt, sharing each prompt's KV blocks through the prefix cache."""

    requests: list[EngineRequest]
    num_candidates: int = 1
    # With --reasoning-parser, whether a chat's output starts inside the model's thinking;
    # None where nothing is split (no parser, or a completion).
    thinks_first: bool | None = None

    @property
    def prompts(self) -> list[list[int]]:
        """Each prompt's token ids, once."""
        return [request.prompt_token_ids for request in self.requests[:: self.num_candidates]]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)

    @property
    def slo(self) -> SLO:
        return self.requests[0].slo


@dataclass(frozen=True, slots=True)
class Received(Generic[Body]):
    """A request body as a route receives it: parsed, on the engine's clock."""

    state: ServerState
    # On the engine's clock, so queue time and TTFT count parsing and tokenizing too.
    arrival_time: float
    body: Body


async def receive(request: Request, model: type[Body]) -> Received[Body] | None:
    """The body of `request` validated as `model`, after the cheap capacity check; None when
    the client left before its body arrived (nobody to answer)."""
    state = server_state(request)
    arrival_time = state.engine.clock()
    check_capacity(state)
    try:
        raw = await request.body()
    except ClientDisconnect:
        return None
    return Received(state, arrival_time, validate_request(model, parse_json_object(raw)))


def check_capacity(state: ServerState, num_requests: int = 1) -> None:
    """429 past the queue limit and 503 without an engine: a cheap refusal before any work.
    `submit` checks again, at the moment it registers the requests."""
    with engine_errors():
        state.engine.check_capacity(num_requests)


def submit(state: ServerState, adds: list[EngineRequest]) -> list[EngineStream]:
    """Register `adds` with the engine, all or none, and return their output streams."""
    with engine_errors():
        return state.engine.submit(adds)


@contextlib.contextmanager
def engine_errors() -> Iterator[None]:
    """The async engine's refusals as API errors: a full queue is 429, a dead engine 503."""
    try:
        yield
    except QueueFullError as error:
        raise APIError(
            429,
            f"{error}; retry after {error.retry_after_s} s",
            code="rate_limit_error",
            headers={"Retry-After": str(error.retry_after_s)},
        ) from None
    except EngineDeadError as error:
        raise APIError(503, str(error)) from None


def check_model(state: ServerState, model: str | None) -> None:
    """A missing `model` means the served one; any other name is a 404."""
    if model is not None and model != state.model_name:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {state.model_name!r}",
            param="model",
        )


async def admit(
    state: ServerState,
    request: GenerationRequest,
    request_ids: list[str],
    arrival_time: float,
    trace_context: object | None,
) -> AdmittedRequest:
    """Tokenize `request`, build its engine requests under `request_ids` (`num_candidates` per
    prompt) and validate them, the one time anything does; raises APIError on anything wrong."""
    check_model(state, request.model)
    defaults = state.sampling_defaults
    params = request.sampling_params(defaults)
    bounds = state.settings
    try:
        # Before any work: what a request may cost is checked on what it sent.
        bounds.check_stop_token_ids(params)
        if params.structured_output is not None:
            bounds.check_constraint(params.structured_output)
    except InvalidRequestError as error:
        raise request.invalid(error) from None
    validator = state.engine.validator
    max_model_len = validator.limits.max_model_len
    keep = request.kept_prompt_tokens(max_model_len, params.max_tokens)
    prompts = await _tokenize(state.tokenizer, request, max_model_len, keep)
    try:
        lengths = [len(prompt) for prompt in prompts]
        # Unset max_tokens runs to the context's end, unless the checkpoint's default cuts it.
        most = max_model_len - min(lengths)
        if defaults.max_tokens is not None:
            most = min(most, max(defaults.max_tokens, params.min_tokens))
        bounds.check_logprobs(params, lengths, request.num_candidates, most)
    except InvalidRequestError as error:
        raise request.invalid(error) from None
    thinks_first = _thinks_first(state, request, prompts[0])
    if thinks_first and params.structured_output is not None:
        # The grammar governs the answer: it starts past the end of the thinking.
        assert state.reasoning_parser is not None
        constraint = dataclasses.replace(
            params.structured_output, after_token_id=state.reasoning_parser.end_token_id
        )
        params = dataclasses.replace(params, structured_output=constraint)
    if params.structured_output is not None:
        # Compiling a new schema takes milliseconds to seconds: on the compile thread, never on
        # the loop or the step thread; a schema seen before comes from the compiler's cache.
        try:
            params = await compile_constraint(
                state.engine, params, bounds.grammar_compile_timeout_s
            )
        except InvalidRequestError as error:
            raise request.invalid(error) from None
    slo = request.slo_targets(SLO(state.settings.ttft_slo_ms, state.settings.tpot_slo_ms))
    ids = iter(request_ids)
    requests = []
    for token_ids in prompts:
        first = EngineRequest(
            next(ids), token_ids, params, request.priority, slo, arrival_time, trace_context
        )
        try:
            first = validator.validate(first, defaults.max_tokens)
        except InvalidRequestError as error:
            raise request.invalid(error) from None
        requests.append(first)
        # The other candidates differ from the first only in their seed, which no check reads,
        # and score no prompt: the first's prompt log-probabilities serve them all.
        shared = dataclasses.replace(first.sampling_params, prompt_logprobs=None)
        requests.extend(
            dataclasses.replace(first, request_id=next(ids), sampling_params=shared.for_choice(i))
            for i in range(1, request.num_candidates)
        )
    admitted = AdmittedRequest(requests, request.num_candidates, thinks_first)
    check_slo(state, admitted)
    return admitted


def _thinks_first(
    state: ServerState, request: GenerationRequest, prompt_token_ids: list[int]
) -> bool | None:
    parser = state.reasoning_parser
    if parser is None or not isinstance(request, ChatCompletionRequest):
        return None
    continued = request.messages[-1].content if request.continue_final_message else None
    return parser.thinks_first(
        state.tokenizer, prompt_token_ids, request.template_variables(), continued
    )


def start_trace(
    state: ServerState, request: GenerationRequest, traceparent: str | None
) -> object | None:
    """The trace context for `request`'s engine requests (continuing `traceparent`), or None
    when no spans are exported."""
    if state.tracing is None:
        return None
    operation = "chat" if isinstance(request, ChatCompletionRequest) else "text_completion"
    return state.tracing.start(operation, traceparent)


def check_slo(state: ServerState, request: AdmittedRequest) -> None:
    """With the `slo` policy, 429 for a request whose first token is predicted to come later
    than `--slo-admission-factor` times its TTFT target because of the queue ahead of it
    (it would fit its target on an idle engine), or that would make requests already accepted
    late (`Forecast.refuses`): better refused now, with a Retry-After of the predicted drain
    time, than accepted and failed late."""
    factor = state.engine.config.slo_admission_factor
    ttft_ms = request.slo.ttft_ms
    if factor <= 0 or ttft_ms is None or state.engine.config.scheduling_policy != "slo":
        return
    forecast = state.engine.forecast_ttft(request.num_prompt_tokens, ttft_ms)
    if not forecast.refuses(ttft_ms, factor):
        return
    retry_after = max(1, math.ceil(forecast.drain_s))
    if forecast.ttft_s > factor * ttft_ms / 1000:
        reason = f"its first token is predicted in {forecast.ttft_s * 1000:.0f} ms behind the queue"
    else:
        reason = f"serving it first would make {forecast.displaced} accepted requests miss theirs"
    raise APIError(
        429,
        f"the server cannot meet this request's TTFT target of {ttft_ms:g} ms: {reason}; "
        f"retry after {retry_after} s or send a looser slo.ttft_ms",
        code="rate_limit_error",
        headers={"Retry-After": str(retry_after)},
    )


def max_prompt_chars(tokenizer: Tokenizer, max_model_len: int) -> int:
    """More characters than this cannot fit the context: no token covers more characters than
    the longest in the vocabulary, and the factor 2 leaves room for normalizers that merge
    characters (NFC). Checked before tokenizing, so an oversized prompt costs nothing."""
    return 2 * max_model_len * tokenizer.max_token_chars


async def _tokenize(
    tokenizer: Tokenizer, request: GenerationRequest, max_model_len: int, keep: int | None
) -> list[list[int]]:
    """The prompts' token ids, each cut to its last `keep` (None: whole)."""
    encode, num_chars = _encoder(tokenizer, request)
    limit = max_prompt_chars(tokenizer, max_model_len)
    # A prompt to be truncated may be longer than the context; the body limit bounds it.
    if keep is None and num_chars > limit:
        raise APIError(
            400,
            f"the prompt has {num_chars} characters, more than the {limit} that could fit the "
            f"context length of {max_model_len} tokens; shorten it",
            param=request.field_name("prompt"),
            code=CONTEXT_LENGTH_EXCEEDED,
        )
    try:
        if num_chars > MAX_INLINE_TOKENIZE_CHARS:
            prompts = await _off_the_loop(encode)
        else:
            prompts = [one() for one in encode]
    except ChatTemplateError as error:
        raise APIError(400, str(error), param="messages") from None
    return prompts if keep is None else [prompt[-keep:] for prompt in prompts]


async def _off_the_loop(encode: list[Callable[[], list[int]]]) -> list[list[int]]:
    """Each prompt tokenized on a worker thread; once the caller is cancelled (its client left),
    the prompts not yet started are skipped."""
    abandoned = threading.Event()

    def run() -> list[list[int]]:
        prompts = []
        for one in encode:
            if abandoned.is_set():
                break
            prompts.append(one())
        return prompts

    try:
        return await asyncio.to_thread(run)
    except asyncio.CancelledError:
        abandoned.set()
        raise


def _encoder(
    tokenizer: Tokenizer, request: GenerationRequest
) -> tuple[list[Callable[[], list[int]]], int]:
    """The tokenizing work for `request`, one callable per prompt, and how many characters it
    reads."""
    if isinstance(request, ChatCompletionRequest):
        messages = request.message_dicts()
        variables = request.template_variables()
        num_chars = sum(len(str(value)) for m in messages for value in m.values())
        num_chars += len(str(variables)) if variables else 0
        opens, continues = request.add_generation_prompt, request.continue_final_message

        def chat() -> list[int]:
            return tokenizer.encode_chat(messages, opens, continues, **variables)

        return [chat], num_chars
    assert isinstance(request, CompletionRequest)
    prompts = request.prompts
    num_chars = sum(len(p) for p in prompts if isinstance(p, str))
    # Text gets the tokenizer's special tokens (BOS), as the offline API and OpenAI servers do.
    return [_prompt_encoder(tokenizer, p) for p in prompts], num_chars


def _prompt_encoder(tokenizer: Tokenizer, prompt: str | list[int]) -> Callable[[], list[int]]:
    if isinstance(prompt, str):
        return lambda: tokenizer.encode(prompt)
    return lambda: prompt
