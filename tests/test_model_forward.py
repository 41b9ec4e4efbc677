"""Baton's model reproduces transformers' logits in float32, however a prompt is split into steps
and whatever else shares the packed batch; the paged KV cache is its only memory of the past."""

from __future__ import annotations

import json
import random
import shutil
from functools import cache
from pathlib import Path

import pytest
import torch

from baton.core.batch import Batch, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.input_batch import prepare_inputs
from baton.gpu.kv_cache import allocate_kv_caches
from baton.gpu.loader import load_model
from baton.kernels import paged_attention

BLOCK_SIZE = 4
NUM_BLOCKS = 128
PROMPT_LENGTH = 41
ATOL = RTOL = 1e-4

VARIANTS = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "llama-tied-mqa": ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
    "llama-attention-bias": ("llama", {"attention_bias": True}),
}
OLD_SPELLINGS = "llama3-old-spellings"


def with_old_config_spellings(source: Path, out: Path) -> Path:
    """A copy of a checkpoint whose config.json says `rope_theta`, `rope_scaling` (llama3) and
    `torch_dtype`, as checkpoints written before transformers 4.56 do."""
    shutil.copytree(source, out)
    raw = json.loads((out / "config.json").read_text())
    del raw["rope_parameters"], raw["dtype"]
    raw["torch_dtype"] = "float32"
    raw["rope_theta"] = 500000.0
    # A short original context, so the 8 frequencies of head_dim 16 fall in all three regimes.
    raw["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (out / "config.json").write_text(json.dumps(raw))
    return out


@pytest.fixture(scope="module", params=[*VARIANTS, OLD_SPELLINGS])
def checkpoint(request, make_checkpoint, tmp_path_factory) -> Path:
    if request.param == OLD_SPELLINGS:
        return with_old_config_spellings(
            make_checkpoint("llama"), tmp_path_factory.mktemp("old") / "ckpt"
        )
    family, overrides = VARIANTS[request.param]
    return make_checkpoint(family, **overrides)


@cache
def transformers_logits(path: Path, token_ids: tuple[int, ...]) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0]


def prompt(seed: int, length: int = PROMPT_LENGTH) -> tuple[int, ...]:
    rng = random.Random(seed)
    # Ids 0-2 are the test tokenizer's special tokens.
    return tuple(rng.randrange(3, 512) for _ in range(length))


class PagedModel:
    """Baton's model with its own KV cache, fed step by step as the engine would, with block
    tables drawn from a shuffled pool so no sequence's blocks are contiguous. `packed`: its
    linear layers run over packed weights, as the executor runs them on the CPU."""

    def __init__(self, path: Path, packed: bool = False) -> None:
        self.config = ModelConfig.from_pretrained(path)
        self.model = load_model(self.config, "cpu", torch.float32)
        if packed:
            assert self.model.pack_linear_weights(rows_hint=8)
        self.kv_caches = allocate_kv_caches(
            self.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu"
        )
        self.free_blocks = list(range(NUM_BLOCKS))
        random.Random(0).shuffle(self.free_blocks)
        self.block_tables: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def step(self, chunks: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """One packed forward over each request's next tokens: the logits after every token."""
        sequences = []
        for request_id, token_ids in chunks.items():
            start = self.num_computed.get(request_id, 0)
            table = self.block_tables.setdefault(request_id, [])
            while len(table) * BLOCK_SIZE < start + len(token_ids):
                table.append(self.free_blocks.pop())
            self.num_computed[request_id] = start + len(token_ids)
            sequences.append(
                ScheduledSequence(
                    request_id=request_id,
                    token_ids=token_ids,
                    start_position=start,
                    block_table=list(table),
                    sample=True,
                    sampling_params=SamplingParams(),
                    all_token_ids=token_ids,
                    num_prompt_tokens=len(token_ids),
                )
            )
        num_tokens = sum(map(len, chunks.values()))
        inputs = prepare_inputs(Batch(sequences, num_prefill_tokens=num_tokens), BLOCK_SIZE, "cpu")
        with torch.inference_mode():
            hidden = self.model(
                inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
            )
            logits = self.model.compute_logits(hidden)
        bounds = inputs.attn_metadata.query_start_loc
        return {rid: logits[bounds[i] : bounds[i + 1]] for i, rid in enumerate(chunks)}

    def run_in_chunks(self, token_ids: tuple[int, ...], chunk_sizes: list[int]) -> torch.Tensor:
        assert sum(chunk_sizes) == len(token_ids)
        logits, start = [], 0
        for size in chunk_sizes:
            logits.append(self.step({"r": list(token_ids[start : start + size])})["r"])
            start += size
        return torch.cat(logits)


def test_prefill_in_one_chunk_matches_transformers_logits(checkpoint: Path) -> None:
    token_ids = prompt(seed=1)

    ours = PagedModel(checkpoint).run_in_chunks(token_ids, [len(token_ids)])

    expected = transformers_logits(checkpoint, token_ids)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=RTOL)


