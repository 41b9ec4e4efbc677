"""`--load-format dummy`: random weights from a config alone, and the shipped benchmark configs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baton.app.llm import LLM
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.sampling_params import SamplingParams
from baton.gpu.config_folder import write_config_folder
from baton.gpu.loader import CheckpointError, load_model
from baton.gpu.models.model import CausalLM

CONFIGS = Path(__file__).parent.parent / "benchmarks" / "configs"
# A Qwen3 shape whose vocabulary is larger than the 512-token tokenizer a config file gets.
TINY_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 999,
    "tie_word_embeddings": True,
}


@pytest.fixture
def tiny_config_file(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_CONFIG))
    return path


def greedy(llm: LLM) -> list[int]:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return llm.generate("The for statement", params)[0].token_ids


def test_dummy_engine_from_a_config_file_generates_repeatably(tiny_config_file):
    first = LLM(tiny_config_file, device="cpu", load_format="dummy", num_kv_blocks=16)
    second = LLM(tiny_config_file, device="cpu", load_format="dummy", num_kv_blocks=16)
    tokens = greedy(first)
    assert len(tokens) == 6 and all(0 <= t < TINY_CONFIG["vocab_size"] for t in tokens)
    assert greedy(second) == tokens  # seeded weights: the same config, the same model


def test_weightless_folder_loads_only_as_dummy(tiny_config_file, tmp_path):
    folder = write_config_folder(tiny_config_file, tmp_path / "weightless")
    config = ModelConfig.from_pretrained(folder)
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_model(config, "cpu", torch.float32)
    model = load_model(config, "cpu", torch.float32, load_format="dummy")
    assert torch.equal(model.norm.weight, torch.ones(TINY_CONFIG["hidden_size"]))
    assert 0.015 < model.embed_tokens.weight.std().item() < 0.025


def test_generate_cli_takes_load_format_dummy(tiny_config_file):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "baton.app.cli",
            "generate",
            "--model",
            str(tiny_config_file),
            "--load-format",
            "dummy",
            "--prompt",
            "hello",
            "--max-tokens",
            "4",
            "--ignore-eos",
            "--device",
            "cpu",
            "--num-kv-blocks",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "[4 tokens in" in result.stderr


# Published parameter counts of the architectures whose configs ship for GPU benchmarks.
@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-3.1-8b", 8.03),
        ("qwen2.5-0.5b", 0.494),
        ("qwen2.5-1.5b", 1.54),
        ("qwen3-0.6b", 0.596),
    ],
)
def test_shipped_benchmark_configs_have_the_published_sizes(name, billions, tmp_path):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text((CONFIGS / f"{name}.json").read_text())
    config = ModelConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = CausalLM(config, max_positions=16)
    num_params = sum(p.numel() for p in model.parameters())
    assert num_params / 1e9 == pytest.approx(billions, rel=0.01)
