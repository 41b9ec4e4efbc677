"""The whole model through the Triton kernels equals it through the torch references, and a
decode batch padded to a CUDA-graph bucket gives its real rows what the unpadded batch gives.

Without CUDA the kernels run on CPU tensors in Triton's interpreter (`TRITON_INTERPRET=1`, set
before any kernel module is imported) under `ops.force_triton()`; with CUDA they run natively and
the reference side runs under `ops.force_reference()`. Shapes are tiny: the interpreter executes
each program in Python.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig, RopeConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.input_batch import prepare_inputs
from baton.gpu.kv_cache import allocate_kv_caches
from baton.gpu.model_inputs import ModelInputs
from baton.gpu.models.model import CausalLM
from baton.kernels import ops
from tests.test_kernels_triton import Unreadable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_SIZE = 4
NUM_BLOCKS = 24
# A decode bucket's static bound long enough for the split-KV kernel
# (baton.kernels.ops.use_split_kv).
MAX_MODEL_LEN = 4096
ATOL = RTOL = 1e-4


def tiny_config(architecture: str, **overrides) -> ModelConfig:
    fields = dict(
        path=Path("unused"),
        architecture=architecture,
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_MODEL_LEN,
        rms_norm_eps=1e-6,
        rope=RopeConfig(),
        tie_word_embeddings=False,
        qkv_bias=False,
        o_proj_bias=False,
        qk_norm=False,
        dtype="float32",
    )
    return ModelConfig(**(fields | overrides))


CONFIGS = {
    # GQA 2 with llama3 frequency scaling.
    "llama": tiny_config(
        "LlamaForCausalLM",
        rope=RopeConfig(
            theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=64
        ),
    ),
    # q/k norm, GQA 4, a head dim apart from hidden_size / heads.
    "qwen3": tiny_config("Qwen3ForCausalLM", num_key_value_heads=1, head_dim=32, qk_norm=True),
    # Sinks, biases, YaRN, a 5-token window on the first layer and gpt-oss's experts.
    "gpt_oss": tiny_config(
        "GptOssForCausalLM",
        rope=RopeConfig(
            theta=150000.0,
            rope_type="yarn",
            factor=32.0,
            original_max_position_embeddings=4096,
            truncate=False,
        ),
        qkv_bias=True,
        o_proj_bias=True,
        attention_sinks=True,
        layer_windows=[5, None],
        moe="gpt_oss",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    # Phi-3-mini's head size, not a power of two: the kernels pad it to 128 lanes and mask.
    "phi3_head96": tiny_config(
        "Phi3ForCausalLM", num_attention_heads=2, num_key_value_heads=1, head_dim=96
    ),
}


def build_model(config: ModelConfig) -> CausalLM:
    """Every parameter drawn here: some modules leave theirs as allocated (the embedding table,
    the experts, the sinks), and memory as allocated may hold NaN."""
    torch.manual_seed(0)
    model = CausalLM(config, device=DEVICE).to(DEVICE).eval().requires_grad_(False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                # Away from one, so a kernel that skipped them would show.
                param.uniform_(0.5, 1.5)
            else:
                param.uniform_(-0.2, 0.2)
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_model_under_test_keeps_no_memory_as_allocated(name, monkeypatch):
    # Memory as allocated may hold anything, NaN included; here it always does.
    allocate = torch.empty

    def allocate_nan(*args, **kwargs) -> torch.Tensor:
        tensor = allocate(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    monkeypatch.setattr(torch, "empty", allocate_nan)
    model = build_model(CONFIGS[name])
    for param_name, param in model.named_parameters():
        assert torch.isfinite(param).all(), f"{param_name} was left as allocated"


class Sequences:
    """Requests fed step by step: each step's chunks get positions and slots after the last."""

    def __init__(self, block_tables: dict[str, list[int]]) -> None:
        self.block_tables = block_tables
        self.num_computed = dict.fromkeys(block_tables, 0)
        self.generator = torch.Generator().manual_seed(1)

    def step(self, query_lens: dict[str, int]) -> ModelInputs:
        sequences = []
        for request_id, query_len in query_lens.items():
            start = self.num_computed[request_id]
            self.num_computed[request_id] = start + query_len
            token_ids = torch.randint(0, 64, (query_len,), generator=self.generator).tolist()
            sequences.append(
                ScheduledSequence(
                    request_id=request_id,
                    token_ids=token_ids,
                    start_position=start,
                    block_table=self.block_tables[request_id],
                    sample=True,
                    sampling_params=SamplingParams(),
                    all_token_ids=token_ids,
                    num_prompt_tokens=query_len,
                )
            )
        batch = Batch(sequences, num_prefill_tokens=sum(query_lens.values()))
        return prepare_inputs(batch, BLOCK_SIZE, DEVICE)