def test_packed_linear_weights_match_transformers_logits(checkpoint: Path) -> None:
    token_ids = prompt(seed=1)

    ours = PagedModel(checkpoint, packed=True).run_in_chunks(token_ids, [16, 1, 24])

    expected = transformers_logits(checkpoint, token_ids)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=RTOL)


def test_prefill_in_chunks_through_the_paged_cache_matches_transformers_logits(
    checkpoint: Path,
) -> None:
    token_ids = prompt(seed=1)
    # Chunks end mid-block, on a block edge (5 + 11 = 16) and span several blocks.
    chunk_sizes = [5, 11, 3, 1, 21]

    ours = PagedModel(checkpoint).run_in_chunks(token_ids, chunk_sizes)

    expected = transformers_logits(checkpoint, token_ids)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=RTOL)


def test_token_by_token_decode_matches_transformers_logits(checkpoint: Path) -> None:
    token_ids = prompt(seed=1)

    ours = PagedModel(checkpoint).run_in_chunks(token_ids, [1] * len(token_ids))

    expected = transformers_logits(checkpoint, token_ids)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=RTOL)


def test_packed_batch_of_prefill_chunks_and_decodes_matches_transformers_per_request(
    checkpoint: Path,
) -> None:
    prompts = {"a": prompt(seed=2, length=30), "b": prompt(seed=3, length=9), "c": prompt(4, 17)}
    # Per step, each request's chunk size (0: not scheduled): prefills alongside decodes.
    schedule = [
        {"a": 13, "b": 1, "c": 17},
        {"a": 10, "b": 1, "c": 0},
        {"a": 7, "b": 1, "c": 0},
        *[{"a": 0, "b": 1, "c": 0}] * 6,
    ]
    model = PagedModel(checkpoint)
    logits: dict[str, list[torch.Tensor]] = {rid: [] for rid in prompts}
    done = dict.fromkeys(prompts, 0)
    for step in schedule:
        chunks = {}
        for rid, size in step.items():
            if size:
                chunks[rid] = list(prompts[rid][done[rid] : done[rid] + size])
                done[rid] += size
        for rid, rows in model.step(chunks).items():
            logits[rid].append(rows)

    for rid, token_ids in prompts.items():
        assert done[rid] == len(token_ids)
        expected = transformers_logits(checkpoint, token_ids)
        torch.testing.assert_close(torch.cat(logits[rid]), expected, atol=ATOL, rtol=RTOL)


def test_every_layer_of_a_step_follows_the_attention_plan_its_inputs_carry(
    make_checkpoint, monkeypatch
) -> None:
    path = make_checkpoint("llama")
    token_ids = prompt(seed=5, length=12)
    expected = PagedModel(path).run_in_chunks(token_ids, [9, 1, 1, 1])

    def plan_per_layer(*args):
        raise AssertionError("an attention layer planned the step again")

    # The step's inputs are planned once by baton.gpu.input_batch; a layer planning anew would call
    # this.
    monkeypatch.setattr(paged_attention, "cpu_attention_plan", plan_per_layer)
    ours = PagedModel(path).run_in_chunks(token_ids, [9, 1, 1, 1])

    assert torch.equal(ours, expected)


def test_old_config_spellings_select_llama3_rope_in_both_implementations(
    make_checkpoint, tmp_path: Path
) -> None:
    import transformers

    path = with_old_config_spellings(make_checkpoint("llama"), tmp_path / "ckpt")

    config = ModelConfig.from_pretrained(path)
    reference = transformers.AutoConfig.from_pretrained(path)

    assert (config.rope.rope_type, config.rope.theta, config.dtype) == (
        "llama3",
        500000.0,
        "float32",
    )
    assert config.rope.original_max_position_embeddings == 64
    assert reference.rope_parameters["rope_type"] == "llama3"
    assert reference.rope_parameters["rope_theta"] == 500000.0
