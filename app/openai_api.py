"""OpenAI-compatible `POST /v1/completions` and `POST /v1/chat/completions`, streamed over SSE
or answered whole.

Each prompt of a request is its own engine request, generated concurrently; a client that hangs
up, mid-stream or while waiting for a whole response, aborts all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.admission import AdmittedRequest, admit, check_capacity, submit
from app.async_engine import EngineDeadError, EngineStream
from app.errors import APIError
from app.openai_format import (
    DONE_EVENT,
    ChatFormat,
    CompletionFormat,
    Envelope,
    ResponseFormat,
    sse_event,
    timing,
    usage,
)
from app.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    parse_json_object,
    validate_request,
)
from app.state import ServerState, server_state
from app.tool_calls import ToolCallStream, tool_call_streams
from core.outputs import RequestOutput
from core.request import FinishReason


async def completions(request: Request) -> Response:
    return await _serve(request, CompletionRequest, CompletionFormat)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, ChatCompletionRequest, ChatFormat)


async def _serve(
    request: Request, model: type[GenerationRequest], format_class: type[ResponseFormat]
) -> Response:
    state = server_state(request)
    # On the engine's clock, so queue time and TTFT count parsing and tokenizing too.
    arrival_time = state.engine.clock()
    check_capacity(state)
    try:
        body = await request.body()
    except ClientDisconnect:
        return Response(status_code=499)  # gone before its body arrived: nobody to answer
    parsed = validate_request(model, parse_json_object(body))
    if isinstance(parsed, CompletionRequest):
        # Each prompt is an engine request: refuse what cannot fit before tokenizing any.
        check_capacity(state, len(parsed.prompts))
    num_choices = len(parsed.prompts) if isinstance(parsed, CompletionRequest) else 1
    tool_streams = tool_call_streams(
        parsed, state.tokenizer, state.settings.tool_call_parser, num_choices
    )
    admitted = await admit(state, parsed)
    generation = Generation(state, parsed, admitted, format_class(state.tokenizer), tool_streams)
    generation.open(arrival_time, request.headers.get("traceparent"))
    if parsed.stream:
        return EventStreamResponse(generation.events(), generation.close)
    return await _respond_unless_disconnected(request, generation)


class EventStreamResponse(StreamingResponse):
    """An SSE response that closes its engine streams however the response ends (finished, or
    the client hung up before or during the stream), so nothing is left running for nobody."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], close: Callable[[], None]) -> None:
        # no-cache and X-Accel-Buffering keep proxies from holding tokens back.
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._close()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _respond_unless_disconnected(request: Request, generation: Generation) -> Response:
    work = asyncio.ensure_future(generation.collect())
    hangup = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, hangup}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        generation.close()
        hangup.cancel()
        # Cancelling the collection closes the engine streams, which aborts their requests.
        work.cancel()
        await asyncio.gather(work, hangup, return_exceptions=True)
    if work.cancelled():
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    return Response(orjson.dumps(work.result()), media_type="application/json")


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next message is the hang-up (or the response's end).
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass(slots=True)
class ChoiceText:
    """What one choice of a whole (non-streamed) response has gathered so far."""

    pieces: list[str] = field(default_factory=list)
    num_chars: int = 0
    logprobs: list[dict] = field(default_factory=list)
    final: RequestOutput | None = None


class Generation:
    """One API request's engine requests and the OpenAI objects made from their outputs."""

    def __init__(
        self,
        state: ServerState,
        request: GenerationRequest,
        admitted: AdmittedRequest,
        response_format: ResponseFormat,
        tool_streams: list[ToolCallStream] | None = None,
    ) -> None:
        self.state = state
        # With tools, each choice's text goes through its stream into content and tool calls.
        self.tool_streams = tool_streams
        self.request = request
        self.admitted = admitted
        self.format = response_format
        response_id = state.next_request_id(response_format.id_prefix)
        self.envelope = Envelope(response_id, int(time.time()), state.model_name)
        self.streams: list[EngineStream] = []
        # Final outputs in the order their requests finished: usage and `timing` come from here.
        self._finished: list[RequestOutput] = []

    def open(self, arrival_time: float, traceparent: str | None) -> None:
        """Register the engine requests (raises APIError when the server is full); from here
        on `close()` must be called, which aborts whichever have not finished."""
        num_prompts = len(self.admitted.prompts)
        # A lone prompt's engine request shares the response's id, so logs and traces match.
        ids = [f"{self.envelope.id}-{index}" for index in range(num_prompts)]
        if num_prompts == 1:
            ids = [self.envelope.id]
        trace_context = None
        if self.state.tracing is not None:
            operation = (
                "chat" if isinstance(self.request, ChatCompletionRequest) else "text_completion"
            )
            trace_context = self.state.tracing.start(operation, traceparent)
        adds = self.admitted.engine_requests(ids, arrival_time, trace_context)
        self.streams = submit(self.state, adds)

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE stream: opening deltas, one chunk per delta, usage, then `[DONE]`."""
        chunk_name = self.format.chunk_object_name
        for choice in self.format.opening_choices(len(self.admitted.prompts)):
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

    async def _delta_events(self) -> AsyncIterator[bytes]:
        num_chars = [0] * len(self.admitted.prompts)
        async with contextlib.aclosing(merge_streams(self.streams)) as outputs:
            async for index, output in outputs:
                if output.finish_reason is FinishReason.ERROR:
                    raise _StreamFailed(_failed(output))
                chunk = self._chunk(index, output, num_chars[index])
                num_chars[index] += len(output.new_text)
                if chunk is not None:
                    yield sse_event(chunk)

    def _chunk(self, index: int, output: RequestOutput, num_chars: int) -> dict[str, Any] | None:
        logprobs = self.format.logprobs(output.logprobs, num_chars) if output.logprobs else None
        text, tool_calls, reason = output.new_text, [], _reason(output)
        if self.tool_streams is not None:
            stream = self.tool_streams[index]
            text, tool_calls = stream.feed(output.new_text)
            if output.finished:
                rest, more_calls = stream.finish()
                text, tool_calls = text + rest, tool_calls + more_calls
            reason = stream.finish_reason(reason)
        if not output.finished and not text and not tool_calls and logprobs is None:
            return None  # text held back (a possible stop string or tool call, a split char)
        choice = self.format.delta_choice(index, text, reason, logprobs, tool_calls or None)
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

    async def collect(self) -> dict[str, Any]:
        """The whole response; raises APIError if a request failed or the engine died."""
        choices = [ChoiceText() for _ in self.admitted.prompts]
        try:
            async with contextlib.aclosing(merge_streams(self.streams)) as outputs:
                async for index, output in outputs:
                    if output.finish_reason is FinishReason.ERROR:
                        raise _failed(output)
                    _gather(choices[index], output, self.format)
                    if output.finished:
                        self._finished.append(output)
        except EngineDeadError as error:
            raise APIError(503, str(error)) from None
        return self.envelope.wrap(
            self.format.object_name,
            choices=[self._final_choice(index, choice) for index, choice in enumerate(choices)],
            usage=self._usage(),
            timing=self._timing(self._finished[-1]),
        )

    def _final_choice(self, index: int, choice: ChoiceText) -> dict[str, Any]:
        logprobs = self.format.merge_logprobs(choice.logprobs) if choice.logprobs else None
        reason = _reason(choice.final) if choice.final is not None else None
        text = "".join(choice.pieces)
        if self.tool_streams is None:
            return self.format.final_choice(index, text, reason, logprobs)
        stream = self.tool_streams[index]
        stream.feed(text)
        stream.finish()
        return self.format.final_choice(
            index, text, stream.finish_reason(reason), logprobs, stream.message_fields()
        )


def _gather(choice: ChoiceText, output: RequestOutput, response_format: ResponseFormat) -> None:
    if output.logprobs:
        choice.logprobs.append(response_format.logprobs(output.logprobs, choice.num_chars))
    choice.pieces.append(output.new_text)
    choice.num_chars += len(output.new_text)
    if output.finished:
        choice.final = output


async def merge_streams(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several engine streams as their outputs arrive, tagged with their index.
    Closing the merged stream closes (and so aborts) every stream still running."""
    if len(streams) == 1:
        # The common case, without a task per stream.
        async with contextlib.aclosing(streams[0]) as stream:
            async for output in stream:
                yield 0, output
        return
    arrivals: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(i, s, arrivals)) for i, s in enumerate(streams)]
    try:
        running = len(pumps)
        while running:
            index, item = await arrivals.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(
    index: int,
    stream: AsyncIterator[RequestOutput],
    arrivals: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]],
) -> None:
    try:
        async with contextlib.aclosing(stream):
            async for output in stream:
                arrivals.put_nowait((index, output))
    except Exception as error:
        arrivals.put_nowait((index, error))
    arrivals.put_nowait((index, None))


class _StreamFailed(Exception):
    """A request failed in the engine after its stream had started."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


def _reason(output: RequestOutput) -> str | None:
    return output.finish_reason.value if output.finish_reason is not None else None


def _failed(output: RequestOutput) -> APIError:
    return APIError(500, output.error or "the request failed inside the engine")