# Block 0 belongs to "a", so the padding rows of a graph bucket read real (finite) K/V.
BLOCK_TABLES = {"a": [0, 7, 3, 12], "b": [5, 9], "c": [1, 14, 2], "d": [20], "e": [11]}
# History: prefill chunks ending mid-block (a, c), on a block edge (b) and one token (d).
HISTORY = {"a": 6, "b": 4, "c": 9, "d": 1}
# One chunk starting and ending mid-block after 6 cached tokens, decodes at a block's first slot
# (b), mid-block (c, d), and a one-token prompt at position 0 (e).
MIXED = {"a": 7, "b": 1, "c": 1, "d": 1, "e": 1}
DECODES = {"b": 1, "c": 1, "d": 1}


def forward(model: CausalLM, inputs: ModelInputs, kv_caches: list[torch.Tensor]) -> torch.Tensor:
    with torch.inference_mode():
        return model(inputs.input_ids, inputs.positions, inputs.attn_metadata, kv_caches)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_mixed_prefill_and_decode_forward_through_triton_matches_reference(name):
    config = CONFIGS[name]
    model = build_model(config)
    steps = Sequences(BLOCK_TABLES)
    history, mixed = steps.step(HISTORY), steps.step(MIXED)
    reference_caches = allocate_kv_caches(config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE)
    triton_caches = allocate_kv_caches(config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE)

    with ops.force_reference():
        expected = [forward(model, inputs, reference_caches) for inputs in (history, mixed)]
    with ops.force_triton():
        actual = [forward(model, inputs, triton_caches) for inputs in (history, mixed)]

    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    for got, want in zip(triton_caches, reference_caches, strict=True):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


def greedy_tokens(model: CausalLM, prompts: dict[str, list[int]], num_new: int) -> list[list[int]]:
    """Each prompt's `num_new` greedy tokens: prefilled together, then decoded together."""
    kv_caches = allocate_kv_caches(model.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE)
    tokens = {request_id: list(prompt) for request_id, prompt in prompts.items()}
    chunks = dict(tokens)
    for _ in range(num_new):
        sequences = [
            ScheduledSequence(
                request_id=request_id,
                token_ids=chunk,
                start_position=len(tokens[request_id]) - len(chunk),
                block_table=BLOCK_TABLES[request_id],
                sample=True,
                sampling_params=SamplingParams(),
                all_token_ids=tokens[request_id],
                num_prompt_tokens=len(prompts[request_id]),
            )
            for request_id, chunk in chunks.items()
        ]
        batch = Batch(sequences, num_prefill_tokens=sum(map(len, chunks.values())))
        inputs = prepare_inputs(batch, BLOCK_SIZE, DEVICE)
        hidden = forward(model, inputs, kv_caches)
        next_ids = model.compute_logits(hidden[inputs.logits_indices]).argmax(dim=-1).tolist()
        for request_id, next_id in zip(chunks, next_ids, strict=True):
            tokens[request_id].append(next_id)
        chunks = {request_id: [tokens[request_id][-1]] for request_id in chunks}
    return [tokens[request_id][len(prompt) :] for request_id, prompt in prompts.items()]


def test_head_size_96_model_decodes_greedily_through_triton_as_the_reference():
    model = build_model(CONFIGS["phi3_head96"])
    # Prompts ending mid-block and on a block's edge; decodes then cross into new blocks.
    prompts = {"a": [5, 17, 3, 42, 8, 61], "b": [9, 30, 2, 11]}
    with ops.force_reference():
        expected = greedy_tokens(model, prompts, 5)
    with ops.force_triton():
        actual = greedy_tokens(model, prompts, 5)
    assert actual == expected
    # A model whose random weights always pick one token would hide a wrong attention.
    assert len({token for row in expected for token in row}) > 2


