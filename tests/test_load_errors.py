"""Checkpoints Baton cannot serve are refused before anything heavy loads, each with a message
that names what was found and what to do; `baton serve` prints it and exits 2, no traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from baton.app.cli import main
from baton.core.checkpoint.checkpoint_check import CheckpointFormatError, check_checkpoint


def serve_error(model: str | Path, capsys, *flags: str) -> str:
    """What `baton serve --model MODEL` prints on stderr; it must exit 2 without a traceback."""
    code = main(["serve", "--model", str(model), "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def folder_with_config(tmp_path: Path, llama_checkpoint: Path, **changes) -> Path:
    """A copy of the tiny Llama checkpoint whose config.json has `changes` merged in."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(llama_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_a_truncated_gguf_file_is_refused_as_unreadable(tmp_path, capsys):
    gguf = tmp_path / "llama-3-8b.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    err = serve_error(gguf, capsys)
    assert f"{gguf} is not a readable GGUF file" in err and "is the download complete?" in err


def test_a_folder_of_gguf_files_is_named_as_gguf_and_sent_through_the_conversion(tmp_path):
    # The loader reads checkpoint folders; GGUF reaches it converted (tests/test_gguf.py).
    (tmp_path / "model.Q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointFormatError, match="is GGUF, which Baton reads once converted"):
        check_checkpoint(tmp_path)


def test_a_hub_id_given_to_the_offline_api_says_how_to_fetch_it():
    # `baton serve` resolves a hub id to its folder first (tests/test_model_hub.py); the
    # offline API takes a folder.
    with pytest.raises(CheckpointFormatError) as raised:
        check_checkpoint("meta-llama/Llama-3.1-8B-Instruct")
    assert str(raised.value) == (
        "meta-llama/Llama-3.1-8B-Instruct is not a local folder: `baton serve "
        "meta-llama/Llama-3.1-8B-Instruct` fetches it from the hub; here, pass the folder "
        "`huggingface_hub.snapshot_download('meta-llama/Llama-3.1-8B-Instruct')` returns"
    )


def test_a_missing_path_that_is_no_hub_id_is_just_missing(tmp_path):
    with pytest.raises(CheckpointFormatError, match="does not exist"):
        check_checkpoint(tmp_path / "no" / "such" / "folder")


@pytest.mark.parametrize(
    ("quantization", "named"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "GPTQ"),
        ({"quant_method": "awq", "bits": 4, "version": "gemm"}, "AWQ"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
        ({"load_in_8bit": True}, "bitsandbytes"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8"),
    ],
    ids=["gptq", "awq", "bnb-4bit", "bnb-8bit-unnamed", "fp8"],
)
def test_a_quantized_checkpoint_names_its_format_and_what_is_supported(
    tmp_path, llama_checkpoint, capsys, quantization, named
):
    folder = folder_with_config(tmp_path, llama_checkpoint, quantization_config=quantization)
    err = serve_error(folder, capsys)
    assert f"is quantized ({named}, from config.json's quantization_config)" in err
    assert "unquantized weights in float32, bfloat16 and float16 only" in err


def test_autogptq_quantize_config_json_counts_as_gptq(tmp_path, llama_checkpoint):
    folder = folder_with_config(tmp_path, llama_checkpoint)
    (folder / "quantize_config.json").write_text(json.dumps({"bits": 4}))
    with pytest.raises(CheckpointFormatError, match=r"quantized \(GPTQ"):
        check_checkpoint(folder)


def test_pytorch_bin_weights_only_say_how_to_convert(tmp_path, llama_checkpoint, capsys):
    folder = folder_with_config(tmp_path, llama_checkpoint)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80")
    err = serve_error(folder, capsys)
    assert "has only PyTorch .bin weights; Baton loads *.safetensors" in err
    assert f"M.from_pretrained('{folder}').save_pretrained('{folder}-safetensors')" in err


@pytest.mark.parametrize(
    ("changes", "kind"),
    [
        ({"architectures": ["BertModel"], "model_type": "bert"}, "not a causal language model"),
        (
            {"architectures": ["T5ForConditionalGeneration"], "is_encoder_decoder": True},
            "an encoder-decoder model",
        ),
    ],
    ids=["bert", "t5"],
)
def test_an_architecture_that_is_not_a_causal_lm_says_so(
    tmp_path, llama_checkpoint, capsys, changes, kind
):
    folder = folder_with_config(tmp_path, llama_checkpoint, **changes)
    err = serve_error(folder, capsys)
    assert f"holds {changes['architectures'][0]}, {kind}" in err
    assert "Baton generates text with decoder-only causal LMs" in err


def test_an_architecture_transformers_does_not_know_needs_no_remote_code(
    tmp_path, llama_checkpoint, capsys
):
    folder = folder_with_config(
        tmp_path,
        llama_checkpoint,
        architectures=["FrobForCausalLM"],
        model_type="frob",
        auto_map={"AutoModelForCausalLM": "modeling_frob.FrobForCausalLM"},
    )
    err = serve_error(folder, capsys)
    assert "has no causal LM for" in err
    assert "Baton runs no code shipped with a checkpoint" in err


def test_baton_serve_prints_the_message_and_exits_2_in_a_real_process(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    result = subprocess.run(
        [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(gguf)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("baton: error: ")
    assert "is not a readable GGUF file" in result.stderr and "Traceback" not in result.stderr
