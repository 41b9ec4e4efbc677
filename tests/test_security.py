"""API keys on HTTP and WebSocket, path tricks, CORS, WebSocket origins and body limits, against a
real uvicorn on loopback: the Baton app itself, and a small app behind the same middleware where
the behaviour under test needs an endpoint the Baton routes do not offer (an echo of the body,
a socket that reports the subprotocols it saw)."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from hypothesis import example, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import baton.app.http.server
from baton.app.http.hosts_and_origins import LOOPBACK_NAMES, effective_allowed_hosts, host_name
from baton.app.http.security import HostGate, canonical_path, security_middleware
from baton.app.settings import ServerSettings
from tests.server_harness import base_url, free_port, running_server, simulated_engine

KEYS = ["sk-first", "sk-second"]
GUARDED_VARIANTS = [
    "/v1/models",
    "//v1/models",
    "/v1//models",
    "/%2Fv1/models",
    "/%2fv1/models",
    "/%252Fv1/models",
    "/v1/models/",
    "/V1/models",
    "/v1/./models",
    "/x/../v1/models",
    "/%76%31/models",
    "/v1%2Fmodels",
    "/v1\\models",
    "/metrics",
    "//metrics",
    "/METRICS/",
]


def raw_status(port: int, method: str, target: str, headers: dict | None = None) -> int:
    """Send `target` byte for byte (httpx would normalise the odd paths away)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, target, headers=headers or {})
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.fixture(scope="module")
def guarded(llama_checkpoint, tmp_path_factory):
    """Baton with two keys and a static UI folder, as `baton serve --api-key ... --api-key ...`."""
    static = tmp_path_factory.mktemp("static")
    (static / "index.html").write_text("<h1>Baton</h1>")
    (static / "chat.js").write_text("console.log('hi')")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(baton.app.http.server, "STATIC_DIR", static)
        with running_server(simulated_engine(llama_checkpoint), api_keys=KEYS) as state:
            yield state


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("/v1/models", "/v1/models"),
        ("//v1//models/", "/v1/models"),
        ("/%2Fv1/models", "/v1/models"),
        ("/%25252Fv1", "/v1"),
        ("/V1/Models", "/v1/models"),
        ("/a/./b/../../v1", "/v1"),
        ("/../../v1", "/v1"),
        ("/v1\\models", "/v1/models"),
        ("/", "/"),
        ("/health", "/health"),
    ],
)
def test_canonical_path_resolves_every_spelling(path, canonical):
    assert canonical_path({"path": path}) == canonical


def test_api_and_metrics_refuse_requests_without_a_key(guarded):
    url = base_url(guarded)
    routes = [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/responses"),
    ]
    for method, path in routes:
        response = httpx.request(method, f"{url}{path}", json={"prompt": "hi"})
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["type"] == "authentication_error"
        assert "--api-key" in error["message"]


def test_every_configured_key_is_accepted_and_nothing_else(guarded):
    url = f"{base_url(guarded)}/v1/models"
    for key in KEYS:
        assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert httpx.get(url, headers={"Authorization": "bearer sk-first"}).status_code == 200
    refused = ["Bearer sk-firs", "Bearer sk-first2", "Bearer SK-FIRST", "Bearer",
               "Basic sk-first", "sk-first", "Bearer sk-first sk-second"]  # fmt: skip
    for authorization in refused:
        response = httpx.get(url, headers={"Authorization": authorization})
        assert response.status_code == 401, authorization
    assert httpx.get(f"{url}?api_key=sk-first").status_code == 401


def test_health_and_static_ui_are_open_without_a_key(guarded):
    url = base_url(guarded)
    assert httpx.get(f"{url}/health").status_code == 200
    for path in ("/", "/index.html"):
        assert httpx.get(f"{url}{path}").text == "<h1>Baton</h1>"
    assert httpx.get(f"{url}/chat.js").status_code == 200
    assert httpx.head(f"{url}/chat.js").status_code == 200
    # Open does not mean writable: other methods outside the API still need the key.
    assert httpx.post(f"{url}/index.html").status_code == 401


@pytest.mark.parametrize("target", GUARDED_VARIANTS)
def test_path_spellings_cannot_slip_past_the_key_check(guarded, target):
    port = guarded.settings.port
    assert raw_status(port, "GET", target) == 401
    assert raw_status(port, "POST", target) == 401


