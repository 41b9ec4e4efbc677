"""The OpenAI-compatible endpoints, driven by the official `openai` client against a real
uvicorn serving a tiny random model: wire format, usage and timing, several prompts per request,
and greedy text that is the same over SSE, whole responses, WebSockets and the offline API."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import orjson
import pytest
from websockets.asyncio.client import connect

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from tests.server_harness import base_url, model_engine, running_server

PROMPTS = [
    "The for statement",
    "A class definition",
    "Exceptions are raised",
    "The import system",
]
MESSAGES = [{"role": "user", "content": "What does the with statement do?"}]
TIMING_KEYS = {"queue_ms", "ttft_ms", "tpot_ms", "e2e_ms", "cached_prompt_tokens", "preemptions"}
GREEDY = {"temperature": 0.0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=512, max_num_seqs=64)
    with running_server(engine, model_name="tiny") as state:
        yield state


def client(state) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def wait_until_idle(state, timeout: float = 10.0) -> None:
    core = state.engine.engine
    deadline = time.monotonic() + timeout
    while state.engine.num_in_flight or core.num_running or core.num_waiting:
        assert time.monotonic() < deadline, "requests still in flight"
        time.sleep(0.01)


async def stream_completion(api: openai.AsyncOpenAI, prompt, **params) -> str:
    stream = await api.completions.create(model="tiny", prompt=prompt, stream=True, **params)
    return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])


def test_completion_whole_response_has_the_openai_shape_usage_and_timing(server):
    async def run():
        async with client(server) as api:
            return await api.completions.create(model="tiny", prompt=PROMPTS[0], **GREEDY)

    completion = asyncio.run(run())
    assert completion.id.startswith("cmpl-")
    assert completion.object == "text_completion"
    assert completion.model == "tiny"
    assert completion.created > 0
    [choice] = completion.choices
    assert choice.index == 0
    assert choice.finish_reason in ("stop", "length")
    assert choice.text
    prompt_tokens = len(server.tokenizer.encode(PROMPTS[0]))
    assert completion.usage.prompt_tokens == prompt_tokens
    assert completion.usage.total_tokens == prompt_tokens + completion.usage.completion_tokens
    assert set(completion.model_extra["timing"]) == TIMING_KEYS
    assert completion.model_extra["timing"]["e2e_ms"] > 0


def test_completion_stream_ends_with_timing_then_a_usage_chunk(server):
    async def run():
        async with client(server) as api:
            stream = await api.completions.create(
                model="tiny",
                prompt=PROMPTS[1],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
                **GREEDY,
            )
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    *deltas, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == GREEDY["max_tokens"]
    assert set(usage_chunk.model_extra["timing"]) == TIMING_KEYS
    finishing = [c for c in deltas if c.choices[0].finish_reason is not None]
    assert finishing == [deltas[-1]]
    assert deltas[-1].choices[0].finish_reason == "length"
    assert set(deltas[-1].model_extra["timing"]) == TIMING_KEYS
    assert all("timing" not in (c.model_extra or {}) for c in deltas[:-1])
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)


def test_chat_streams_role_first_and_counts_the_template_prompt_without_double_bos(server):
    tokenizer = server.tokenizer
    prompt_ids = tokenizer.encode_chat(MESSAGES)
    assert prompt_ids.count(tokenizer.bos_token_id) == 1

    async def run():
        async with client(server) as api:
            whole = await api.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
            stream = await api.chat.completions.create(
                model="tiny",
                messages=MESSAGES,
                stream=True,
                stream_options={"include_usage": True},
                **GREEDY,
            )
            return whole, [chunk async for chunk in stream]

    whole, chunks = asyncio.run(run())
    assert whole.id.startswith("chatcmpl-") and whole.object == "chat.completion"
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(prompt_ids)
    assert set(whole.model_extra["timing"]) == TIMING_KEYS
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == len(prompt_ids)
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_text_parts_and_max_completion_tokens_are_accepted(server):
    parts = [{"role": "user", "content": [{"type": "text", "text": MESSAGES[0]["content"]}]}]

    async def run():
        async with client(server) as api:
            return await api.chat.completions.create(
                model="tiny",
                messages=parts,
                max_completion_tokens=3,
                extra_body={"ignore_eos": True},
            )

    assert asyncio.run(run()).usage.completion_tokens == 3


def test_several_prompts_become_indexed_choices_equal_to_single_requests(server):
    token_prompt = server.tokenizer.encode(PROMPTS[3])
    prompts = [PROMPTS[0], PROMPTS[2], token_prompt]

    async def run():
        async with client(server) as api:
            singles = [
                (await api.completions.create(model="tiny", prompt=p, **GREEDY)).choices[0].text
                for p in prompts
            ]
            whole = await api.completions.create(model="tiny", prompt=prompts, **GREEDY)
            stream = await api.completions.create(
                model="tiny", prompt=prompts, stream=True, **GREEDY
            )
            streamed = ["", "", ""]
            async for chunk in stream:
                streamed[chunk.choices[0].index] += chunk.choices[0].text
            return singles, whole, streamed

    singles, whole, streamed = asyncio.run(run())
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.text for c in whole.choices] == singles
    assert streamed == singles
    prompt_tokens = sum(len(server.tokenizer.encode(p)) for p in prompts[:2]) + len(token_prompt)
    assert whole.usage.prompt_tokens == prompt_tokens


def test_token_id_prompt_equals_its_text_prompt(server):
    async def run():
        async with client(server) as api:
            ids = server.tokenizer.encode(PROMPTS[2])
            by_ids = await api.completions.create(model="tiny", prompt=ids, **GREEDY)
            by_text = await api.completions.create(model="tiny", prompt=PROMPTS[2], **GREEDY)
            return by_ids.choices[0].text, by_text.choices[0].text

    by_ids, by_text = asyncio.run(run())
    assert by_ids == by_text


async def websocket_text(state, prompt: str, params: dict) -> str:
    async with connect(f"ws://127.0.0.1:{state.settings.port}/v1/ws") as ws:
        frame = {"type": "generate", "id": 1, "prompt": prompt, **params}
        await ws.send(orjson.dumps(frame).decode())
        text = ""
        while (frame := orjson.loads(await ws.recv()))["type"] == "token":
            text += frame["text"]
        assert frame["type"] == "done", frame
        return text


def test_greedy_text_is_identical_over_sse_whole_websocket_and_offline(server, llama_checkpoint):
    params = {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True}
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=64)
    offline = [r.text for r in llm.generate(PROMPTS, SamplingParams(**params))]

    async def run():
        async with client(server) as api:
            extra = {"extra_body": {"ignore_eos": True}}
            sampling = {"temperature": 0.0, "max_tokens": 24, **extra}
            whole = [
                (await api.completions.create(model="tiny", prompt=p, **sampling)).choices[0].text
                for p in PROMPTS
            ]
            sse = [await stream_completion(api, p, **sampling) for p in PROMPTS]
        ws = [await websocket_text(server, p, params) for p in PROMPTS]
        return whole, sse, ws

    whole, sse, ws = asyncio.run(run())
    assert whole == offline
    assert sse == offline
    assert ws == offline


def test_64_concurrent_streams_each_equal_their_solo_output(server):
    prompts = [f"{PROMPTS[i % 4]} number {i}" for i in range(64)]
    params = {"temperature": 0.0, "max_tokens": 16, "extra_body": {"ignore_eos": True}}

    async def run():
        async with client(server) as api:
            solo = [await stream_completion(api, p, **params) for p in prompts]
            together = await asyncio.gather(*(stream_completion(api, p, **params) for p in prompts))
            return solo, together

    solo, together = asyncio.run(run())
    assert together == solo
    wait_until_idle(server)


def test_logprobs_come_in_each_endpoints_shape(server):
    async def run():
        async with client(server) as api:
            text = await api.completions.create(
                model="tiny", prompt=PROMPTS[0], logprobs=2, **GREEDY
            )
            chat = await api.chat.completions.create(
                model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=3, **GREEDY
            )
            return text, chat

    text, chat = asyncio.run(run())
    legacy = text.choices[0].logprobs
    n = text.usage.completion_tokens
    assert len(legacy.tokens) == len(legacy.token_logprobs) == len(legacy.text_offset) == n
    assert all(len(top) <= 2 and all(lp <= 0 for lp in top.values()) for top in legacy.top_logprobs)
    assert legacy.text_offset == sorted(legacy.text_offset)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        # Greedy: the sampled token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_hanging_up_aborts_streaming_and_whole_requests(server):
    kv_before = server.engine.engine.kv_cache.usage
    # 1,000 tokens take over a second here; idle 0.3 s after hanging up means aborted.
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 1000, "ignore_eos": True}
    url = f"{base_url(server)}/v1/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    wait_until_idle(server, timeout=0.3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, timeout=0.2)
    wait_until_idle(server, timeout=0.3)
    assert server.engine.engine.kv_cache.usage == kv_before
