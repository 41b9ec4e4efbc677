"""API keys, CORS, WebSocket origins and body limits (scaffold; the middleware lands next)."""

from __future__ import annotations

from starlette.middleware import Middleware

from app.settings import ServerSettings


def security_middleware(settings: ServerSettings) -> list[Middleware]:
    return []
