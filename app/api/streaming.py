"""How a route sends what the engine streams: an SSE response that closes its engine streams
however it ends, a whole answer abandoned when its client hangs up, and several engine streams
merged into one as their outputs arrive."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from baton.app.errors import APIError
from baton.core.outputs import RequestOutput

if TYPE_CHECKING:
    from baton.app.state import ServerState

T = TypeVar("T")


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


class WholeResponse(Protocol):
    """A generation answered as one JSON object (chat, completions, responses)."""

    async def collect(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


async def respond_unless_disconnected(request: Request, generation: WholeResponse) -> Response:
    try:
        body = await unless_disconnected(request, generation.collect())
    finally:
        generation.close()
    if body is None:
        return Response(status_code=499)  # nobody is listening; nginx's "client closed request"
    return Response(orjson.dumps(body), media_type="application/json")


async def unless_disconnected(
    request: Request, work: Awaitable[T], stopping: asyncio.Event | None = None
) -> T | None:
    """`work`'s result, or None when the client hangs up first: `work` is then cancelled, which
    closes its engine streams and so aborts their requests, rather than computing for nobody.
    With `stopping`, the work is also cancelled once that is set, and the client gets a 503."""
    task = asyncio.ensure_future(work)
    waiters = {task, asyncio.ensure_future(_wait_for_disconnect(request))}
    if stopping is not None:
        waiters.add(stop := asyncio.ensure_future(stopping.wait()))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()  # a no-op once it is done
        await asyncio.gather(*waiters, return_exceptions=True)
    if task.cancelled():
        if stopping is not None and stop.done() and not stop.cancelled():
            raise APIError(503, "the server is shutting down; send the request again later")
        return None
    return task.result()


async def admit_unless_gone(
    request: Request, state: ServerState, admission: Awaitable[T]
) -> T | None:
    """Admission's result (tokenizing, compiling a grammar), None when the client hangs up
    first, a 503 when the server stops first. Counted in `state.admitting` meanwhile, so a
    graceful shutdown waits for it as for a request in flight and then ends it here, rather than
    leaving the ASGI server to cancel the handler."""
    state.admitting += 1
    try:
        return await unless_disconnected(request, admission, state.stopping)
    finally:
        state.admitting -= 1


async def _wait_for_disconnect(request: Request) -> None:
    # The body has been read, so the next message is the hang-up (or the response's end).
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
