"""The WebSocket protocol at /v1/ws (scaffold; the protocol lands next)."""

from __future__ import annotations

from starlette.websockets import WebSocket


async def websocket_endpoint(websocket: WebSocket) -> None:
    await websocket.close(code=1011)
