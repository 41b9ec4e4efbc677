"""Hostile and careless clients: generated bodies over every field never get a 5xx or touch
other streams, limits hold under bursts, oversized prompts are refused before tokenizing."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import threading
import time

import httpx
import orjson
import pytest
import websockets
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.app.settings import ServerSettings
from baton.core.engine import Engine
from baton.core.request import MAX_SLO_MS, SLO, FinishReason
from baton.core.sampling_params import InvalidRequestError
from baton.core.text.tokenizer import Tokenizer
from tests.factory import add_request, make_engine, make_request
from tests.server_harness import base_url, paced_executor, running_server, simulated_engine

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
# Steps take real time, so streams beside a fuzzed request are running while it is handled.
STEP_S = 0.002


def paced_engine(checkpoint, step_s: float = STEP_S, **config) -> Engine:
    vocab_size = Tokenizer.from_pretrained(checkpoint).vocab_size
    return simulated_engine(checkpoint, paced_executor(4096, vocab_size, step_s), 2048, **config)


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = paced_engine(llama_checkpoint, max_num_seqs=16)
    with running_server(engine, max_queued_requests=64) as state:
        yield state


def assert_openai_error(response: httpx.Response) -> None:
    body = response.json()
    assert list(body) == ["error"], body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


# --- generated bodies --------------------------------------------------------------------

# Every field either endpoint declares, OpenAI's undeclared ones, Baton's extensions and a
# made-up one: each must be honoured or refused.
FIELDS = [
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "n", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "user", "logprobs", "top_logprobs", "echo", "best_of",
    "suffix", "response_format", "tools", "tool_choice", "parallel_tool_calls", "functions",
    "function_call", "modalities", "store", "metadata", "service_tier", "audio", "prediction",
    "reasoning_effort", "prompt_cache_key", "safety_identifier", "web_search_options",
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "min_tokens", "stop_token_ids",
    "priority", "slo", "return_token_timestamps", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "structured_outputs",
    "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "not_a_field",
]  # fmt: skip
# JSON literals Python's JSON would turn into inf, nan or a float; spliced in as raw text.
RAW_NUMBERS = ["1e999", "-1e999", "NaN", "Infinity", "1e-400", "123456789012345678901234567890"]
RAW = "__raw__"


def nested(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


EXTREMES = [
    2**63, 2**63 - 1, -(2**63), 2**64 - 1, 0, -1, 1, 1e308, -1e308, 1e-320, 5e-324, -0.0,
    0.5, None, True, False, "", "x" * 100_000, [], {}, nested(200), {"a": {"b": {"c": [1]}}},
    [2**63 - 1], ["é" * 3000], {"ttft_ms": 1e308}, {"tpot_ms": 1e-320},
    {"ttft_ms": 2**63}, {"type": "json_object"}, {"include_usage": True, "x": 1},
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(EXTREMES),
    st.sampled_from([RAW]),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.lists(st.integers(min_value=-5, max_value=2**64), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@st.composite
def bodies(draw) -> tuple[bytes, bool]:
    """A valid request with one to three fields set to something hostile; raw JSON text."""
    chat = draw(st.booleans())
    body: dict = {"max_tokens": 4, "stream": draw(st.booleans())}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "The for statement"
    for field in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True)):
        body[field] = draw(VALUES)
    # The standard library writes integers of any size, as a hostile client may.
    raw = json.dumps(body).replace(json.dumps(RAW), draw(st.sampled_from(RAW_NUMBERS)))
    return raw.encode(), chat


class Neighbours:
    """Streams that keep running while the fuzz runs; each must end with all its tokens."""

    MAX_TOKENS = 64

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.counts: list[int] = []
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run) for _ in range(3)]

    def __enter__(self) -> Neighbours:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self) -> None:
        body = {
            "prompt": "a neighbour",
            "max_tokens": self.MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        while not self.stop.is_set():
            with httpx.stream("POST", self.url + COMPLETIONS, json=body, timeout=30) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
            if response.status_code != 200 or lines[-1] != "data: [DONE]":
                self.failures.append(f"{response.status_code}: {lines[-2:]}")
                continue
            self.counts.append(orjson.loads(lines[-2][6:])["usage"]["completion_tokens"])


def example_each(values):
    """`hypothesis.example` for each of `values`: known classes run on every run."""

    def decorate(test):
        for value in values:
            test = example(value)(test)
        return test

    return decorate


FUZZ = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# Each reproduced a defect: `int(inf)` on the step thread failed every running stream.
KNOWN_CLASSES = [
    b'{"prompt": "x", "max_tokens": 4, "slo": {"tpot_ms": 1e308}}',
    b'{"prompt": "x", "max_tokens": 4, "slo": {"ttft_ms": 1e308, "tpot_ms": 1e-320}}',
    b'{"prompt": "x", "max_tokens": 4, "slo": {"ttft_ms": 1e999}}',
    b'{"prompt": "x", "max_tokens": 4, "priority": 9223372036854775808}',
    b'{"prompt": "x", "max_tokens": 4, "temperature": 1e-300, "top_p": 1e-300}',
]


def test_generated_http_bodies_never_get_a_5xx_nor_hurt_other_streams(server):
    url = base_url(server)
    with httpx.Client(base_url=url, timeout=30) as client, Neighbours(url) as neighbours:

        @FUZZ
        @given(bodies())
        @example_each((raw, False) for raw in KNOWN_CLASSES)
        def one(generated: tuple[bytes, bool]) -> None:
            raw, chat = generated
            headers = {"content-type": "application/json"}
            path = CHAT if chat else COMPLETIONS
            with client.stream("POST", path, content=raw, headers=headers) as response:
                text = response.read().decode()
            assert response.status_code < 500, (raw[:300], text[:300])
            if response.status_code >= 400:
                assert_openai_error(response)
            elif response.headers["content-type"].startswith("text/event-stream"):
                events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                assert not any('"error"' in event for event in events[:-1]), (raw[:300], text)

        one()
    assert not neighbours.failures
    assert neighbours.counts and set(neighbours.counts) == {Neighbours.MAX_TOKENS}


def test_generated_websocket_frames_get_answers_and_the_socket_stays_usable(server):
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ws"

    async def scenario(frames: list[bytes]) -> list[dict]:
        answers = []
        async with websockets.connect(url, max_size=None) as socket:
            for index, raw in enumerate(frames):
                frame = raw[:-1] + b',"type":"generate","id":' + str(index).encode() + b"}"
                await socket.send(frame.decode())
                while True:
                    answer = orjson.loads(await socket.recv())
                    if answer["type"] in ("done", "error"):
                        answers.append(answer)
                        break
            await socket.send(orjson.dumps({"type": "generate", "id": "last", "prompt": "hi"}))
            while (answer := orjson.loads(await socket.recv()))["type"] == "token":
                pass
            answers.append(answer)
        return answers

    @FUZZ
    @given(st.lists(bodies(), min_size=1, max_size=4))
    def one(generated: list[tuple[bytes, bool]]) -> None:
        answers = asyncio.run(scenario([raw for raw, _ in generated]))
        for answer in answers[:-1]:
            if answer["type"] == "error":
                assert set(answer["error"]) == {"message", "type", "param", "code"}
                assert answer["error"]["type"] != "server_error", answer
        assert answers[-1]["type"] == "done" and answers[-1]["id"] == "last"

    one()


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        (CHAT, "tool_choice", "required"),  # without tools
        (CHAT, "logit_bias", {"5": 1000}),
        (COMPLETIONS, "logit_bias", {"five": 10}),
        (COMPLETIONS, "best_of", 17),
        (CHAT, "best_of", 2),
        (COMPLETIONS, "suffix", "and then"),
        (CHAT, "functions", [{"name": "f"}]),
        (CHAT, "function_call", "auto"),
        (CHAT, "audio", {"voice": "alloy"}),
        (CHAT, "modalities", ["text", "audio"]),
        (CHAT, "prediction", {"type": "content", "content": "x"}),
        (CHAT, "reasoning_effort", "extreme"),
        (CHAT, "metadata", {"a": 1}),
        (CHAT, "web_search_options", {}),
        (CHAT, "service_tier", "flex"),
        (COMPLETIONS, "stream_options", {"include_usage": True, "continuous_usage_stats": True}),
    ],
)
def test_fields_baton_does_not_honour_are_refused_by_name(server, path, field, value):
    response = post_with(server, path, {field: value})
    assert response.status_code == 400, response.text
    assert_openai_error(response)
    assert response.json()["error"]["param"].split(".")[0] == field


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        (CHAT, {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none"}),
        (CHAT, {"user": "u-1", "store": False, "service_tier": "auto", "modalities": ["text"]}),
        (CHAT, {"store": True, "metadata": {"a": "b"}}),
        (CHAT, {"parallel_tool_calls": False, "prompt_cache_key": "k", "safety_identifier": "s"}),
        (COMPLETIONS, {"best_of": 1, "suffix": "", "logit_bias": {}, "user": "u-1"}),
    ],
)
def test_fields_that_ask_for_nothing_are_accepted(server, path, fields):
    response = post_with(server, path, fields)
    assert response.status_code == 200, response.text


def post_with(server, path: str, fields: dict) -> httpx.Response:
    """A short valid request to `path` with `fields` added."""
    body = {"max_tokens": 2, **fields}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return httpx.post(base_url(server) + path, json=body, timeout=30)


def test_websocket_ids_that_would_amplify_output_are_refused(server):
    url = f"ws://127.0.0.1:{server.settings.port}/v1/ws"

    async def scenario() -> list[dict]:
        async with websockets.connect(url, max_size=None) as socket:
            huge = {"type": "generate", "id": "i" * 1_000_000, "prompt": "x", "max_tokens": 64}
            await socket.send(orjson.dumps(huge).decode())
            return [orjson.loads(await socket.recv())]

    (answer,) = asyncio.run(scenario())
    assert answer["type"] == "error" and answer["id"] is None
    assert answer["error"]["param"] == "id"
    assert len(orjson.dumps(answer)) < 1000


# --- limits under concurrency -------------------------------------------------------------


@pytest.fixture
def small_server(llama_checkpoint):
    # Slow steps keep every admitted request in flight for the whole burst.
    engine = paced_engine(llama_checkpoint, step_s=0.05, max_num_seqs=2)
    with running_server(engine, max_queued_requests=4) as state:
        yield state


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"baton:{name} ") or line.startswith(f"baton:{name}{{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_burst_of_streams_never_passes_the_queue_limit(small_server):
    """Sixty requests land in the same event-loop turn (written on open sockets before any
    answer is read), so a capacity check that runs before registering would let all in."""
    port = small_server.settings.port
    body = orjson.dumps({"prompt": "burst", "max_tokens": 40, "ignore_eos": True, "stream": True})
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(60)]
    waiting = []
    try:
        # The server's loop is held while the requests arrive, so it finds all sixty at once.
        held = threading.Event()
        small_server.engine.loop.call_soon_threadsafe(lambda: (held.set(), time.sleep(0.5)))
        held.wait()
        for sock in sockets:
            sock.sendall(request)
        for _ in range(5):
            time.sleep(0.1)
            waiting.append(metric(base_url(small_server), "num_requests_waiting"))
        answers = [_read_all(sock) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
    statuses = [int(answer.split(b" ", 2)[1]) for answer in answers]
    # max_num_seqs (2) + max_queued_requests (4) admitted; every other one refused.
    assert statuses.count(200) == 6 and statuses.count(429) == 54
    assert max(waiting) <= 4
    for answer in answers:
        if b" 429 " in answer.split(b"\r\n", 1)[0]:
            head, _, payload = answer.partition(b"\r\n\r\n")
            retry_after = re.search(rb"(?i)retry-after: (\d+)", head).group(1).decode()
            assert int(retry_after) >= 1
            assert f"retry after {retry_after} s" in orjson.loads(payload)["error"]["message"]


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_one_body_with_many_prompts_counts_each_against_the_limit(small_server):
    url = base_url(small_server)
    many = httpx.post(
        f"{url}{COMPLETIONS}", json={"prompt": ["p"] * 2000, "max_tokens": 2}, timeout=30
    )
    assert many.status_code == 429
    assert "limit of 6" in many.json()["error"]["message"]
    assert int(many.headers["retry-after"]) >= 1
    # Six prompts fit the idle server exactly; they are served together.
    six = httpx.post(f"{url}{COMPLETIONS}", json={"prompt": ["p"] * 6, "max_tokens": 2}, timeout=30)
    assert six.status_code == 200 and len(six.json()["choices"]) == 6
    assert metric(url, "num_requests_waiting") == 0


# --- oversized prompts ----------------------------------------------------------------------


def test_a_multi_megabyte_prompt_is_refused_untokenized_without_stalling_streams(server):
    url = base_url(server)
    tokenizer = server.tokenizer
    encoded_chars: list[int] = []
    encode, encode_chat = tokenizer.encode, tokenizer.encode_chat

    def counting_encode(text, *args, **kwargs):
        encoded_chars.append(len(text))
        return encode(text, *args, **kwargs)

    def counting_encode_chat(messages, *args, **kwargs):
        encoded_chars.append(sum(len(m["content"]) for m in messages))
        return encode_chat(messages, *args, **kwargs)

    tokenizer.encode, tokenizer.encode_chat = counting_encode, counting_encode_chat
    big = "tokenize me " * 330_000  # 3.96 MB
    body = {"prompt": "a stream", "max_tokens": 400, "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    try:
        with httpx.stream("POST", f"{url}{COMPLETIONS}", json=body, timeout=60) as response:
            lines = response.iter_lines()
            for _ in range(20):
                next(lines)
            refused = [
                httpx.post(f"{url}{COMPLETIONS}", json={"prompt": big}, timeout=60),
                httpx.post(
                    f"{url}{CHAT}",
                    json={"messages": [{"role": "user", "content": big}]},
                    timeout=60,
                ),
            ]
            for line in lines:
                if line.startswith("data: "):
                    arrivals.append(time.monotonic())
    finally:
        tokenizer.encode, tokenizer.encode_chat = encode, encode_chat
    for response in refused:
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"
        assert "characters" in response.json()["error"]["message"]
    assert all(chars < 1000 for chars in encoded_chars), "the big prompt was tokenized"
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # Steps take 2 ms; tokenizing 4 MB on the event loop would hold every stream for seconds.
    assert max(gaps) < 0.5


# --- the engine's own checks ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    ttft=st.one_of(st.none(), st.floats(min_value=5e-324, max_value=MAX_SLO_MS)),
    tpot=st.one_of(st.none(), st.floats(min_value=5e-324, max_value=MAX_SLO_MS)),
    priority=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    policy=st.sampled_from(["slo", "fcfs", "priority", "sjf", "hrrn", "ltr"]),
)
def test_any_valid_slo_and_priority_is_served_in_full_by_every_policy(ttft, tpot, priority, policy):
    engine = make_engine(
        vocab_size=100,
        max_model_len=512,
        scheduling_policy=policy,
        max_num_batched_tokens=64,
    )
    add_request(engine, make_request("steady", [1, 2, 3], slo=SLO(50.0, 10.0), max_tokens=20))
    engine.step()
    add_request(
        engine,
        make_request("edge", [4, 5, 6], priority=priority, slo=SLO(ttft, tpot), max_tokens=20),
    )
    finished = {}
    for _ in range(200):
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        if not engine.has_unfinished_requests:
            break
    assert {rid: o.finish_reason for rid, o in finished.items()} == {
        "steady": FinishReason.LENGTH,
        "edge": FinishReason.LENGTH,
    }
    assert all(o.num_output_tokens == 20 for o in finished.values())


@pytest.mark.parametrize(
    "slo",
    [{"ttft_ms": 1e308}, {"tpot_ms": float("inf")}, {"ttft_ms": float("nan")}, {"tpot_ms": 0}],
)
def test_slo_targets_out_of_range_are_refused_in_core(slo):
    with pytest.raises(InvalidRequestError, match="slo"):
        SLO(**slo)


@pytest.mark.parametrize("flag", ["ttft_slo_ms", "tpot_slo_ms"])
@pytest.mark.parametrize("value", [1e308, 0.0, -5.0, float("nan"), float("inf")])
def test_server_slo_defaults_obey_the_same_bounds_as_a_request(flag, value):
    with pytest.raises(ValueError, match="--" + flag.replace("_", "-")):
        ServerSettings(**{flag: value})
