"""Loading checkpoints: sharded or single-file, tied heads, and errors that name the tensor."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from baton.core.checkpoint.model_config import ModelConfig
from baton.gpu.loader import CheckpointError, checkpoint_tensors, load_model, load_weights


def copy_with_tensors(source: Path, out: Path, edit) -> Path:
    """A copy of a single-file checkpoint whose tensors pass through `edit(dict) -> dict`."""
    shutil.copytree(source, out)
    tensors = edit(load_file(out / "model.safetensors"))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def load(path: Path) -> torch.nn.Module:
    return load_model(ModelConfig.from_pretrained(path), "cpu", torch.float32)


def test_sharded_checkpoint_loads_the_same_weights_as_a_single_file(
    make_checkpoint, tmp_path: Path
) -> None:
    import transformers

    single = make_checkpoint("qwen2")
    sharded = tmp_path / "sharded"
    reference = transformers.AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    reference.save_pretrained(sharded, max_shard_size="60KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3

    expected = load(single).state_dict()
    loaded = load(sharded).state_dict()

    assert loaded.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(loaded[name], tensor), name


def test_fused_projections_hold_the_checkpoint_slices_in_order(make_checkpoint) -> None:
    path = make_checkpoint("qwen2")
    tensors = load_file(path / "model.safetensors")

    model = load(path)

    attn = model.layers[1].self_attn
    prefix = "model.layers.1.self_attn"
    for weight in ("weight", "bias"):
        expected = torch.cat([tensors[f"{prefix}.{p}_proj.{weight}"] for p in "qkv"])
        assert torch.equal(getattr(attn.qkv_proj, weight), expected)
    mlp_prefix = "model.layers.1.mlp"
    expected = torch.cat(
        [tensors[f"{mlp_prefix}.gate_proj.weight"], tensors[f"{mlp_prefix}.up_proj.weight"]]
    )
    assert torch.equal(model.layers[1].mlp.gate_up_proj.weight, expected)


def test_tied_checkpoint_uses_the_embedding_as_lm_head(make_checkpoint) -> None:
    path = make_checkpoint("llama", tie_word_embeddings=True, num_key_value_heads=1)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")

    model = load(path)

    assert model.lm_head is None
    hidden = torch.randn(3, model.config.hidden_size)
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ model.embed_tokens.weight.T)


def test_checkpoint_without_lm_head_gets_tied_embeddings_even_if_config_says_untied(
    make_checkpoint, tmp_path: Path
) -> None:
    path = copy_with_tensors(
        make_checkpoint("llama"),
        tmp_path / "headless",
        lambda tensors: {k: v for k, v in tensors.items() if k != "lm_head.weight"},
    )

    model = load(path)

    assert model.lm_head is None


def test_missing_tensor_is_refused_by_name(make_checkpoint, tmp_path: Path) -> None:
    missing = "model.layers.1.self_attn.k_proj.weight"
    path = copy_with_tensors(
        make_checkpoint("llama"),
        tmp_path / "missing",
        lambda tensors: {k: v for k, v in tensors.items() if k != missing},
    )

    with pytest.raises(CheckpointError, match=re.escape(f"lacks 1 weight tensors: {missing}")):
        load(path)


def test_unexpected_tensor_is_refused_by_name(make_checkpoint, tmp_path: Path) -> None:
    path = copy_with_tensors(
        make_checkpoint("llama"),
        tmp_path / "extra",
        lambda tensors: {**tensors, "model.layers.0.mlp.down_proj.bias": torch.zeros(64)},
    )

    with pytest.raises(CheckpointError, match=re.escape("'model.layers.0.mlp.down_proj.bias'")):
        load(path)


def test_a_tensor_met_again_after_its_layer_was_handed_on_is_refused_as_a_repeat(
    make_checkpoint,
) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    model = load_model(config, "cpu", torch.float32)
    tensors = list(checkpoint_tensors(config.path))
    repeated = next(item for item in tensors if item[0].startswith("model.layers.0."))
    handed_on = []

    with pytest.raises(CheckpointError, match=re.escape(f"the tensor {repeated[0]!r} twice")):
        load_weights(model, config, iter([*tensors, repeated]), handed_on.append)
    assert len(handed_on) == config.num_hidden_layers


def test_tensor_of_the_wrong_shape_is_refused(make_checkpoint, tmp_path: Path) -> None:
    path = tmp_path / "wrong"
    shutil.copytree(make_checkpoint("llama"), path)
    raw = json.loads((path / "config.json").read_text())
    raw["intermediate_size"] = 96
    (path / "config.json").write_text(json.dumps(raw))

    # The first MLP tensor read is either gate/up [96, 64] or down [64, 96] by config.json.
    with pytest.raises(CheckpointError, match=r"config.json implies \((96, 64|64, 96)\)"):
        load(path)


def test_folder_without_safetensors_is_refused_with_advice(make_checkpoint, tmp_path: Path) -> None:
    path = tmp_path / "bin"
    shutil.copytree(make_checkpoint("llama"), path)
    (path / "model.safetensors").unlink()

    with pytest.raises(CheckpointError, match="safetensors only"):
        load(path)


def mapped_kib(file: Path) -> int:
    """Resident KiB of this process's mappings of `file` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.endswith(str(file))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_reading_a_checkpoint_keeps_one_tensors_pages_resident_not_the_files(
    make_checkpoint,
) -> None:
    # A mapping of the whole file kept every page read: the checkpoint twice at the peak.
    path = make_checkpoint("llama", hidden_size=256, intermediate_size=1024)
    file = (path / "model.safetensors").resolve()
    largest = 0
    most_resident = 0
    for _, tensor in checkpoint_tensors(path):
        tensor.sum()  # touch every page
        largest = max(largest, tensor.nbytes // 1024)
        most_resident = max(most_resident, mapped_kib(file))

    assert file.stat().st_size // 1024 > 4 * largest  # several tensors' worth
    # Plus the header and the kernel's fault-around (up to 64 KiB beside a fault), each end.
    assert most_resident <= largest + 256
