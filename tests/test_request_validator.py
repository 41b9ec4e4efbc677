"""Requests are validated once, by a pure validator built from the engine's settings and the
model's limits: it refuses with the messages clients have always seen, needs no engine, and
runs once per prompt at admission; the engine itself checks nothing twice, and the offline
API checks every prompt before it queues any."""

from __future__ import annotations

import httpx
import pytest

from baton.app.llm import LLM
from baton.core.config import EngineConfig
from baton.core.request import EngineRequest
from baton.core.request_validator import ModelLimits, RequestValidator
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from tests.factory import make_engine, make_request
from tests.server_harness import base_url, running_server, simulated_engine

LIMITS = ModelLimits(max_model_len=64, vocab_size=100, num_kv_blocks=4, block_size=16)


def validator(limits: ModelLimits = LIMITS, **config) -> RequestValidator:
    return RequestValidator(EngineConfig(block_size=limits.block_size, **config), limits)


@pytest.mark.parametrize(
    ("prompt", "sampling", "param", "message"),
    [
        ([], {}, "prompt", "the prompt is empty; send at least one token"),
        (
            [1] * 64,
            {},
            "prompt",
            "the prompt has 64 tokens but the context length is 64, which must also leave room "
            "for one generated token",
        ),
        ([1, 100], {}, "prompt", "token id 100 is outside the vocabulary [0, 100)"),
        ([1, -1], {}, "prompt", "token id -1 is outside the vocabulary [0, 100)"),
        (
            [1, 2],
            {"logit_bias": {150: 1.0}},
            "logit_bias",
            "logit_bias names token id 150, outside the vocabulary [0, 100)",
        ),
        (
            [1] * 10,
            {"max_tokens": 60},
            "max_tokens",
            "the prompt has 10 tokens and max_tokens is 60, but the context length is 64; "
            "lower max_tokens to at most 54 or shorten the prompt",
        ),
    ],
)
def test_refusals_name_the_field_and_say_what_to_change(prompt, sampling, param, message):
    with pytest.raises(InvalidRequestError) as refused:
        validator().validate(make_request("r", prompt, **sampling))
    assert (str(refused.value), refused.value.param) == (message, param)


def test_a_request_larger_than_the_whole_cache_is_refused_with_the_flag_to_raise():
    limits = ModelLimits(max_model_len=4096, vocab_size=100, num_kv_blocks=4, block_size=16)
    with pytest.raises(InvalidRequestError) as refused:
        validator(limits).validate(make_request("r", [1] * 50, max_tokens=20))
    assert str(refused.value) == (
        "the request needs 5 KV blocks (50 prompt + 20 max_tokens) but the whole cache has 4; "
        "lower max_tokens or start the server with more --num-kv-blocks"
    )


def test_unset_max_tokens_resolves_to_what_the_context_or_the_cache_holds():
    check = validator()
    by_context = check.validate(make_request("r", [1] * 10, max_tokens=None))
    assert by_context.sampling_params.max_tokens == 64 - 10
    roomy_context = ModelLimits(max_model_len=4096, vocab_size=100, num_kv_blocks=4, block_size=16)
    by_cache = validator(roomy_context).validate(make_request("r", [1] * 10, max_tokens=None))
    assert by_cache.sampling_params.max_tokens == 4 * 16 - 10


def test_a_valid_request_comes_back_unchanged():
    request = make_request("r", [1, 2, 3], max_tokens=5, priority=2)
    assert validator().validate(request) is request


def test_a_sliding_window_holds_fewer_blocks_but_a_static_slot_holds_them_all():
    windowed = ModelLimits(
        max_model_len=4096, vocab_size=100, num_kv_blocks=8, block_size=16, sliding_window=32
    )
    long = make_request("r", [1] * 200, max_tokens=100)
    assert validator(windowed, max_num_batched_tokens=32).validate(long) is long
    with pytest.raises(InvalidRequestError, match="KV blocks"):
        validator(windowed, max_num_batched_tokens=32, scheduling_policy="static").validate(long)


def test_priority_is_checked_as_a_64_bit_integer():
    with pytest.raises(InvalidRequestError, match="64-bit integer") as refused:
        validator().validate(make_request("r", [1, 2], priority=2**63))
    assert refused.value.param == "priority"


def test_the_engine_trusts_what_the_validator_passed():
    engine = make_engine()
    request = engine.validator.validate(make_request("r", [1, 2, 3], max_tokens=None))

    def refuse_everything(request: EngineRequest) -> EngineRequest:
        raise AssertionError("add_request validated again")

    engine.validator.validate = refuse_everything
    queued = engine.add_request(request)
    assert queued.sampling_params.max_tokens == 4096 - 3


def test_the_server_validates_each_prompt_once(llama_checkpoint):
    engine = simulated_engine(llama_checkpoint, max_num_seqs=8)
    calls = []
    validate = engine.validator.validate

    def counted(request: EngineRequest, default_max_tokens: int | None = None) -> EngineRequest:
        calls.append(request.request_id)
        return validate(request, default_max_tokens)

    engine.validator.validate = counted
    with running_server(engine, model_name="tiny") as state:
        body = {"model": "tiny", "prompt": ["one", "two"], "n": 3, "max_tokens": 2}
        response = httpx.post(f"{base_url(state)}/v1/completions", json=body, timeout=10)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 6
    # The first candidate of each prompt; the others differ only in their seed.
    assert len(calls) == 2


def test_the_offline_api_checks_every_prompt_before_queuing_any(llama_checkpoint):
    llm = LLM(llama_checkpoint, device="cpu", num_kv_blocks=16, max_model_len=128)
    with pytest.raises(InvalidRequestError, match="context length"):
        llm.generate([[1, 2, 3], [1] * 200], SamplingParams(max_tokens=2))
    assert not llm.engine.has_unfinished_requests
    (result,) = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
    assert len(result.token_ids) == 2
