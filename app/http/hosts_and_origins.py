"""A request's Host and Origin read as names and ports: the Host names a server answers, and
whether an origin is the server's own page or one `--allowed-origins` lists. Plain functions
over the ASGI scope, for app/http/security.py's gates.
"""

from __future__ import annotations

import ipaddress
import re

from starlette.types import Scope

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# A Host header or an origin's authority: a DNS name or IPv4 address, or a bracketed IPv6 address,
# and an optional port. Nothing else: no userinfo, no path, no spaces.
AUTHORITY = re.compile(r"(?P<name>[a-z0-9._-]+|\[[0-9a-f:.]+\])(?::(?P<port>[0-9]{1,5}))?")
DEFAULT_PORTS = {"http": 80, "https": 443}
# The scheme of the page that opens a request of each scope scheme.
PAGE_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the header `name` (lower-case, as ASGI hands headers); None without."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def is_loopback(host: str) -> bool:
    if host.casefold() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def effective_allowed_hosts(bind_host: str, allowed_hosts: list[str]) -> list[str]:
    """The Host names a server bound to `bind_host` answers: loopback's own names when it is
    bound to loopback, plus `allowed_hosts`; everything (`*`) on other addresses unless
    `allowed_hosts` says which."""
    if is_loopback(bind_host):
        return [*LOOPBACK_NAMES, *allowed_hosts]
    return list(allowed_hosts) or ["*"]


def authority(value: str) -> tuple[str, int | None] | None:
    """A Host value's name and port: `[::1]:8000` → (`[::1]`, 8000), `Example.org` →
    (`example.org`, None); None for anything malformed."""
    match = AUTHORITY.fullmatch(value.casefold())
    if match is None:
        return None
    name, port = match["name"], match["port"]
    if port is not None and int(port) > 65535:
        return None
    if name.startswith("["):
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    return name, None if port is None else int(port)


def host_name(value: str) -> str | None:
    """A Host header's name without its port; None when the header is malformed."""
    parsed = authority(value)
    return None if parsed is None else parsed[0]


def is_own_origin(origin: str, scope: Scope) -> bool:
    """Whether `origin` is the one the request was sent to, so a page served from here: the
    request's scheme (http for ws, https for wss), and its Host's name and port."""
    scheme, _, rest = origin.casefold().partition("://")
    host = header(scope, b"host")
    if host is None or scheme != PAGE_SCHEMES.get(scope.get("scheme", "http")):
        return False
    theirs, ours = authority(rest), authority(host.decode("latin-1"))
    if theirs is None or ours is None:
        return False
    default = DEFAULT_PORTS[scheme]
    return theirs[0] == ours[0] and (theirs[1] or default) == (ours[1] or default)


class AllowedOrigins:
    """The web pages that may use the API: this server's own and those --allowed-origins lists
    (`*`: every page)."""

    def __init__(self, listed: list[str]) -> None:
        self.listed = frozenset(listed)

    def lists(self, origin: str) -> bool:
        return "*" in self.listed or origin in self.listed

    def allows(self, origin: str, scope: Scope) -> bool:
        return self.lists(origin) or is_own_origin(origin, scope)
