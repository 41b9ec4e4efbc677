"""Who may call Baton and how much they may send: Host names, cross-site requests, API keys,
CORS, WebSocket origins, body limits, as plain ASGI middleware (streams pass untouched); the
Host and Origin headers are read by app/http/hosts_and_origins.py.

Each check's reason is in docs/architecture.md (Serving, Security).
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
from collections.abc import Iterable
from urllib.parse import unquote

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from baton.app.errors import APIError
from baton.app.http.hosts_and_origins import (
    AllowedOrigins,
    effective_allowed_hosts,
    header,
    host_name,
    is_own_origin,
)
from baton.app.settings import ServerSettings

# Paths whose first segment is one of these are the API: keys and the cross-site check apply
# to every method; vLLM serves (de)tokenizing outside /v1, so Baton does too.
API_ROOTS = frozenset({"v1", "metrics", "tokenize", "detokenize"})
OPEN_PATH = "/health"
WS_PROTOCOL = "baton"
WS_KEY_PROTOCOL_PREFIX = "baton.bearer."
# Enough rounds to undo any realistic nesting of %25-escapes; what is still escaped after that
# is left as it is and stays in its (guarded or not) segment.
MAX_UNQUOTE_ROUNDS = 8
# Sec-Fetch-Site values of requests no other site's page started.
OWN_FETCH_SITES = frozenset({b"same-origin", b"none"})


def security_middleware(settings: ServerSettings) -> list[Middleware]:
    stack: list[Middleware] = []
    allowed_hosts = effective_allowed_hosts(settings.host, settings.allowed_hosts)
    if "*" not in allowed_hosts:
        stack.append(Middleware(HostGate, allowed_hosts=allowed_hosts))
    if settings.allowed_origins:
        stack.append(
            Middleware(
                CORSMiddleware,
                allow_origins=settings.allowed_origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                # OpenAI's browser client sends its own x-stainless-* headers; mirror what asks.
                allow_headers=["*"],
                expose_headers=["Retry-After"],
            )
        )
    stack.append(Middleware(CrossSiteGate, allowed_origins=settings.allowed_origins))
    if settings.api_keys:
        stack.append(Middleware(APIKeyMiddleware, api_keys=settings.api_keys))
    stack.append(Middleware(WebSocketGate, allowed_origins=settings.allowed_origins))
    stack.append(Middleware(BodySizeLimit, max_body_bytes=settings.max_body_bytes))
    return stack


class HostGate:
    """400 for a request whose Host is not one the server answers (see the module's notes)."""

    def __init__(self, app: ASGIApp, allowed_hosts: list[str]) -> None:
        self.app = app
        names = [h.strip().casefold() for h in allowed_hosts if h.strip()]
        self.exact = frozenset(n for n in names if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))

    def allows(self, host: str) -> bool:
        name = host_name(host)
        return name is not None and (name in self.exact or name.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = header(scope, b"host")
            if host is not None and not self.allows(host.decode("latin-1")):
                message = (
                    f"Host {host.decode('latin-1')!r} is not one this server answers; "
                    "see --allowed-hosts"
                )
                await deny(scope, receive, send, APIError(400, message))
                return
        await self.app(scope, receive, send)


def canonical_path(scope: Scope) -> str:
    """The request path with every ambiguity resolved, for deciding who may call it."""
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and path.startswith(root_path + "/"):
        path = path[len(root_path) :]
    for _ in range(MAX_UNQUOTE_ROUNDS):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    path = posixpath.normpath("/" + path.replace("\\", "/"))
    # normpath keeps a leading "//" (POSIX leaves it implementation-defined); routing does not.
    return "/" + path.lstrip("/").casefold()


def in_api(path: str) -> bool:
    """Whether a canonical path lies in the API namespace."""
    return path.split("/")[1] in API_ROOTS


def needs_key(scope: Scope) -> bool:
    if scope["type"] == "websocket":
        return True
    path = canonical_path(scope)
    if path == OPEN_PATH:
        return False
    if in_api(path):
        return True
    return scope["method"] not in ("GET", "HEAD")


def offered_subprotocols(scope: Scope) -> list[str]:
    return list(scope.get("subprotocols") or [])


def presented_key(scope: Scope) -> bytes | None:
    """The key a client sent: a bearer token, or on a WebSocket the key subprotocol."""
    authorization = header(scope, b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(b" ")
        return token.strip() if scheme.lower() == b"bearer" else None
    if scope["type"] == "websocket":
        for protocol in offered_subprotocols(scope):
            if protocol.startswith(WS_KEY_PROTOCOL_PREFIX):
                return protocol[len(WS_KEY_PROTOCOL_PREFIX) :].encode()
    return None


class KeyRing:
    """The configured keys, held as digests so every comparison has the same length."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys]

    def accepts(self, candidate: bytes | None) -> bool:
        digest = hashlib.sha256(candidate or b"").digest()
        matched = False
        # No early exit: the loop costs the same whichever key matched, or none.
        for key_digest in self._digests:
            matched |= hmac.compare_digest(digest, key_digest)
        return matched and candidate is not None


async def deny(scope: Scope, receive: Receive, send: Send, error: APIError) -> None:
    """Answer with `error`; on a WebSocket, as the HTTP response to the upgrade (no accept)."""
    if scope["type"] == "websocket" and "websocket.http.response" not in scope.get(
        "extensions", {}
    ):
        # Without the denial-response extension the server can only answer 403.
        await send({"type": "websocket.close", "code": 1008})
        return
    await error.response()(scope, receive, send)


class APIKeyMiddleware:
    """401 for a missing or wrong key wherever `needs_key` says one is required."""

    def __init__(self, app: ASGIApp, api_keys: list[str]) -> None:
        self.app = app
        self.keys = KeyRing(api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and needs_key(scope):
            key = presented_key(scope)
            if not self.keys.accepts(key):
                await deny(scope, receive, send, self._unauthorized(key))
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _unauthorized(key: bytes | None) -> APIError:
        problem = "no API key was sent" if key is None else "the API key is not valid"
        return APIError(
            401,
            f"{problem}; send 'Authorization: Bearer <key>' with a key given to --api-key "
            f"(WebSocket clients in a browser may offer the subprotocols "
            f"'{WS_PROTOCOL}' and '{WS_KEY_PROTOCOL_PREFIX}<key>' instead)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


class CrossSiteGate:
    """403 for API requests a browser sends for another site's page (see the module's notes)."""

    def __init__(self, app: ASGIApp, allowed_origins: list[str]) -> None:
        self.app = app
        self.origins = AllowedOrigins(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and in_api(canonical_path(scope)) and self.is_foreign(scope):
            origin = header(scope, b"origin")
            await deny(scope, receive, send, self._refusal(origin))
            return
        await self.app(scope, receive, send)

    def is_foreign(self, scope: Scope) -> bool:
        origin = header(scope, b"origin")
        if origin is not None and self.origins.lists(origin.decode("latin-1")):
            return False
        site = header(scope, b"sec-fetch-site")
        if site is not None and site.lower() not in OWN_FETCH_SITES:
            return True
        return origin is not None and not is_own_origin(origin.decode("latin-1"), scope)

    @staticmethod
    def _refusal(origin: bytes | None) -> APIError:
        pages = (
            "another site's pages" if origin is None else f"pages at {origin.decode('latin-1')!r}"
        )
        return APIError(
            403,
            f"API requests from {pages} are not allowed; list the page's origin in "
            f"--allowed-origins to let it use the API",
            code="origin_not_allowed",
        )


class WebSocketGate:
    """The upgrade's Origin check, and the subprotocol side of passing a key in a browser."""

    def __init__(self, app: ASGIApp, allowed_origins: list[str]) -> None:
        self.app = app
        self.origins = AllowedOrigins(allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        origin = header(scope, b"origin")
        if origin is not None and not self.origins.allows(origin.decode("latin-1"), scope):
            message = f"WebSocket connections from {origin.decode('latin-1')!r} are not allowed"
            await deny(scope, receive, send, APIError(403, f"{message}; see --allowed-origins"))
            return
        offered = offered_subprotocols(scope)
        # The endpoint never sees the key, and need not know about the browser convention.
        kept = [p for p in offered if not p.startswith(WS_KEY_PROTOCOL_PREFIX)]
        scope = {**scope, "subprotocols": kept}
        if WS_PROTOCOL in offered:
            send = _accepting_protocol(send, WS_PROTOCOL)
        await self.app(scope, receive, send)


def _accepting_protocol(send: Send, protocol: str) -> Send:
    async def send_with_protocol(message: Message) -> None:
        if message["type"] == "websocket.accept" and not message.get("subprotocol"):
            message = {**message, "subprotocol": protocol}
        await send(message)

    return send_with_protocol


class BodyTooLargeError(Exception):
    """Raised into the app from `receive` once a streamed body passes the limit."""


class BodySizeLimit:
    """413 for bodies over `max_body_bytes`: at once from Content-Length, or as a chunked body
    grows past it. The body is never buffered here; uvicorn drops what arrives after the 413."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        await self._call_counting(scope, receive, send)

    async def _call_counting(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    exceeded = True
                    raise BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            # Whatever the app answers about a body it never got whole is replaced by the 413.
            if exceeded and not started:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            # The app may have wrapped BodyTooLargeError into its own error; either way it ends.
            if not exceeded:
                raise
        if exceeded and not started:
            await self._too_large().response()(scope, receive, send)

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than the server's limit of {self.max_body_bytes} "
            f"bytes; send a shorter prompt",
            code="request_too_large",
        )
