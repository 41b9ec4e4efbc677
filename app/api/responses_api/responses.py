"""`POST /v1/responses`, OpenAI's Responses API: the request runs as one chat completion (its
template, admission, structured output and tool-call parsing) and its output is told as
Responses output items, answered whole or streamed as typed events."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from baton.app.api.reasoning import ReasoningStream
from baton.app.api.responses_api.responses_format import ResponseBuilder, sse_typed_event, usage
from baton.app.api.responses_api.responses_protocol import ResponsesRequest
from baton.app.api.streaming import (
    EventStreamResponse,
    admit_unless_gone,
    respond_unless_disconnected,
)
from baton.app.api.tools.tool_calls import ToolCallStream, tool_call_streams
from baton.app.engine.admission import (
    AdmittedRequest,
    admit,
    receive,
    start_trace,
    submit,
)
from baton.app.engine.client import EngineDeadError, EngineStream
from baton.app.errors import APIError, output_error
from baton.app.state import ServerState
from baton.core.outputs import RequestOutput
from baton.core.request import FinishReason


async def responses(request: Request) -> Response:
    received = await receive(request, ResponsesRequest)
    if received is None:
        return Response(status_code=499)  # gone before its body arrived: nobody to answer
    state, arrival_time, parsed = received.state, received.arrival_time, received.body
    chat = parsed.chat_request()
    tool_streams = tool_call_streams(chat, state.tokenizer, state.settings.tool_call_parser, 1)
    # OpenAI's response ids are `resp_` and hex; the lone engine request shares it.
    response_id = f"resp_{uuid.uuid4().hex}"
    trace_context = start_trace(state, chat, request.headers.get("traceparent"))
    # A client that leaves while its prompt tokenizes or its grammar compiles stops that work.
    admitted = await admit_unless_gone(
        request, state, admit(state, chat, [response_id], arrival_time, trace_context)
    )
    if admitted is None:
        return Response(status_code=499)
    tool_stream = tool_streams[0] if tool_streams else None
    generation = ResponseGeneration(state, parsed, admitted, response_id, tool_stream)
    generation.open()
    if parsed.stream:
        return EventStreamResponse(generation.events(), generation.close)
    return await respond_unless_disconnected(request, generation)


class ResponseGeneration:
    """One Responses request's engine request, and the output items made from its text."""

    def __init__(
        self,
        state: ServerState,
        request: ResponsesRequest,
        admitted: AdmittedRequest,
        response_id: str,
        tool_stream: ToolCallStream | None,
    ) -> None:
        self.state = state
        self.admitted = admitted
        self.builder = ResponseBuilder(response_id, state.model_name, request_echo(request))
        self.tool_stream = tool_stream
        # With --reasoning-parser, the thinking becomes a reasoning item before the message.
        self.reasoning: ReasoningStream | None = None
        if admitted.thinks_first is not None:
            assert state.reasoning_parser is not None
            form = state.reasoning_parser.format
            self.reasoning = ReasoningStream(form, admitted.thinks_first)
        self.streams: list[EngineStream] = []

    def open(self) -> None:
        """Register the engine request; from here on `close()` must be called."""
        self.streams = submit(self.state, self.admitted.requests)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    async def events(self) -> AsyncIterator[bytes]:
        """The typed event stream, from `response.created` to `response.completed` (or
        `response.incomplete`, or `response.failed` when the engine fails it)."""
        for event in self.builder.opening():
            yield sse_typed_event(event)
        try:
            async with contextlib.aclosing(self.streams[0]) as outputs:
                async for output in outputs:
                    if (error := output_error(output)) is not None:
                        raise error
                    for event in self._feed(output):
                        yield sse_typed_event(event)
        except APIError as error:
            yield sse_typed_event(self._failed(error))
        except EngineDeadError as error:
            yield sse_typed_event(self._failed(APIError(503, str(error))))

    async def collect(self) -> dict[str, Any]:
        """The whole response object; raises APIError if the request failed."""
        final: dict[str, Any] = {}
        try:
            async with contextlib.aclosing(self.streams[0]) as outputs:
                async for output in outputs:
                    if (error := output_error(output)) is not None:
                        raise error
                    events = self._feed(output)
                    if output.finished:
                        final = events[-1]["response"]
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        return final

    def _feed(self, output: RequestOutput) -> list[dict[str, Any]]:
        """The events one engine output makes; the final output's end with the response."""
        text = output.new_text
        builder = self.builder
        events = []
        if self.reasoning is not None:
            reasoning, text = self.reasoning.feed(text)
            if output.finished:
                reasoning += self.reasoning.finish()[0]
            events += builder.add_text("reasoning", reasoning)
        calls: list[dict[str, Any]] = []
        if self.tool_stream is not None:
            text, calls = self.tool_stream.feed(text)
            if output.finished:
                rest, more_calls = self.tool_stream.finish()
                text, calls = text + rest, calls + more_calls
        events += builder.add_text("message", text)
        events += builder.add_call_deltas(calls)
        if output.finished:
            events += self._finish(output)
        return events

    def _finish(self, output: RequestOutput) -> list[dict[str, Any]]:
        cut = output.finish_reason is FinishReason.LENGTH
        events = self.builder.close("incomplete" if cut else "completed")
        cached = output.timing.cached_prompt_tokens if output.timing is not None else 0
        counts = usage(self.admitted.num_prompt_tokens, output.num_output_tokens, cached)
        if cut:
            # OpenAI names the limit; a context filled up before max_output_tokens is the same
            # limit reached sooner (admission caps max_tokens by the room left).
            final = self.builder.response("incomplete", counts, "max_output_tokens")
            return [*events, self.builder.event("response.incomplete", response=final)]
        final = self.builder.response("completed", counts)
        return [*events, self.builder.event("response.completed", response=final)]

    def _failed(self, error: APIError) -> dict[str, Any]:
        code = "rate_limit_exceeded" if error.status == 429 else "server_error"
        final = self.builder.response("failed", error={"code": code, "message": error.message})
        return self.builder.event("response.failed", response=final)


def request_echo(request: ResponsesRequest) -> dict[str, Any]:
    """The request's settings that every response object repeats."""
    tool_choice = request.tool_choice or "auto"
    text_format = request.text.format if request.text is not None else None
    return {
        "instructions": request.instructions,
        "metadata": request.metadata or {},
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_output_tokens": request.max_output_tokens,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "text": {
            "format": {"type": "text"}
            if text_format is None
            else text_format.model_dump(by_alias=True, exclude_none=True)
        },
        "reasoning": None if request.reasoning is None else request.reasoning.model_dump(),
        "previous_response_id": None,
        # Baton keeps no responses, whatever `store` asked.
        "store": False,
        "truncation": "disabled",
        "user": request.user,
    }
