"""OpenAI's sampling and scoring fields on a real server, read back with the official `openai`
client: `echo` with `logprobs` (and `max_tokens: 0`), vLLM's `prompt_logprobs`, `logit_bias`,
`n`, `best_of`, `seed`, and the clear 400s for what is refused."""

from __future__ import annotations

import asyncio

import httpx
import openai
import orjson
import pytest
import torch
from websockets.asyncio.client import connect

from baton.app.llm import LLM
from baton.core.batch import ScheduledSequence
from baton.core.request import EngineRequest
from baton.core.sampling_params import SamplingParams
from baton.gpu.sampler import Sampler
from tests.factory import add_request, make_engine
from tests.server_harness import base_url, model_engine, running_server, simulated_engine

PROMPT = "The for statement iterates over"
SAMPLED = {"temperature": 1.0, "max_tokens": 8, "seed": 1234}


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=256, max_num_seqs=32)
    with running_server(engine, model_name="tiny") as state:
        yield state


def complete(state, **params):
    async def run():
        api = openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)
        async with api:
            return await api.completions.create(model="tiny", **params)

    return asyncio.run(run())


def stream_chunks(state, **params) -> list:
    async def run():
        api = openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)
        async with api:
            stream = await api.completions.create(model="tiny", stream=True, **params)
            return [chunk async for chunk in stream]

    return asyncio.run(run())


def post(state, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url(state)}{path}", json=body, timeout=30)


def assert_refused(state, body: dict, param: str, fragment: str, path="/v1/completions") -> None:
    response = post(state, path, {"model": "tiny", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert fragment in error["message"]


def test_echo_with_max_tokens_zero_scores_the_prompt_as_transformers_does(server, llama_checkpoint):
    import transformers

    completion = complete(server, prompt=PROMPT, echo=True, logprobs=2, max_tokens=0)
    [choice] = completion.choices
    prompt_ids = server.tokenizer.encode(PROMPT)
    assert choice.text == PROMPT
    assert choice.finish_reason == "length"
    assert completion.usage.prompt_tokens == len(prompt_ids)
    assert completion.usage.completion_tokens == 0
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(prompt_ids)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.text_offset[0] == 0
    assert all(len(top) <= 2 for top in logprobs.top_logprobs[1:])
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32)
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([prompt_ids])).logits[0].float(), -1)
    expected = [float(reference[p, prompt_ids[p + 1]]) for p in range(len(prompt_ids) - 1)]
    assert logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)


