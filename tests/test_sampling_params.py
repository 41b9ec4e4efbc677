"""SamplingParams validation: every bad value is refused with a message naming the field."""

from __future__ import annotations

import math

import pytest

from baton.core.sampling_params import InvalidRequestError, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "param", "fragment"),
    [
        ({"max_tokens": -1}, "max_tokens", "integer >= 0"),
        ({"max_tokens": 2.5}, "max_tokens", "integer >= 0"),
        ({"temperature": -0.1}, "temperature", "in [0, 100]"),
        ({"temperature": math.nan}, "temperature", "finite"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.01}, "top_p", "(0, 1]"),
        ({"top_k": -2}, "top_k", ">= -1"),
        ({"min_p": 1.5}, "min_p", "[0, 1]"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stop": ["x"] * 17}, "stop", "at most 16"),
        ({"stop": ["x" * 300]}, "stop", "at most 256"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "non-negative"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "must not exceed"),
        ({"repetition_penalty": 0.0}, "repetition_penalty", "in [0.01, 100]"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty", "in [0.01, 100]"),
        ({"temperature": 1e308}, "temperature", "in [0, 100]"),
        ({"presence_penalty": 3.0}, "presence_penalty", "[-2, 2]"),
        ({"logprobs": 21}, "logprobs", "[0, 20]"),
        ({"prompt_logprobs": -1}, "prompt_logprobs", "[0, 20]"),
        ({"logit_bias": {5: 100.5}}, "logit_bias", "[-100, 100]"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias", "token ids"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias", "token ids"),
        ({"logit_bias": {5: math.inf}}, "logit_bias", "finite"),
        ({"logit_bias": {i: 1.0 for i in range(301)}}, "logit_bias", "at most 300"),
        ({"seed": "7"}, "seed", "integer"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(kwargs, param, fragment):
    with pytest.raises(InvalidRequestError) as caught:
        SamplingParams(**kwargs)
    assert caught.value.param == param
    assert fragment in str(caught.value)


def test_valid_edges_are_accepted():
    params = SamplingParams(top_p=1.0, top_k=-1, temperature=0.0, stop="###", max_tokens=None)
    assert params.greedy and params.stop == ["###"]
    assert SamplingParams(top_k=1, temperature=0.8).greedy
    assert not SamplingParams().uses_penalties
    assert SamplingParams(frequency_penalty=0.5).uses_penalties
