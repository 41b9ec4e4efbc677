"""The WebSocket protocol at `/v1/ws`: many generate requests multiplexed on one socket, one
task each; the frames are listed in docs/architecture.md (Serving, Routes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketDisconnected

from baton.app.api.body_fields import MAX_NAME_CHARS
from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.completion_protocol import CompletionRequest
from baton.app.api.openai_format import timing, usage
from baton.app.api.protocol import GenerationRequest, json_type, parse_json_object, validate_request
from baton.app.api.tools.tool_calls import ToolCallStream, tool_call_streams
from baton.app.engine.admission import (
    AdmittedRequest,
    admit,
    check_capacity,
    start_trace,
    submit,
)
from baton.app.engine.client import EngineDeadError
from baton.app.errors import APIError, output_error
from baton.app.state import ServerState, server_metrics, server_state
from baton.core.outputs import RequestOutput

logger = logging.getLogger("baton.websocket")

ClientId = str | int


async def websocket_endpoint(websocket: WebSocket) -> None:
    await websocket.accept()
    session = Session(websocket, server_state(websocket))
    try:
        await session.serve()
    finally:
        await session.close()


@dataclass(slots=True)
class InFlight:
    client_id: ClientId
    engine_id: str
    task: asyncio.Task | None = None
    cancelled: bool = False
    num_token_frames: int = 0
    token_timestamps: bool = False
    # With tools: token frames carry the raw text, the done frame the calls parsed from it.
    tool_stream: ToolCallStream | None = None


class Session:
    """One socket: reads frames, runs one task per generate request, writes frames whole."""

    def __init__(self, websocket: WebSocket, state: ServerState) -> None:
        self.websocket = websocket
        self.state = state
        # Engine request ids must be unique across sockets; client ids are only per socket.
        self._engine_id_prefix = state.next_request_id("ws")
        self._engine_ids = itertools.count()
        self._requests: dict[ClientId, InFlight] = {}
        self._send_lock = asyncio.Lock()
        self._closed = False

    async def serve(self) -> None:
        """Read frames until the client goes away."""
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            # Binary frames holding UTF-8 JSON are read too: some clients send bytes as binary.
            data = message.get("text") or message.get("bytes") or b""
            try:
                self._handle(parse_json_object(data, "the frame"))
            except APIError as error:
                await self._send_error(None, error)
            except FrameError as error:
                await self._send_error(error.client_id, error.api_error)

    async def close(self) -> None:
        """Abort every request of this socket: their streams close, which aborts them."""
        self._closed = True
        tasks = [r.task for r in self._requests.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _handle(self, frame: dict[str, Any]) -> None:
        client_id = _client_id(frame)
        kind = frame.get("type")
        if kind not in ("generate", "cancel"):
            shown = repr(kind) if isinstance(kind, str) and len(kind) <= 16 else json_type(kind)
            raise FrameError(client_id, f"type must be 'generate' or 'cancel', got {shown}", "type")
        if client_id is None:
            raise FrameError(
                None,
                f"the frame needs an id: a string of at most {MAX_NAME_CHARS} characters or a "
                "64-bit integer",
                "id",
            )
        if kind == "cancel":
            self._cancel(client_id)
        elif client_id in self._requests:
            raise FrameError(
                client_id, f"id {client_id!r} is already in flight; use a new id", "id"
            )
        else:
            self._start(client_id, frame)

    def _start(self, client_id: ClientId, frame: dict[str, Any]) -> None:
        engine_id = f"{self._engine_id_prefix}-{next(self._engine_ids)}"
        record = InFlight(client_id, engine_id)
        self._requests[client_id] = record
        record.task = asyncio.ensure_future(self._run(record, frame))

    def _cancel(self, client_id: ClientId) -> None:
        record = self._requests.get(client_id)
        if record is not None:
            record.cancelled = True
            # The engine answers with a final output, so the client still gets `done`.
            self.state.engine.abort(record.engine_id)

    async def _run(self, record: InFlight, frame: dict[str, Any]) -> None:
        try:
            await self._generate(record, frame)
        except APIError as error:
            if error.status == 429:
                server_metrics(self.websocket).count_rejection()
            await self._send_error(record.client_id, error)
        except EngineDeadError as error:
            await self._send_error(record.client_id, APIError(503, str(error)))
        except WebSocketDisconnect:
            pass  # the reader sees the close as well and ends the session
        except Exception:
            logger.exception("WebSocket request %s failed", record.engine_id)
            failure = APIError(500, "internal server error; the request was not completed")
            await self._send_error(record.client_id, failure)
        finally:
            del self._requests[record.client_id]

    async def _generate(self, record: InFlight, frame: dict[str, Any]) -> None:
        arrival_time = self.state.engine.clock()
        check_capacity(self.state)
        request = _validate_generate(frame)
        record.token_timestamps = request.return_token_timestamps
        streams = tool_call_streams(
            request, self.state.tokenizer, self.state.settings.tool_call_parser, 1
        )
        record.tool_stream = streams[0] if streams else None
        # A frame's own traceparent wins over the one the socket was opened with.
        traceparent = frame.get("traceparent") or self.websocket.headers.get("traceparent")
        trace_context = start_trace(self.state, request, traceparent)
        admitted = await admit(self.state, request, [record.engine_id], arrival_time, trace_context)
        (stream,) = submit(self.state, admitted.requests)
        if record.cancelled:
            # Cancelled while being admitted: the engine answers the abort with a final output.
            self.state.engine.abort(record.engine_id)
        async with contextlib.aclosing(stream):
            async for output in stream:
                await self._deliver(record, output, admitted)

    async def _deliver(
        self, record: InFlight, output: RequestOutput, admitted: AdmittedRequest
    ) -> None:
        client_id = record.client_id
        if (error := output_error(output)) is not None:
            raise error
        if record.tool_stream is not None:
            record.tool_stream.feed(output.new_text)
        if output.new_text:
            frame = {
                "type": "token",
                "id": client_id,
                "text": output.new_text,
                "index": record.num_token_frames,
            }
            record.num_token_frames += 1
            await self._send(frame)
        if output.finished:
            reason = output.finish_reason.value if output.finish_reason is not None else None
            calls = None
            if record.tool_stream is not None:
                record.tool_stream.finish()
                reason = record.tool_stream.finish_reason(reason)
                calls = record.tool_stream.message_fields().get("tool_calls")
            done = {
                "type": "done",
                "id": client_id,
                "finish_reason": reason,
                **({"tool_calls": calls} if calls else {}),
                "usage": usage(admitted.num_prompt_tokens, output.num_output_tokens),
                "timing": timing(
                    output.timing, output.token_times if record.token_timestamps else None
                ),
            }
            await self._send(done)

    async def _send(self, frame: dict[str, Any]) -> None:
        if self._closed:
            return
        # One writer at a time: a frame waiting on flow control must not let another overtake
        # it halfway through the ASGI send.
        async with self._send_lock:
            try:
                await self.websocket.send_text(orjson.dumps(frame).decode())
            except WebSocketDisconnected:
                # The connection dropped without a close frame: read as the client leaving.
                self._closed = True
                raise WebSocketDisconnect(1006) from None

    async def _send_error(self, client_id: ClientId | None, error: APIError) -> None:
        with contextlib.suppress(WebSocketDisconnect):
            await self._send({"type": "error", "id": client_id, **error.body()})


class FrameError(Exception):
    """A frame the session cannot act on; answered with an error frame."""

    def __init__(self, client_id: ClientId | None, message: str, param: str) -> None:
        super().__init__(message)
        self.client_id = client_id
        self.api_error = APIError(400, message, param=param)


def _client_id(frame: dict[str, Any]) -> ClientId | None:
    """The frame's id if it is one the server may echo: a bounded string or a 64-bit integer
    (an id is sent back in every frame of its request, so its size must not multiply)."""
    client_id = frame.get("id")
    if isinstance(client_id, str) and len(client_id) <= MAX_NAME_CHARS:
        return client_id
    if isinstance(client_id, int) and not isinstance(client_id, bool):
        return client_id if -(2**63) <= client_id < 2**63 else None
    return None


# Keys of a generate frame that belong to the socket protocol, not to the request body.
FRAME_KEYS = ("type", "id", "traceparent")


def _validate_generate(frame: dict[str, Any]) -> GenerationRequest:
    if ("prompt" in frame) == ("messages" in frame):
        raise APIError(400, "a generate frame needs either prompt or messages (not both)")
    traceparent = frame.get("traceparent")
    if traceparent is not None and (
        not isinstance(traceparent, str) or len(traceparent) > MAX_NAME_CHARS
    ):
        raise APIError(400, "traceparent must be a W3C traceparent string", param="traceparent")
    body = {key: value for key, value in frame.items() if key not in FRAME_KEYS}
    if "messages" in body:
        return _one_choice(validate_request(ChatCompletionRequest, body))
    request = _one_choice(validate_request(CompletionRequest, body))
    assert isinstance(request, CompletionRequest)
    if len(request.prompts) > 1:
        raise APIError(
            400, "a generate frame takes one prompt; send one frame per prompt", param="prompt"
        )
    return request


def _one_choice(request: GenerationRequest) -> GenerationRequest:
    """A frame streams one choice: `n`, `best_of` and `echo` are for the HTTP API."""
    if request.num_candidates > 1:
        param = "n" if request.num_choices > 1 else "best_of"
        raise APIError(
            400,
            f"a generate frame streams one choice; send {param} 1 or one frame per choice",
            param=param,
        )
    if request.echo:
        raise APIError(400, "echo is for the HTTP API; leave it out of frames", param="echo")
    return request