def padded_to_bucket(inputs: ModelInputs, bucket: int, max_seq_len: int) -> ModelInputs:
    """A decode batch padded as a CUDA graph replays it: rows of query 1, seq_len 1, slot -1,
    an all-zero block table, token 0 at position 0; `max_seq_len` a static bound."""
    meta = inputs.attn_metadata
    num_seqs, width = meta.block_tables.shape
    padding = bucket - num_seqs
    block_tables = torch.zeros(bucket, -(-max_seq_len // BLOCK_SIZE), dtype=torch.int32)
    block_tables[:num_seqs, :width] = meta.block_tables.cpu()

    def padded(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat((tensor, torch.full((padding,), value, dtype=tensor.dtype, device=DEVICE)))

    metadata = dataclasses.replace(
        meta,
        slot_mapping=padded(meta.slot_mapping, -1),
        block_tables=block_tables.to(DEVICE),
        query_start_loc=Unreadable(),
        seq_lens=Unreadable(),
        query_start_loc_tensor=torch.arange(bucket + 1, dtype=torch.int32, device=DEVICE),
        seq_lens_tensor=padded(meta.seq_lens_tensor, 1),
        max_query_len=1,
        max_seq_len=max_seq_len,
    )
    return ModelInputs(
        input_ids=padded(inputs.input_ids, 0),
        positions=padded(inputs.positions, 0),
        attn_metadata=metadata,
        logits_indices=inputs.logits_indices,
    )


@pytest.fixture
def kernels_run(monkeypatch) -> list[str]:
    """The names of the attention kernels launched, in order."""
    import baton.kernels.paged_attention_split_kv_triton as split_kv
    import baton.kernels.paged_attention_triton as unified

    launched: list[str] = []
    for module, name in (
        (unified, "paged_attention_triton"),
        (split_kv, "paged_decode_split_kv_triton"),
    ):
        kernel = getattr(module, name)

        def recorded(*args, _kernel=kernel, _name=name, **kwargs):
            launched.append(_name)
            return _kernel(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    return launched


@pytest.mark.parametrize(
    ("max_seq_len", "kernel"),
    [(64, "paged_attention_triton"), (MAX_MODEL_LEN, "paged_decode_split_kv_triton")],
    ids=["unified", "split-kv"],
)
def test_decode_padded_to_a_graph_bucket_gives_real_rows_the_unpadded_output(
    max_seq_len, kernel, kernels_run
):
    config = CONFIGS["llama"]
    model = build_model(config)
    steps = Sequences(BLOCK_TABLES)
    history, decodes = steps.step(HISTORY), steps.step(DECODES)
    kv_caches = allocate_kv_caches(config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, DEVICE)
    with ops.force_triton():
        forward(model, history, kv_caches)
        before = [cache.clone() for cache in kv_caches]
        expected = forward(model, decodes, kv_caches)
        unpadded_caches = [cache.clone() for cache in kv_caches]
        for cache, saved in zip(kv_caches, before, strict=True):
            cache.copy_(saved)
        kernels_run.clear()
        actual = forward(model, padded_to_bucket(decodes, 8, max_seq_len), kv_caches)

    assert set(kernels_run) == {kernel}
    torch.testing.assert_close(actual[: len(DECODES)], expected, atol=1e-5, rtol=1e-5)
    # The padding rows wrote nothing: every slot but the real decodes' is as before the step.
    written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    written[decodes.attn_metadata.slot_mapping.cpu()] = True
    for cache, saved, unpadded in zip(kv_caches, before, unpadded_caches, strict=True):
        flat, flat_saved = cache.view(2, -1, *cache.shape[3:]), saved.view(2, -1, *cache.shape[3:])
        assert torch.equal(flat[:, ~written.to(DEVICE)], flat_saved[:, ~written.to(DEVICE)])
        torch.testing.assert_close(cache, unpadded, atol=1e-5, rtol=1e-5)