def test_echo_puts_the_prompt_before_the_completion_streamed_or_not(server):
    params = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}
    whole = complete(server, **params).choices[0]
    num_prompt = len(server.tokenizer.encode(PROMPT))
    assert whole.text.startswith(PROMPT) and len(whole.text) > len(PROMPT)
    assert len(whole.logprobs.tokens) == num_prompt + 4
    assert whole.logprobs.token_logprobs[0] is None
    assert all(lp is not None for lp in whole.logprobs.token_logprobs[1:])
    # The completion's offsets continue after the echoed prompt.
    assert whole.logprobs.text_offset[num_prompt] == len(PROMPT)
    chunks = [c for c in stream_chunks(server, **params) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    streamed = [
        lp for c in chunks if c.choices[0].logprobs for lp in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == whole.logprobs.token_logprobs


def test_echo_without_logprobs_only_repeats_the_prompt(server):
    [choice] = complete(server, prompt=PROMPT, echo=True, max_tokens=0).choices
    assert choice.text == PROMPT and choice.logprobs is None


def test_vllm_prompt_logprobs_field_lists_each_prompt_token(server):
    response = post(
        server,
        "/v1/completions",
        {"prompt": PROMPT, "prompt_logprobs": 1, "max_tokens": 1, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    prompt_ids = server.tokenizer.encode(PROMPT)
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(prompt_ids) and entries[0] is None
    for token_id, entry in zip(prompt_ids[1:], entries[1:], strict=True):
        assert str(token_id) in entry
        assert entry[str(token_id)]["logprob"] <= 0
    assert choice["text"] and not choice["text"].startswith(PROMPT)


def test_max_tokens_zero_without_echo_is_refused(server):
    assert_refused(server, {"prompt": PROMPT, "max_tokens": 0}, "max_tokens", "echo")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}
    assert_refused(server, chat, "max_completion_tokens", "echo", "/v1/chat/completions")


def greedy_first_token(server, **params) -> int:
    completion = complete(server, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=0, **params)
    token = completion.choices[0].logprobs.tokens[0]
    return server.tokenizer.encode(token, add_special_tokens=False)[0]


def test_logit_bias_forces_and_bans_tokens_under_greedy(server):
    favourite = greedy_first_token(server)
    forced = 300 if favourite != 300 else 301
    assert greedy_first_token(server, logit_bias={str(forced): 100}) == forced
    assert greedy_first_token(server, logit_bias={str(favourite): -100}) != favourite
    whole = complete(
        server, prompt=PROMPT, max_tokens=6, temperature=0, logit_bias={str(forced): 100}
    ).choices[0]
    assert whole.text == server.tokenizer.decode([forced] * 6)


@pytest.mark.parametrize(
    ("logit_bias", "fragment"),
    [
        ({"100000": 5}, "outside the vocabulary"),
        ({"abc": 5}, "decimal strings"),
        ({"-3": 5}, "decimal strings"),
        ({"5": 100.5}, "[-100, 100]"),
        ({"5": "high"}, "finite number"),
        ({str(i): 1 for i in range(301)}, "at most 300"),
    ],
)
def test_bad_logit_bias_is_refused(server, logit_bias, fragment):
    assert_refused(server, {"prompt": PROMPT, "logit_bias": logit_bias}, "logit_bias", fragment)


def test_n_gives_indexed_choices_with_usage_counting_the_prompt_once(server):
    completion = complete(server, prompt=PROMPT, n=3, **SAMPLED)
    assert [c.index for c in completion.choices] == [0, 1, 2]
    texts = [c.text for c in completion.choices]
    assert len(set(texts)) > 1, "each choice samples with its own seed"
    assert completion.usage.prompt_tokens == len(server.tokenizer.encode(PROMPT))
    assert completion.usage.completion_tokens == 3 * SAMPLED["max_tokens"]
    # Seeded choices repeat, streamed too, whatever else shares their steps.
    assert [c.text for c in complete(server, prompt=PROMPT, n=3, **SAMPLED).choices] == texts
    chunks = stream_chunks(
        server, prompt=PROMPT, n=3, stream_options={"include_usage": True}, **SAMPLED
    )
    streamed = ["", "", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts
    assert chunks[-1].usage.completion_tokens == 3 * SAMPLED["max_tokens"]


def test_n_on_chat_gives_indexed_choices(server):
    async def run():
        api = openai.AsyncOpenAI(base_url=f"{base_url(server)}/v1", api_key="x", max_retries=0)
        async with api:
            return await api.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], n=2, **SAMPLED
            )

    completion = asyncio.run(run())
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 2 * SAMPLED["max_tokens"]


def test_best_of_returns_the_candidates_with_the_highest_cumulative_logprob(server):
    candidates = complete(server, prompt=PROMPT, n=4, logprobs=0, **SAMPLED).choices
    sums = [sum(c.logprobs.token_logprobs) for c in candidates]
    ranked = [candidates[i].text for i in sorted(range(4), key=lambda i: -sums[i])]
    best = complete(server, prompt=PROMPT, n=2, best_of=4, **SAMPLED)
    assert [c.text for c in best.choices] == ranked[:2]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices), "logprobs were not asked for"
    assert best.usage.completion_tokens == 4 * SAMPLED["max_tokens"]


def test_best_of_is_refused_below_n_and_with_streaming(server):
    assert_refused(server, {"prompt": PROMPT, "n": 3, "best_of": 2}, "best_of", "at least n")
    assert_refused(server, {"prompt": PROMPT, "best_of": 2, "stream": True}, "best_of", "stream")
    assert_refused(server, {"prompt": PROMPT, "n": 17}, "n", "[1, 16]")


def test_suffix_is_refused_with_a_reason(server):
    assert_refused(server, {"prompt": PROMPT, "suffix": "end"}, "suffix", "not supported")


def test_seeded_sampling_is_the_same_alone_and_in_any_batch(llama_checkpoint):
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=128)
    prompt = llm.tokenizer.encode(PROMPT)
    seeded = SamplingParams(temperature=1.0, max_tokens=10, seed=7, ignore_eos=True)
    alone = llm.generate([prompt], seeded)[0].token_ids
    others = [
        SamplingParams(temperature=0.8, max_tokens=12, seed=99, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=7, top_k=20, ignore_eos=True),
    ]
    batch = llm.generate(
        [llm.tokenizer.encode("import os"), prompt, prompt[:3], prompt],
        [others[0], seeded, others[1], others[2]],
    )
    assert batch[1].token_ids == alone
    chunked = LLM(llama_checkpoint, device="cpu", num_kv_blocks=128, max_num_batched_tokens=3)
    assert chunked.generate([prompt], seeded)[0].token_ids == alone
    # A later choice draws from its own seed: different from choice 0, repeatable itself.
    second = llm.generate([prompt], seeded.for_choice(1))[0].token_ids
    assert second != alone
    assert llm.generate([prompt], seeded.for_choice(1))[0].token_ids == second


