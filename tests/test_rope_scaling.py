"""Rope scaling against transformers' own frequency functions: linear, dynamic, yarn and
longrope frequencies and attention factors, and a yarn-scaled Llama's greedy output."""

from __future__ import annotations

import math

import pytest
import torch

from baton.app.llm import LLM
from baton.core.checkpoint.rope_config import rope_config
from baton.core.sampling_params import SamplingParams
from baton.kernels.rotary import build_cos_sin_cache, rope_attention_factor, rope_inv_freq
from tests.test_greedy_vs_transformers import (
    assert_same_or_near_tie,
    random_prompts,
    transformers_greedy,
)

HEAD_DIM = 32
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
    "long_factor": [2.0 + 0.3 * i for i in range(HEAD_DIM // 2)],
    "original_max_position_embeddings": 256,
}
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 256,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
    },
    "longrope": LONGROPE,
}


def hf_config(scaling: dict):
    import transformers

    return transformers.LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=1024,
        rope_parameters={"rope_theta": 10000.0, **scaling},
    )


def raw_config(scaling: dict) -> dict:
    return {"max_position_embeddings": 1024, "rope_parameters": {"rope_theta": 10000.0, **scaling}}


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_frequencies_and_attention_factor_equal_transformers(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = SCALINGS[name]
    rope = rope_config(raw_config(scaling))
    init = ROPE_INIT_FUNCTIONS[scaling["rope_type"]]
    expected, factor = init(hf_config(scaling), "cpu")
    torch.testing.assert_close(rope_inv_freq(rope, HEAD_DIM), expected.float())
    assert rope_attention_factor(rope) == pytest.approx(factor)
    if name in ("dynamic", "longrope"):
        # Past the original context both grow with the sequence, as transformers recomputes.
        for seq_len in (1500, 3000):
            grown, _ = init(hf_config(scaling), "cpu", seq_len=seq_len)
            torch.testing.assert_close(rope_inv_freq(rope, HEAD_DIM, seq_len), grown.float())


def test_the_cache_scales_cos_and_sin_by_the_attention_factor():
    rope = rope_config(raw_config(SCALINGS["yarn"]))
    cache = build_cos_sin_cache(rope, HEAD_DIM, 8)
    factor = 0.1 * math.log(4.0) + 1.0
    torch.testing.assert_close(cache[0], torch.cat([torch.full((16,), factor), torch.zeros(16)]))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["linear", "yarn", "dynamic"])
def test_scaled_llama_greedy_output_equals_transformers(tmp_path, hf_tokenizer, name):
    import transformers

    from baton.tools.random_checkpoint import write_checkpoint

    scaling = {"rope_theta": 10000.0, **SCALINGS[name]}
    path = write_checkpoint(tmp_path, "llama", tokenizer=hf_tokenizer, rope_parameters=scaling)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompts = random_prompts(512, lengths=(5, 90))
    llm = LLM(path, device="cpu", max_num_batched_tokens=32, num_kv_blocks=64)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    for prompt, result in zip(prompts, llm.generate(prompts, params), strict=True):
        expected = transformers_greedy(reference.eval(), prompt, 12)
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)
