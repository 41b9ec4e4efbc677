"""`POST /v1/embeddings` and the pooling requests behind it: last-token and mean pooling equal
to transformers' final hidden states (after the final norm), L2-normalised, alone, batched, in
prefill chunks smaller than the prompt and beside a warm prefix cache, on the native and the
generic path; and the endpoint through the official `openai` client, as floats and base64."""

from __future__ import annotations

import asyncio
import base64
import random
import struct
import time

import httpx
import openai
import pytest
import torch

from baton.core.engine import Engine
from baton.core.pooling import Pooling
from baton.core.request import EngineRequest
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from tests.server_harness import base_url, model_engine, running_server


def prompts(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def reference_model(llama_checkpoint):
    import transformers

    return transformers.AutoModel.from_pretrained(llama_checkpoint, dtype=torch.float32)


def reference(model, prompt: list[int], pooling: Pooling) -> torch.Tensor:
    """transformers' last hidden state (after the final norm) pooled and normalised."""
    with torch.no_grad():
        hidden = model(torch.tensor([prompt])).last_hidden_state[0].float()
    pooled = hidden[-1] if pooling is Pooling.LAST else hidden.mean(dim=0)
    return torch.nn.functional.normalize(pooled, dim=0)


def embed(
    engine: Engine, batch: list[list[int]], pooling: Pooling, tag: str = "embed"
) -> list[list[float]]:
    """Each prompt's embedding, all submitted together and stepped to the end."""
    params = SamplingParams(max_tokens=0, pooling=pooling)
    for index, prompt in enumerate(batch):
        spec = EngineRequest(f"{tag}-{pooling.value}-{index}", prompt, params)
        engine.add_request(engine.validator.validate(spec))
    found: dict[str, list[float]] = {}
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.finished:
                assert output.embedding is not None
                assert output.new_token_ids == []
                found[output.request_id] = output.embedding
    return [found[f"{tag}-{pooling.value}-{i}"] for i in range(len(batch))]


def assert_equal_reference(model, batch, embeddings, pooling: Pooling) -> None:
    for prompt, embedding in zip(batch, embeddings, strict=True):
        vector = torch.tensor(embedding)
        assert float(vector.norm()) == pytest.approx(1.0, abs=1e-5)
        torch.testing.assert_close(vector, reference(model, prompt, pooling), atol=1e-4, rtol=0)


@pytest.mark.parametrize("pooling", list(Pooling))
def test_pooled_embeddings_equal_transformers_batched(llama_checkpoint, reference_model, pooling):
    batch = prompts((40, 7, 23), seed=1)
    engine = model_engine(llama_checkpoint, num_kv_blocks=64)
    embeddings = embed(engine, batch, pooling)
    assert_equal_reference(reference_model, batch, embeddings, pooling)


@pytest.mark.parametrize("pooling", list(Pooling))
def test_pooled_embeddings_survive_small_chunks_and_a_warm_prefix_cache(
    llama_checkpoint, reference_model, pooling
):
    batch = prompts((70, 45), seed=2)
    # Chunks of 16 split each prompt over several steps; the cache holds every block of both
    # prompts from the first round, which a mean must not read and a last-token pool may.
    engine = model_engine(
        llama_checkpoint, num_kv_blocks=64, max_num_batched_tokens=16, enable_prefix_caching=True
    )
    assert_equal_reference(reference_model, batch, embed(engine, batch, pooling), pooling)
    hits_before = engine.scheduler.prefix_cache_hits
    again = embed(engine, batch, pooling, tag="again")
    assert_equal_reference(reference_model, batch, again, pooling)
    hits = engine.scheduler.prefix_cache_hits - hits_before
    assert (hits == 0) if pooling is Pooling.MEAN else (hits > 0)


def test_a_mean_preempted_mid_prompt_starts_its_sum_again(llama_checkpoint, reference_model):
    # A pool of 6 blocks of 16 tokens cannot hold the embedded prompt beside a long-running
    # generation, so the embedding is preempted between chunks and computed again.
    engine = model_engine(llama_checkpoint, num_kv_blocks=6, max_num_batched_tokens=24)
    other = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    engine.add_request(engine.validator.validate(EngineRequest("other", list(range(3, 40)), other)))
    engine.step()
    prompt = prompts((64,), seed=4)[0]
    params = SamplingParams(max_tokens=0, pooling=Pooling.MEAN)
    engine.add_request(engine.validator.validate(EngineRequest("mean", prompt, params)))
    final = None
    while engine.has_unfinished_requests:
        for output in engine.step():
            if output.request_id == "mean" and output.finished:
                final = output
    assert final is not None and final.timing is not None
    assert final.timing.preemptions > 0
    assert_equal_reference(reference_model, [prompt], [final.embedding], Pooling.MEAN)


def test_generic_path_pools_the_same_hidden_states(llama_checkpoint, reference_model):
    batch = prompts((30, 12), seed=3)
    engine = model_engine(
        llama_checkpoint, num_kv_blocks=64, model_impl="transformers", max_num_batched_tokens=16
    )
    for pooling in Pooling:
        assert_equal_reference(reference_model, batch, embed(engine, batch, pooling), pooling)


def test_a_pooling_request_must_not_generate():
    with pytest.raises(InvalidRequestError, match="max_tokens must be 0"):
        SamplingParams(max_tokens=4, pooling=Pooling.LAST)
    with pytest.raises(InvalidRequestError, match="pooling must be one of last, mean"):
        SamplingParams(max_tokens=0, pooling="cls")
    assert SamplingParams(max_tokens=0, pooling="mean").pooling is Pooling.MEAN


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    engine = model_engine(llama_checkpoint, num_kv_blocks=256, max_num_batched_tokens=32)
    with running_server(engine, model_name="tiny") as state:
        yield state


def client(state) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url(state)}/v1", api_key="x", max_retries=0)