def run_choices(policy: str) -> tuple:
    batches = []
    engine = make_engine(
        max_num_batched_tokens=512, on_batch=batches.append, scheduling_policy=policy
    )
    prompt = list(range(3, 67))  # 64 tokens: 3 full blocks can be shared, the last is computed
    params = SamplingParams(max_tokens=4, seed=3)
    for index in range(3):
        add_request(engine, EngineRequest(f"choice-{index}", prompt, params.for_choice(index)))
    add_request(engine, EngineRequest("other", list(range(100, 164)), params))
    while engine.has_unfinished_requests:
        engine.step()
    return engine, batches


@pytest.mark.parametrize("policy", ["fcfs", "slo"])
def test_choices_sharing_a_prompt_compute_it_once_and_read_it_from_the_cache(policy):
    engine, batches = run_choices(policy)
    assert engine.scheduler.prefix_cache_hits == 2 * 48
    assert sum(batch.num_prefill_tokens for batch in batches) == 64 + 2 * 16 + 64
    # The unrelated prompt is not held back: it starts in the first step with choice 0.
    assert {seq.request_id for seq in batches[0].sequences} == {"choice-0", "other"}


def test_static_batching_holds_no_choice_back_from_its_batch():
    _engine, batches = run_choices("static")
    assert len(batches[0].sequences) == 4


@pytest.mark.parametrize(
    ("fields", "param"), [({"n": 2}, "n"), ({"best_of": 2}, "best_of"), ({"echo": True}, "echo")]
)
def test_websocket_frames_take_one_choice_without_echo(server, fields, param):
    async def run():
        async with connect(f"ws://127.0.0.1:{server.settings.port}/v1/ws") as ws:
            frame = {"type": "generate", "id": "a", "prompt": PROMPT, **fields}
            await ws.send(orjson.dumps(frame).decode())
            return orjson.loads(await ws.recv())

    answer = asyncio.run(run())
    assert answer["type"] == "error" and answer["error"]["param"] == param


def test_logit_bias_moves_only_its_own_row_of_a_batch():
    logits = torch.zeros(3, 10)
    logits[:, 4] = 1.0  # every row's greedy choice is token 4 unless biased
    params = [
        SamplingParams(temperature=0.0, logit_bias={7: 100.0}),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logit_bias={4: -100.0, 2: 0.5}),
    ]
    seqs = [
        ScheduledSequence(f"r{i}", [1], 3, [0], True, p, [1, 1, 1, 1], 3)
        for i, p in enumerate(params)
    ]
    output = Sampler(10, [])(logits, seqs)
    assert output.sampled_token_ids == [7, 4, 2]


def test_each_choice_counts_against_the_queue_limit(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_num_seqs=2)
    with running_server(engine, max_queued_requests=2) as state:
        full = post(state, "/v1/completions", {"prompt": PROMPT, "n": 2, "best_of": 5})
        assert full.status_code == 429, full.text
        fits = post(state, "/v1/completions", {"prompt": PROMPT, "n": 4, "max_tokens": 2})
        assert fits.status_code == 200, fits.text
        assert len(fits.json()["choices"]) == 4


def test_every_streamed_choice_opens_with_its_echoed_prompt(server):
    chunks = stream_chunks(server, prompt=PROMPT, echo=True, n=2, max_tokens=3, temperature=0)
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert all(text.startswith(PROMPT) and len(text) > len(PROMPT) for text in texts)
