"""OpenAI-compatible `POST /v1/completions` and `POST /v1/chat/completions`, streamed over SSE
or answered whole.

Each choice of each prompt (`n`, or `best_of` candidates) is its own engine request, generated
concurrently; a client that hangs up, mid-stream or while waiting for a whole response, aborts
all of them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.choices import ChoiceText, Echo, best_choices, shared_prompt_scores
from baton.app.api.completion_protocol import CompletionRequest
from baton.app.api.openai_format import (
    DONE_EVENT,
    ChatFormat,
    CompletionFormat,
    Envelope,
    ResponseFormat,
    sse_event,
    timing,
    usage,
)
from baton.app.api.protocol import GenerationRequest
from baton.app.api.reasoning import ReasoningStream
from baton.app.api.streaming import (
    EventStreamResponse,
    admit_unless_gone,
    merge_streams,
    respond_unless_disconnected,
)
from baton.app.api.tools.tool_calls import ToolCallStream, tool_call_streams
from baton.app.engine.admission import (
    AdmittedRequest,
    admit,
    check_capacity,
    receive,
    start_trace,
    submit,
)
from baton.app.engine.client import EngineDeadError, EngineStream
from baton.app.errors import APIError, output_error
from baton.app.state import ServerState
from baton.core.batch import TokenLogprobs
from baton.core.outputs import RequestOutput


async def completions(request: Request) -> Response:
    return await _serve(request, CompletionRequest, CompletionFormat)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, ChatCompletionRequest, ChatFormat)


async def _serve(
    request: Request, model: type[GenerationRequest], format_class: type[ResponseFormat]
) -> Response:
    received = await receive(request, model)
    if received is None:
        return Response(status_code=499)  # gone before its body arrived: nobody to answer
    state, arrival_time, parsed = received.state, received.arrival_time, received.body
    prompts = len(parsed.prompts) if isinstance(parsed, CompletionRequest) else 1
    # Each candidate of each prompt is an engine request: refuse what cannot fit before
    # tokenizing any.
    num_requests = prompts * parsed.num_candidates
    check_capacity(state, num_requests)
    tool_streams = tool_call_streams(
        parsed, state.tokenizer, state.settings.tool_call_parser, num_requests
    )
    response_id = state.next_request_id(format_class.id_prefix)
    trace_context = start_trace(state, parsed, request.headers.get("traceparent"))
    request_ids = engine_request_ids(response_id, num_requests)
    # A client that leaves while its prompt tokenizes or its grammar compiles stops that work.
    admitted = await admit_unless_gone(
        request, state, admit(state, parsed, request_ids, arrival_time, trace_context)
    )
    if admitted is None:
        return Response(status_code=499)
    response_format = format_class(state.tokenizer)
    generation = Generation(state, parsed, admitted, response_format, response_id, tool_streams)
    generation.open()
    if parsed.stream:
        return EventStreamResponse(generation.events(), generation.close)
    return await respond_unless_disconnected(request, generation)


def engine_request_ids(response_id: str, num_requests: int) -> list[str]:
    """A lone engine request shares the response's id, so logs and traces match; several are
    numbered after it."""
    if num_requests == 1:
        return [response_id]
    return [f"{response_id}-{index}" for index in range(num_requests)]


class Generation:
    """One API request's engine requests and the OpenAI objects made from their outputs."""

    def __init__(
        self,
        state: ServerState,
        request: GenerationRequest,
        admitted: AdmittedRequest,
        response_format: ResponseFormat,
        response_id: str,
        tool_streams: list[ToolCallStream] | None = None,
    ) -> None:
        self.state = state
        # With tools, each choice's text goes through its stream into content and tool calls.
        self.tool_streams = tool_streams
        self.request = request
        self.admitted = admitted
        self.format = response_format
        self.envelope = Envelope(response_id, int(time.time()), state.model_name)
        self.streams: list[EngineStream] = []
        # Final outputs in the order their requests finished: usage and `timing` come from here.
        self._finished: list[RequestOutput] = []
        # Per engine request (prompt by prompt, `num_candidates` each): the prompt it echoes.
        self.echoes: list[Echo | None] = [None] * len(admitted.requests)
        if isinstance(request, CompletionRequest) and request.echo:
            # A truncated prompt echoes what the model was given: its kept tokens.
            sent = admitted.prompts if request.truncate_prompt_tokens else request.prompts
            self.echoes = [
                Echo.of(prompt, token_ids, response_format.tokenizer)
                for prompt, token_ids in zip(sent, admitted.prompts, strict=True)
                for _ in range(admitted.num_candidates)
            ]
        self.shows_logprobs = request.shows_logprobs
        # Chat only: the last (assistant) message repeated before the answer (`echo`), and
        # with --reasoning-parser each choice's thinking split off its answer.
        self.chat_echo = request.echo_text() if isinstance(request, ChatCompletionRequest) else ""
        self.reasoning_streams: list[ReasoningStream] | None = None
        if admitted.thinks_first is not None:
            assert state.reasoning_parser is not None
            form = state.reasoning_parser.format
            self.reasoning_streams = [
                ReasoningStream(form, admitted.thinks_first) for _ in admitted.requests
            ]

    def open(self) -> None:
        """Register the engine requests (raises APIError when the server is full); from here
        on `close()` must be called, which aborts whichever have not finished."""
        self.streams = submit(self.state, self.admitted.requests)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE stream: opening deltas, one chunk per delta, usage, then `[DONE]`."""
        chunk_name = self.format.chunk_object_name
        # Streams are refused when best_of exceeds n: each engine request is one choice.
        for choice in self.format.opening_choices(len(self.streams)):
            if self.chat_echo:
                choice["delta"]["content"] = self.chat_echo
            yield sse_event(self.envelope.wrap(chunk_name, choices=[choice]))
        try:
            async for event in self._delta_events():
                yield event
        except _StreamFailed as failure:
            yield sse_event(failure.error.body())
        except EngineDeadError as error:
            yield sse_event(APIError(503, str(error)).body())
        else:
            if self.request.include_usage:
                yield sse_event(self._usage_chunk())
        yield DONE_EVENT

    def _outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Every engine request's outputs as they arrive, tagged with its index; where a
        prompt's candidates share its scores, each gets them with its first output."""
        outputs = merge_streams(self.streams)
        num_candidates = self.admitted.num_candidates
        if num_candidates == 1 or self.request.requested_prompt_logprobs() is None:
            return outputs
        return shared_prompt_scores(outputs, num_candidates)

    async def _delta_events(self) -> AsyncIterator[bytes]:
        # Where each choice's next text starts: after its echoed prompt, if any.
        num_chars = [0 if echo is None else len(echo.text) for echo in self.echoes]
        started = [False] * len(self.streams)
        async with contextlib.aclosing(self._outputs()) as outputs:
            async for index, output in outputs:
                if (error := output_error(output)) is not None:
                    raise _StreamFailed(error)
                chunk = self._chunk(index, output, num_chars[index], not started[index])
                started[index] = True
                num_chars[index] += len(output.new_text)
                if chunk is not None:
                    yield sse_event(chunk)

    def _chunk(
        self, index: int, output: RequestOutput, num_chars: int, opening: bool
    ) -> dict[str, Any] | None:
        """One choice's chunk; its `opening` one starts with the echoed prompt, if any."""
        echo = self.echoes[index] if opening else None
        text, tool_calls, reason = output.new_text, [], _reason(output)
        logprobs = None
        if self.shows_logprobs and output.logprobs:
            logprobs = self.format.logprobs(output.logprobs, num_chars)
        if echo is not None:
            text = echo.text + text
            if self.shows_logprobs:
                assert isinstance(self.format, CompletionFormat)
                parts = [self.format.echo_logprobs(echo.token_ids, output.prompt_logprobs)]
                logprobs = self.format.merge_logprobs(parts + ([logprobs] if logprobs else []))
        reasoning = ""
        if self.reasoning_streams is not None:
            split = self.reasoning_streams[index]
            reasoning, text = split.feed(text)
            if output.finished:
                reasoning += split.finish()[0]
        if self.tool_streams is not None:
            stream = self.tool_streams[index]
            text, tool_calls = stream.feed(text)
            if output.finished:
                rest, more_calls = stream.finish()
                text, tool_calls = text + rest, tool_calls + more_calls
            reason = stream.finish_reason(reason)
        held = not text and not tool_calls and not reasoning and logprobs is None
        if held and not output.finished:
            return None  # held back: a possible stop string, tag or tool call, a split char
        choice = self.format.delta_choice(
            index, text, reason, logprobs, tool_calls or None, reasoning
        )
        prompt_logprobs = self._prompt_logprobs_field(output.prompt_logprobs)
        if prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs
        chunk = self.envelope.wrap(self.format.chunk_object_name, choices=[choice])
        if output.finished:
            self._finished.append(output)
            chunk["timing"] = self._timing(output)
        return chunk

    def _usage_chunk(self) -> dict[str, Any]:
        return self.envelope.wrap(
            self.format.chunk_object_name,
            choices=[],
            usage=self._usage(),
            timing=self._timing(self._finished[-1]),
        )

    def _timing(self, output: RequestOutput) -> dict[str, Any] | None:
        token_times = output.token_times if self.request.return_token_timestamps else None
        return timing(output.timing, token_times)

    def _usage(self) -> dict[str, int]:
        completion_tokens = sum(output.num_output_tokens for output in self._finished)
        return usage(self.admitted.num_prompt_tokens, completion_tokens)

    def _prompt_logprobs_field(
        self, entries: list[TokenLogprobs | None] | None
    ) -> list[dict | None] | None:
        """vLLM's `prompt_logprobs` choice field, where the request asked for it."""
        request = self.request
        if (
            entries is None
            or not isinstance(request, CompletionRequest)
            or request.prompt_logprobs is None
        ):
            return None
        assert isinstance(self.format, CompletionFormat)
        return self.format.prompt_logprobs(entries)

    async def collect(self) -> dict[str, Any]:
        """The whole response; raises APIError if a request failed or the engine died."""
        choices = [ChoiceText() for _ in self.streams]
        for choice, echo in zip(choices, self.echoes, strict=True):
            if echo is not None:
                choice.add_text(echo.text)
        try:
            async with contextlib.aclosing(self._outputs()) as outputs:
                async for index, output in outputs:
                    if (error := output_error(output)) is not None:
                        raise error
                    self._gather(index, choices[index], output)
                    if output.finished:
                        self._finished.append(output)
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        picked = choices
        if self.admitted.num_candidates > self.request.num_choices:
            picked = best_choices(choices, self.admitted.num_candidates, self.request.num_choices)
        return self.envelope.wrap(
            self.format.object_name,
            choices=[self._final_choice(index, choice) for index, choice in enumerate(picked)],
            usage=self._usage(),
            timing=self._timing(self._finished[-1]),
        )

    def _gather(self, index: int, choice: ChoiceText, output: RequestOutput) -> None:
        echo = self.echoes[index]
        # Echo with logprobs asks for the prompt's, which come with the first output.
        if output.prompt_logprobs is not None:
            if echo is not None and self.shows_logprobs:
                assert isinstance(self.format, CompletionFormat)
                prompt_part = self.format.echo_logprobs(echo.token_ids, output.prompt_logprobs)
                choice.logprobs.insert(0, prompt_part)
            choice.prompt_logprobs = self._prompt_logprobs_field(output.prompt_logprobs)
        choice.add_logprobs(output)
        if output.logprobs and self.shows_logprobs:
            choice.logprobs.append(self.format.logprobs(output.logprobs, choice.num_chars))
        choice.add_text(output.new_text)
        if output.finished:
            choice.final = output

    def _final_choice(self, index: int, choice: ChoiceText) -> dict[str, Any]:
        logprobs = self.format.merge_logprobs(choice.logprobs) if choice.logprobs else None
        reason = _reason(choice.final) if choice.final is not None else None
        text = "".join(choice.pieces)
        fields: dict[str, Any] = {}
        if self.reasoning_streams is not None:
            split = self.reasoning_streams[index]
            split.feed(text)
            split.finish()
            fields, text = split.message_fields(), split.content
        if self.tool_streams is not None:
            stream = self.tool_streams[index]
            stream.feed(text)
            stream.finish()
            reason = stream.finish_reason(reason)
            fields = {**fields, **stream.message_fields()}
        if self.chat_echo:
            fields["content"] = self.chat_echo + (fields.get("content", text) or "")
        body = self.format.final_choice(index, text, reason, logprobs, fields or None)
        if choice.prompt_logprobs is not None:
            body["prompt_logprobs"] = choice.prompt_logprobs
        return body


class _StreamFailed(Exception):
    """A request failed in the engine after its stream had started."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def _reason(output: RequestOutput) -> str | None:
    return output.finish_reason.value if output.finish_reason is not None else None