def create(state, **body):
    async def run():
        async with client(state) as api:
            return await api.embeddings.create(model="tiny", **body)

    return asyncio.run(run())


TEXTS = ["The for statement", "A class definition that runs on for a while longer"]


def test_openai_client_gets_float_and_base64_embeddings_equal_to_transformers(
    server, reference_model
):
    as_floats = create(server, input=TEXTS, encoding_format="float")
    # The client asks for base64 when no format is given, and decodes it itself.
    as_base64 = create(server, input=TEXTS)
    assert as_floats.object == "list"
    assert as_floats.model == "tiny"
    token_ids = [server.tokenizer.encode(text) for text in TEXTS]
    assert as_floats.usage.prompt_tokens == sum(len(ids) for ids in token_ids)
    assert as_floats.usage.total_tokens == as_floats.usage.prompt_tokens
    assert [item.index for item in as_floats.data] == [0, 1]
    assert all(item.object == "embedding" for item in as_floats.data)
    embeddings = [item.embedding for item in as_floats.data]
    assert_equal_reference(reference_model, token_ids, embeddings, Pooling.LAST)
    for floats, encoded in zip(as_floats.data, as_base64.data, strict=True):
        assert encoded.embedding == pytest.approx(floats.embedding, abs=1e-6)


def test_token_id_inputs_equal_their_text_and_mean_is_asked_per_request(server, reference_model):
    ids = server.tokenizer.encode(TEXTS[1])
    text = create(server, input=TEXTS[1], encoding_format="float").data[0].embedding
    one = create(server, input=ids, encoding_format="float").data[0].embedding
    several = create(server, input=[ids, ids[:5]], encoding_format="float", user="someone")
    assert one == pytest.approx(text, abs=1e-6)
    assert several.data[0].embedding == pytest.approx(text, abs=1e-6)
    mean = create(server, input=ids, encoding_format="float", extra_body={"pooling": "mean"})
    assert_equal_reference(reference_model, [ids], [mean.data[0].embedding], Pooling.MEAN)


def test_raw_base64_is_little_endian_float32(server):
    async def run():
        async with client(server) as api:
            response = await api.embeddings.with_raw_response.create(
                model="tiny", input="raw bytes", encoding_format="base64"
            )
            return response.http_response.json()

    body = asyncio.run(run())
    raw = base64.b64decode(body["data"][0]["embedding"])
    floats = create(server, input="raw bytes", encoding_format="float").data[0].embedding
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, abs=1e-6)


def test_refusals_come_in_the_openai_error_shape(server):
    hidden = len(create(server, input="x", encoding_format="float").data[0].embedding)
    assert len(create(server, input="x", dimensions=hidden).data[0].embedding) == hidden
    cases = [
        ({"input": "x", "dimensions": hidden // 2}, 400, "dimensions"),
        ({"input": []}, 400, "input"),
        ({"input": [[5, 100000]]}, 400, "input"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ]
    for body, status, param in cases:
        with pytest.raises(openai.APIStatusError) as caught:
            create(server, **body)
        assert caught.value.status_code == status
        assert caught.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):
        asyncio.run(_create_for_model(server, "other"))


async def _create_for_model(state, model: str):
    async with client(state) as api:
        return await api.embeddings.create(model=model, input="x")


def test_hanging_up_aborts_every_input(server):
    # Hundreds of inputs in 32-token steps take seconds here; idle soon after hanging up means
    # the inputs still queued or running were aborted.
    body = {"model": "tiny", "input": prompts((200,) * 200, seed=5), "encoding_format": "float"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url(server)}/v1/embeddings", json=body, timeout=0.3)
    core = server.engine.engine
    deadline = time.monotonic() + 1.0
    while server.engine.num_in_flight or core.num_running or core.num_waiting:
        assert time.monotonic() < deadline, "inputs still in flight after the client hung up"
        time.sleep(0.01)