def test_cors_is_off_without_allowed_origins(guarded):
    response = httpx.get(f"{base_url(guarded)}/health", headers={"Origin": "https://chat.example"})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
    preflight = httpx.options(
        f"{base_url(guarded)}/v1/completions",
        headers={"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_answers_listed_origins_only(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine, api_keys=KEYS, allowed_origins=["https://chat.example"]) as state:
        url = base_url(state)
        # Preflights carry no credentials, so they are answered without a key.
        preflight = httpx.options(
            f"{url}/v1/chat/completions",
            headers={
                "Origin": "https://chat.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://chat.example"
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        # A 401 carries the header too, so the page can read why it was refused.
        refused = httpx.get(f"{url}/v1/models", headers={"Origin": "https://chat.example"})
        assert refused.status_code == 401
        assert refused.headers["access-control-allow-origin"] == "https://chat.example"
        other = httpx.get(f"{url}/health", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


@contextlib.contextmanager
def serving(settings: ServerSettings) -> Iterator[str]:
    """A minimal app behind Baton's middleware: an echo route and an accepting WebSocket."""

    async def echo(request: Request) -> Response:
        try:
            body = await request.body()
        except Exception:
            # A route that turns every read failure into its own 400 must not mask the 413.
            return JSONResponse({"error": "unreadable"}, status_code=400)
        return JSONResponse({"received": len(body)})

    async def report_subprotocols(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_json({"subprotocols": websocket.scope["subprotocols"]})
        await websocket.close()

    routes = [
        Route("/v1/echo", echo, methods=["POST"]),
        WebSocketRoute("/v1/ws", report_subprotocols),
    ]
    test_app = Starlette(routes=routes, middleware=security_middleware(settings))
    port = free_port()
    config = uvicorn.Config(test_app, port=port, ws="websockets-sansio", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test app did not start"
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def ws_open(address: str, **kwargs) -> dict:
    """Connect to /v1/ws; the endpoint's first frame, plus the subprotocol it accepted."""
    with connect(f"ws://{address}/v1/ws", proxy=None, open_timeout=5, **kwargs) as ws:
        return {**json.loads(ws.recv(timeout=5)), "accepted": ws.subprotocol}


def ws_refusal(address: str, **kwargs) -> int:
    with pytest.raises(InvalidStatus) as refused:
        ws_open(address, **kwargs)
    return refused.value.response.status_code


def test_websocket_upgrade_needs_a_key(guarded):
    # The real /v1/ws: refused at the handshake, before any endpoint code runs.
    address = f"127.0.0.1:{guarded.settings.port}"
    with pytest.raises(InvalidStatus) as refused:
        ws_open(address)
    assert refused.value.response.status_code == 401
    assert b"authentication_error" in refused.value.response.body
    with serving(ServerSettings(api_keys=KEYS)) as address:
        assert ws_refusal(address) == 401
        assert ws_refusal(address, additional_headers={"Authorization": "Bearer nope"}) == 401
        assert ws_refusal(address, subprotocols=["baton", "baton.bearer.nope"]) == 401
        opened = ws_open(address, additional_headers={"Authorization": "Bearer sk-second"})
        assert opened["subprotocols"] == []


def test_browsers_pass_the_key_as_a_subprotocol_the_endpoint_never_sees():
    with serving(ServerSettings(api_keys=KEYS)) as address:
        opened = ws_open(address, subprotocols=["baton", "baton.bearer.sk-first"])
        assert opened == {"subprotocols": ["baton"], "accepted": "baton"}
        with pytest.raises(InvalidStatus):
            connect(f"ws://{address}/v1/ws?api_key=sk-first", proxy=None)


def test_browser_style_client_generates_over_baton_websocket(guarded):
    address = f"127.0.0.1:{guarded.settings.port}"
    protocols = ["baton", "baton.bearer.sk-second"]
    url = f"ws://{address}/v1/ws"
    with connect(url, proxy=None, subprotocols=protocols, origin=f"http://{address}") as ws:
        assert ws.subprotocol == "baton"
        ws.send(json.dumps({"type": "generate", "id": "a", "prompt": "hi", "max_tokens": 3}))
        frames = [json.loads(ws.recv(timeout=5))]
        while frames[-1]["type"] == "token":
            frames.append(json.loads(ws.recv(timeout=5)))
    assert frames[-1]["type"] == "done"
    assert frames[-1]["finish_reason"] == "length"


def test_websocket_origin_must_be_absent_same_or_listed():
    settings = ServerSettings(allowed_origins=["https://chat.example"])
    with serving(settings) as address:
        assert ws_open(address)["accepted"] is None
        assert ws_open(address, origin="https://chat.example")["subprotocols"] == []
        assert ws_open(address, origin=f"http://{address}")["subprotocols"] == []
        assert ws_refusal(address, origin="https://evil.example") == 403
        assert ws_refusal(address, origin="null") == 403
        # The same name and port under another scheme is another origin.
        assert ws_refusal(address, origin=f"https://{address}") == 403
    with serving(ServerSettings()) as address:
        assert ws_refusal(address, origin="https://chat.example") == 403
        assert ws_open(address, origin=f"http://{address}")["subprotocols"] == []


def test_oversized_bodies_get_413_declared_or_chunked():
    with serving(ServerSettings(max_body_bytes=1000)) as address:
        url = f"http://{address}/v1/echo"
        assert httpx.post(url, content=b"x" * 1000).json() == {"received": 1000}
        declared = httpx.post(url, content=b"x" * 1001)
        assert declared.status_code == 413
        assert declared.json()["error"]["type"] == "invalid_request_error"
        assert "1000 bytes" in declared.json()["error"]["message"]

        def chunks(total: int) -> Iterator[bytes]:
            for _ in range(total // 100):
                yield b"y" * 100

        assert httpx.post(url, content=chunks(1000)).json() == {"received": 1000}
        chunked = httpx.post(url, content=chunks(5000))
        assert chunked.status_code == 413
        assert chunked.json()["error"]["type"] == "invalid_request_error"
        # The connection stays usable after a refused body.
        with httpx.Client() as client:
            assert client.post(url, content=chunks(5000)).status_code == 413
            assert client.post(url, content=b"ok").json() == {"received": 2}


def test_baton_refuses_oversized_completion_bodies_before_reading_them(guarded):
    url = f"{base_url(guarded)}/v1/completions"
    headers = {"Authorization": "Bearer sk-first", "Content-Type": "application/json"}
    limit = guarded.settings.max_body_bytes
    prompt = "word " * (limit // 5 + 1)
    body = f'{{"model": "tiny", "prompt": "{prompt}"}}'.encode()
    assert httpx.post(url, content=body, headers=headers).status_code == 413
    pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
    chunked = httpx.post(url, content=pieces, headers=headers)
    assert chunked.status_code == 413
    assert chunked.json()["error"]["code"] == "request_too_large"
    # Only the headers are sent: the 413 comes back without waiting for a byte of the body.
    with socket.create_connection(("127.0.0.1", guarded.settings.port), timeout=5) as raw:
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer sk-first\r\nContent-Length: %d\r\n\r\n" % (100 * limit)
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 413 ")


def test_host_names_are_read_without_their_port():
    assert host_name("127.0.0.1:8000") == "127.0.0.1"
    assert host_name("[::1]:8000") == "[::1]"
    assert host_name("Example.ORG") == "example.org"
    assert host_name("[::1]") == "[::1]"


def test_loopback_servers_answer_loopback_names_and_listed_ones_only():
    assert effective_allowed_hosts("127.0.0.1", []) == ["localhost", "127.0.0.1", "[::1]"]
    assert effective_allowed_hosts("::1", ["chat.lan"])[-1] == "chat.lan"
    assert effective_allowed_hosts("localhost", []) == ["localhost", "127.0.0.1", "[::1]"]
    # Elsewhere the server cannot know its names: all, unless listed.
    assert effective_allowed_hosts("0.0.0.0", []) == ["*"]
    assert effective_allowed_hosts("10.0.0.5", ["api.example.org"]) == ["api.example.org"]


def test_a_rebound_host_name_is_refused_on_loopback_http_and_websocket(guarded):
    # DNS rebinding: the page's own name resolves to 127.0.0.1, so its requests carry it as
    # Host (and as a same-origin WebSocket Origin), with no key needed for the static UI.
    port = guarded.settings.port
    assert raw_status(port, "GET", "/health", {"Host": f"127.0.0.1:{port}"}) == 200
    assert raw_status(port, "GET", "/health", {"Host": f"localhost:{port}"}) == 200
    assert raw_status(port, "GET", "/", {"Host": f"rebound.example:{port}"}) == 400
    refused = httpx.get(f"http://127.0.0.1:{port}/health", headers={"Host": "rebound.example"})
    assert refused.status_code == 400
    assert "--allowed-hosts" in refused.json()["error"]["message"]
    # The socket goes to loopback; the URL's name becomes the Host (and the page's Origin).
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    with pytest.raises(InvalidStatus) as upgrade:
        connect(
            f"ws://evil.example:{port}/v1/ws",
            sock=sock,
            proxy=None,
            open_timeout=5,
            origin=f"http://evil.example:{port}",
        )
    assert upgrade.value.response.status_code == 400


def test_listed_hosts_and_subdomain_patterns_are_answered():
    settings = ServerSettings(allowed_hosts=["chat.lan", "*.example.org"])
    with serving(settings) as address:
        port = int(address.rsplit(":", 1)[1])
        for host, status in [
            ("chat.lan", 200),
            ("a.example.org:443", 200),
            ("example.org.evil", 400),
            ("evil.lan", 400),
            (address, 200),
        ]:
            assert raw_status(port, "POST", "/v1/echo", {"Host": host}) == status, host


LOOPBACK_GATE = HostGate(app=None, allowed_hosts=list(LOOPBACK_NAMES))
PORT = re.compile(r":[0-9]{1,5}")


@settings(max_examples=500, deadline=None)
@given(name=st.sampled_from(LOOPBACK_NAMES), tail=st.text(max_size=24))
@example(name="localhost", tail=":8200@evil.example")
@example(name="[::1]", tail="evil.example")
@example(name="127.0.0.1", tail=":8000/x")
@example(name="localhost", tail=":99999")
@example(name="localhost", tail=":8200")
def test_a_loopback_name_is_answered_bare_or_with_a_port_and_nothing_else(name, tail):
    is_port = PORT.fullmatch(tail) is not None and int(tail[1:]) <= 65535
    assert LOOPBACK_GATE.allows(name + tail) == (tail == "" or is_port)


@settings(max_examples=300, deadline=None)
@given(
    name=st.from_regex(r"[a-z0-9_-]{1,12}(\.[a-z0-9_-]{1,12}){0,3}", fullmatch=True),
    port=st.none() | st.integers(0, 65535),
)
def test_a_name_with_an_optional_port_reads_as_that_name(name, port):
    value = name if port is None else f"{name}:{port}"
    assert host_name(value.upper()) == name


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab01:.[]@/\\%#? -_", max_size=20))
def test_a_host_is_read_only_when_it_is_a_name_or_ip_literal_and_a_port(value):
    name = host_name(value)
    if name is not None:
        assert value == name or PORT.fullmatch(value.removeprefix(name))
        assert not set(name) & set("@/\\%#? ")
        assert name.count("[") == name.count("]") == (1 if name.startswith("[") else 0)


def test_malformed_host_headers_are_refused(guarded):
    port = guarded.settings.port
    for host in [
        f"localhost:{port}@evil.example",
        f"[::1]evil.example:{port}",
        f"127.0.0.1:{port}/",
        f"localhost:{port}:{port}",
        "[::1",
        f"localhost :{port}",
        f"[localhost]:{port}",
    ]:
        assert raw_status(port, "GET", "/health", {"Host": host}) == 400, host
    assert raw_status(port, "GET", "/health", {"Host": f"[::1]:{port}"}) == 200


@pytest.fixture(scope="module")
def open_baton(llama_checkpoint):
    """Baton with no key, as most local installs run, and one origin listed for CORS."""
    engine = simulated_engine(llama_checkpoint)
    with running_server(engine, allowed_origins=["https://chat.example"]) as state:
        yield state


def own_origin(state, scheme: str = "http") -> str:
    return f"{scheme}://127.0.0.1:{state.settings.port}"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 200),
        ({"Origin": "{own}"}, 200),
        ({"Origin": "{own}", "Sec-Fetch-Site": "same-origin"}, 200),
        ({"Sec-Fetch-Site": "none"}, 200),
        ({"Origin": "https://chat.example", "Sec-Fetch-Site": "cross-site"}, 200),
        ({"Origin": "https://evil.example"}, 403),
        ({"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"}, 403),
        ({"Origin": "{own}", "Sec-Fetch-Site": "cross-site"}, 403),
        ({"Origin": "https://127.0.0.1:{port}"}, 403),
        ({"Origin": "http://127.0.0.1:1"}, 403),
        ({"Origin": "null"}, 403),
    ],
)
def test_only_requests_from_no_page_this_servers_or_a_listed_one_may_generate(
    open_baton, headers, status
):
    # What a foreign page can send without a preflight: a POST with a text/plain body.
    filled = {
        name: value.format(own=own_origin(open_baton), port=open_baton.settings.port)
        for name, value in headers.items()
    }
    body = json.dumps({"prompt": "hi", "max_tokens": 2})
    response = httpx.post(
        f"{base_url(open_baton)}/v1/completions",
        content=body,
        headers={"Content-Type": "text/plain", **filled},
    )
    assert response.status_code == status, response.text
    if status == 403:
        error = response.json()["error"]
        assert error["type"] == "permission_error"
        assert error["code"] == "origin_not_allowed"
        assert "--allowed-origins" in error["message"]


def test_the_whole_api_is_closed_to_foreign_pages_and_the_rest_open(open_baton):
    port = open_baton.settings.port
    foreign = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    for target in ["/v1/models", "//v1/models", "/V1/stats", "/metrics", "/%2Fmetrics"]:
        assert raw_status(port, "GET", target, foreign) == 403, target
    message = httpx.get(f"{base_url(open_baton)}/v1/models", headers=foreign).json()
    assert "'https://evil.example'" in message["error"]["message"]
    # A link from another site to the chat UI, and a probe of /health, still work.
    assert raw_status(port, "GET", "/", {"Sec-Fetch-Site": "cross-site"}) == 200
    assert raw_status(port, "GET", "/health", foreign) == 200
    # CORS preflights from listed origins are answered before the check.
    preflight = httpx.options(
        f"{base_url(open_baton)}/v1/completions",
        headers={"Origin": "https://chat.example", "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 200
