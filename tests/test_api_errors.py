"""Every bad input gets an OpenAI-shaped error with the right status and a message that says
what to change, never a 500, and the server keeps serving afterwards."""

from __future__ import annotations

import concurrent.futures
import contextlib
import time

import httpx
import orjson
import pytest

from tests.server_harness import (
    FAULTY_TOKEN,
    ControlledExecutor,
    base_url,
    running_server,
    simulated_engine,
)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_num_seqs=4)
    engine.executor = ControlledExecutor(4096, 16, engine.vocab_size)
    with running_server(engine, model_name="tiny", max_queued_requests=2) as state:
        yield state


def post(state, path: str, body: bytes | dict) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"content-type": "application/json"}
    return httpx.post(f"{base_url(state)}{path}", content=content, headers=headers, timeout=10)


def assert_error(response: httpx.Response, status: int, kind: str, param: str | None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind
    assert body["error"]["param"] == param
    return body["error"]["message"]


def completion(**fields) -> dict:
    return {"model": "tiny", "prompt": "The for statement", "max_tokens": 4, **fields}


def chat(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


# (path, body, param the error names, a word the message must contain)
BAD_REQUESTS = [
    (COMPLETIONS, b'{"prompt": "x",', None, "JSON"),
    (COMPLETIONS, b'{"prompt": "x", "temperature": NaN}', None, "NaN"),
    (COMPLETIONS, b'["prompt", "x"]', None, "object"),
    (COMPLETIONS, b'"just a string"', None, "object"),
    (COMPLETIONS, b'{"prompt": "\\ud800"}', None, "surrogate"),
    (COMPLETIONS, b'{"prompt": "caf\xe9"}', None, "UTF-8"),
    (COMPLETIONS, completion(max_tokens="5"), "max_tokens", "integer"),
    (COMPLETIONS, completion(max_tokens=2.5), "max_tokens", "integer"),
    (COMPLETIONS, completion(temperature="hot"), "temperature", "number"),
    (COMPLETIONS, completion(stream="yes"), "stream", "boolean"),
    (COMPLETIONS, completion(prompt=5), "prompt", "string"),
    (COMPLETIONS, completion(prompt=["a", 5]), "prompt", "token"),
    (COMPLETIONS, completion(stop=[1]), "stop", "strings"),
    (
        COMPLETIONS,
        completion(stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        "boolean",
    ),
    (COMPLETIONS, completion(max_tokens=0), "max_tokens", "echo"),
    (COMPLETIONS, completion(max_tokens=-3), "max_tokens", ">= 0"),
    (COMPLETIONS, completion(max_tokens=5000), "max_tokens", "lower max_tokens"),
    (COMPLETIONS, completion(temperature=-0.5), "temperature", "in [0, 100]"),
    (COMPLETIONS, completion(top_p=0.0), "top_p", "(0, 1]"),
    (COMPLETIONS, completion(top_p=1.5), "top_p", "(0, 1]"),
    (COMPLETIONS, completion(top_k=-2), "top_k", ">= -1"),
    (COMPLETIONS, completion(prompt=[5] * 5000), "prompt", "context length"),
    (COMPLETIONS, completion(prompt="statement " * 5000), "prompt", "context length"),
    (COMPLETIONS, completion(prompt=""), "prompt", "empty"),
    (COMPLETIONS, completion(prompt=[]), "prompt", "empty"),
    (COMPLETIONS, completion(prompt=[[]]), "prompt", "empty"),
    (COMPLETIONS, completion(prompt=[10**6]), "prompt", "vocabulary"),
    (COMPLETIONS, completion(prompt=[-1]), "prompt", "vocabulary"),
    (COMPLETIONS, completion(stop=[f"s{i}" for i in range(17)]), "stop", "at most 16"),
    (COMPLETIONS, completion(stop="x" * 300), "stop", "at most 256"),
    (COMPLETIONS, completion(n=17), "n", "[1, 16]"),
    (COMPLETIONS, completion(logprobs=50), "logprobs", "[0, 20]"),
    (CHAT, chat(messages=[]), "messages", "empty"),
    (CHAT, chat(messages="hi"), "messages", "list"),
    (CHAT, chat(messages=[{"content": "hi"}]), "messages[0].role", "required"),
    (CHAT, chat(messages=[{"role": "user", "content": 5}]), "messages[0].content", "string"),
    (CHAT, chat(max_completion_tokens=0), "max_completion_tokens", "positive"),
    (CHAT, chat(max_completion_tokens=-1), "max_completion_tokens", ">= 0"),
    (CHAT, chat(top_logprobs=2), "top_logprobs", "logprobs"),
    (CHAT, chat(messages=[{"role": "user", "content": "x" * 20000}]), "messages", "context"),
    (CHAT, chat(n=0), "n", "[1, 16]"),
]


@pytest.mark.parametrize(("path", "body", "param", "hint"), BAD_REQUESTS)
def test_bad_input_is_a_400_naming_what_to_change(server, path, body, param, hint):
    message = assert_error(post(server, path, body), 400, "invalid_request_error", param)
    assert hint in message


def test_top_p_of_one_is_valid(server):
    assert post(server, COMPLETIONS, completion(top_p=1.0)).status_code == 200


def test_unknown_model_is_a_404(server):
    for path, body in ((COMPLETIONS, completion(model="gpt-4")), (CHAT, chat(model="gpt-4"))):
        message = assert_error(post(server, path, body), 404, "not_found_error", "model")
        assert "gpt-4" in message and "tiny" in message


def test_a_request_the_engine_fails_is_a_500_and_others_are_unharmed(server):
    failed = post(server, COMPLETIONS, completion(prompt=[FAULTY_TOKEN, 5, 6]))
    message = assert_error(failed, 500, "server_error", None)
    # The exception's own text stays in the server log: it can carry paths and internals.
    assert "injected fault" not in message and "server log" in message
    assert post(server, COMPLETIONS, completion()).status_code == 200


def test_a_fault_in_a_shared_batch_fails_only_its_own_request(server):
    """A blocker holds the step thread inside a step while the faulty request and two healthy
    ones queue up, so all three are admitted into the same next step."""
    executor = server.engine.engine.executor
    url = f"{base_url(server)}{COMPLETIONS}"
    healthy = completion(prompt=[7, 8, 9], max_tokens=12, ignore_eos=True)
    bodies = [healthy, completion(prompt=[FAULTY_TOKEN, 5, 6]), healthy, healthy]
    executor.faulted_batch_sizes.clear()
    executor.running.clear()
    try:
        with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
            futures = [pool.submit(httpx.post, url, json=bodies[0], timeout=30)]
            _wait_for(lambda: server.engine.engine.num_running == 1)
            futures += [pool.submit(httpx.post, url, json=body, timeout=30) for body in bodies[1:]]
            _wait_for(lambda: server.engine.num_in_flight == len(bodies))
            executor.running.set()
            responses = [future.result() for future in futures]
    finally:
        executor.running.set()
    assert "server log" in assert_error(responses[1], 500, "server_error", None)
    # The fault struck a step it shared with its batch-mates, then again when re-run alone.
    assert executor.faulted_batch_sizes[0] == len(bodies)
    assert executor.faulted_batch_sizes[1:] == [1]
    for response in (responses[0], *responses[2:]):
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 12


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server did not reach the expected state"
        time.sleep(0.01)


def test_past_the_queue_limit_requests_get_429_with_retry_after(server):
    executor = server.engine.engine.executor
    url = f"{base_url(server)}{COMPLETIONS}"
    with contextlib.ExitStack() as held:
        executor.running.clear()  # hold the step thread so requests stay in flight
        held.callback(executor.running.set)
        # max_num_seqs (4) + max_queued_requests (2) streams fill the server.
        for _ in range(6):
            stream = httpx.stream("POST", url, json=completion(stream=True), timeout=10)
            assert held.enter_context(stream).status_code == 200
        refused = post(server, COMPLETIONS, completion())
        message = assert_error(refused, 429, "rate_limit_error", None)
        assert "retry" in message
        assert int(refused.headers["retry-after"]) >= 1


def test_the_server_keeps_serving_after_every_error(server):
    for path, body, _, _ in BAD_REQUESTS:
        post(server, path, body)
    response = post(server, CHAT, chat(max_tokens=3))
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (COMPLETIONS, completion(max_tokens=5000)),
        (COMPLETIONS, completion(prompt=[5] * 5000)),
        (CHAT, chat(messages=[{"role": "user", "content": "x" * 20000}])),
    ],
)
def test_too_long_for_the_context_carries_openais_code(server, path, body):
    # Chat clients (the UI here) answer this code by leaving out the oldest turns.
    response = post(server, path, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_other_bad_input_carries_no_context_code(server):
    response = post(server, COMPLETIONS, completion(prompt=[10**6]))
    assert response.status_code == 400
    assert response.json()["error"]["code"] is None
