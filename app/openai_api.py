"""OpenAI-compatible completions and chat completions (scaffold; the routes land next)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from app.errors import APIError


async def completions(request: Request) -> Response:
    raise APIError(501, "not implemented yet")


async def chat_completions(request: Request) -> Response:
    raise APIError(501, "not implemented yet")
