"""Native gpt-oss against transformers' own: greedy decoding batched, chunked, preempted and
prefix-cached on a tiny random checkpoint with a window shorter than the prompts; its experts
past the SwiGLU's clamp; its YaRN rope; its config; and MXFP4 checkpoints refused with what to
convert to."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from baton.app.llm import LLM
from baton.core.checkpoint.checkpoint_check import CheckpointFormatError, check_checkpoint
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.models.gpt_oss import GptOssMoE
from baton.kernels.linear import onednn_linear_available
from baton.kernels.rotary import build_cos_sin_cache
from tests.test_families_native import PREFILL_CHUNK, reference_model, shared_prefix_workload
from tests.test_greedy_vs_transformers import assert_same_or_near_tie, transformers_greedy

# Six requests of up to 88 tokens need about 30 blocks of 16 at once: 8 forces preemptions.
NUM_REQUESTS = 6
NUM_KV_BLOCKS = 8
NUM_NEW_TOKENS = 10


@pytest.fixture(scope="module")
def gpt_oss_checkpoint(make_checkpoint, tmp_path_factory):
    """Layers alternate a 16-token window and full attention (prompts run to 78 tokens), with
    sinks from -1 to 3 per head: the random initialization's are too close to 0 to matter much.
    A copy, so the session's shared checkpoint stays as transformers made it."""
    path = tmp_path_factory.mktemp("gpt-oss-sinks") / "checkpoint"
    shutil.copytree(make_checkpoint("gpt_oss"), path)
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    for name, tensor in tensors.items():
        if name.endswith(".sinks"):
            tensor.copy_(torch.linspace(-1.0, 3.0, tensor.numel()))
    save_file(tensors, weights, metadata={"format": "pt"})
    return path


def test_batched_chunked_preempted_greedy_equals_transformers(gpt_oss_checkpoint):
    reference = reference_model(gpt_oss_checkpoint)
    prompts = shared_prefix_workload(reference.config.vocab_size)[:NUM_REQUESTS]
    llm = LLM(
        gpt_oss_checkpoint,
        device="cpu",
        max_num_batched_tokens=PREFILL_CHUNK,
        num_kv_blocks=NUM_KV_BLOCKS,
        max_num_seqs=NUM_REQUESTS,
        # Arrival order: the same chunks every run, so a router's near tie cannot come and go.
        scheduling_policy="fcfs",
    )
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    scheduler = llm.engine.scheduler
    assert scheduler.num_preemptions > 0, "the pool was meant to be too small for the batch"
    assert scheduler.prefix_cache_hits > 0, "the shared prefix was meant to be reused"
    alone = llm.generate(prompts[:1], params)[0]
    assert alone.token_ids == results[0].token_ids
    for prompt, result in zip(prompts, results, strict=True):
        expected = transformers_greedy(reference, prompt, NUM_NEW_TOKENS)
        assert len(result.token_ids) == NUM_NEW_TOKENS
        assert_same_or_near_tie(reference, prompt, result.token_ids, expected)


def test_config_reads_sinks_biases_alternating_windows_and_experts(gpt_oss_checkpoint):
    config = ModelConfig.from_pretrained(gpt_oss_checkpoint)

    assert config.attention_sinks and config.qkv_bias and config.o_proj_bias
    assert [config.layer_window(i) for i in range(2)] == [16, None]
    # A full-attention layer reads the whole context: no block may be freed behind a window.
    assert config.freeable_window is None
    assert (config.moe, config.num_experts, config.num_experts_per_tok) == ("gpt_oss", 4, 2)
    assert (config.swiglu_alpha, config.swiglu_limit) == (1.702, 7.0)
    assert config.rope.rope_type == "yarn" and not config.rope.truncate


def test_yarn_rope_matches_transformers(gpt_oss_checkpoint):
    import transformers
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    config = ModelConfig.from_pretrained(gpt_oss_checkpoint)
    hf_config = transformers.AutoConfig.from_pretrained(gpt_oss_checkpoint)
    positions = torch.tensor([0, 1, 15, 16, 300, 1023])
    cos, sin = GptOssRotaryEmbedding(hf_config)(torch.zeros(1), positions[None])

    cache = build_cos_sin_cache(config.rope, config.head_dim, 1024)[positions]

    torch.testing.assert_close(cache, torch.cat((cos[0], sin[0]), dim=-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["stacked", "packed"])
def test_experts_match_transformers_past_the_swiglu_clamp(gpt_oss_checkpoint, packed):
    if packed and not onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear to pack the experts for")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = ModelConfig.from_pretrained(gpt_oss_checkpoint)
    hf_config = reference_model(gpt_oss_checkpoint).config
    torch.manual_seed(0)
    theirs = GptOssMLP(hf_config).eval()
    ours = GptOssMoE(config)
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            param.normal_(0.0, 0.5)
            ours.get_parameter(name).copy_(param)
    if packed:
        ours.pack(rows_hint=8)
    hidden = torch.randn(9, config.hidden_size) * 2.0
    gate_up = torch.einsum("th,ehi->tei", hidden, theirs.experts.gate_up_proj)
    assert (gate_up.abs() > config.swiglu_limit).any(), "the clamp was meant to engage"

    with torch.no_grad():
        expected, _ = theirs(hidden[None])
        actual = ours(hidden)

    torch.testing.assert_close(actual, expected[0], atol=1e-4, rtol=1e-4)


def test_an_mxfp4_checkpoint_is_refused_with_what_to_convert_to(tmp_path):
    config = {
        "architectures": ["GptOssForCausalLM"],
        "quantization_config": {"quant_method": "mxfp4"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))

    with pytest.raises(CheckpointFormatError, match="MXFP4") as refused:
        check_checkpoint(tmp_path, needs_weights=False)

    assert "Mxfp4Config(dequantize=True)" in str(refused.value)
    assert "\n" not in str(refused.value)
