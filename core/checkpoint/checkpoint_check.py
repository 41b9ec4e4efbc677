"""What `--model` points at, checked before anything heavy loads: each checkpoint Baton cannot
serve gets one error that names what was found and what to do instead.

Reads only file names and config.json, so a wrong path fails in milliseconds, before torch or
transformers are imported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# A hub id as people paste it: `owner/name`, nothing else.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# Names transformers gives its decoder-only text generators.
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
# quantization_config.quant_method -> the name users know the format by.
QUANT_METHODS = {
    "gptq": "GPTQ",
    "awq": "AWQ",
    "bitsandbytes": "bitsandbytes",
    "fp8": "FP8",
    "compressed-tensors": "compressed-tensors",
    "aqlm": "AQLM",
    "eetq": "EETQ",
    "hqq": "HQQ",
    "quanto": "Quanto",
    "exl2": "EXL2",
    "mxfp4": "MXFP4",
    "torchao": "torchao",
    "fbgemm_fp8": "FP8 (fbgemm)",
}
SUPPORTED_DTYPES = "float32, bfloat16 and float16"
CONVERT_BIN = (
    'python -c "from transformers import AutoModelForCausalLM as M; '
    "M.from_pretrained('{src}').save_pretrained('{dst}')\" and copy the tokenizer files beside it"
)


class CheckpointFormatError(ValueError):
    """A `--model` Baton cannot load; the message says what was found and what to do."""


def check_checkpoint(model: str | Path, *, needs_weights: bool = True) -> Path:
    """The checkpoint folder `model` names, or a `CheckpointFormatError` saying why it cannot be
    served. `needs_weights=False` (random weights) skips the weight-file checks."""
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or (path.is_dir() and _only_gguf(path)):
        raise CheckpointFormatError(_gguf_message(path))
    if not path.exists():
        raise CheckpointFormatError(_missing_message(str(model)))
    if not path.is_dir():
        raise CheckpointFormatError(
            f"{path} is a file; --model takes a Hugging Face checkpoint folder (config.json, "
            "*.safetensors and the tokenizer files)"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointFormatError(
            f"no config.json in {path}: --model must be a Hugging Face checkpoint folder "
            "(config.json, *.safetensors and the tokenizer files)"
        )
    raw = json.loads(config_file.read_text())
    _check_causal_lm(path, raw)
    _check_not_quantized(path, raw)
    if needs_weights:
        _check_safetensors(path)
    return path


def _only_gguf(path: Path) -> bool:
    return not (path / "config.json").exists() and any(path.glob("*.gguf"))


def _gguf_message(path: Path) -> str:
    return (
        f"{path} is GGUF (llama.cpp's format); Baton loads Hugging Face safetensors folders. "
        "Download the original model's folder instead, e.g. "
        "`huggingface-cli download OWNER/NAME --local-dir ./NAME`, and pass --model ./NAME"
    )


def _missing_message(model: str) -> str:
    if HUB_ID.match(model):
        # Only the offline API gets here: `baton serve` and `baton generate` resolve a hub id
        # to its folder first (baton.app.model_source).
        return (
            f"{model} is not a local folder: `baton serve {model}` fetches it from the hub; "
            f"here, pass the folder `huggingface_hub.snapshot_download('{model}')` returns"
        )
    return f"{model} does not exist; --model takes a Hugging Face checkpoint folder"


def _check_causal_lm(path: Path, raw: dict) -> None:
    architectures = raw.get("architectures") or []
    if raw.get("is_encoder_decoder"):
        kind = "an encoder-decoder model"
    elif architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
        kind = "not a causal language model"
    else:
        return
    shown = ", ".join(architectures) or raw.get("model_type", "unknown")
    raise CheckpointFormatError(
        f"{path} holds {shown}, {kind}; Baton generates text with decoder-only causal LMs "
        f"(architectures ending in {' or '.join(CAUSAL_LM_SUFFIXES)})"
    )


def _check_not_quantized(path: Path, raw: dict) -> None:
    quantization = raw.get("quantization_config")
    if quantization is None and (path / "quantize_config.json").is_file():
        quantization = {"quant_method": "gptq"}  # AutoGPTQ's own file, before transformers'
    if quantization is None:
        return
    method = str(quantization.get("quant_method", "")).lower()
    if not method and (quantization.get("load_in_4bit") or quantization.get("load_in_8bit")):
        method = "bitsandbytes"
    detected = QUANT_METHODS.get(method, method or "an unnamed format")
    raise CheckpointFormatError(
        f"{path} is quantized ({detected}, from config.json's quantization_config); Baton serves "
        f"unquantized weights in {SUPPORTED_DTYPES} only: use the original, unquantized "
        "checkpoint (its model card links it)"
    )


def _check_safetensors(path: Path) -> None:
    if any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file():
        return
    if any(path.glob("pytorch_model*.bin")) or (path / "pytorch_model.bin.index.json").is_file():
        converted = f"{path}-safetensors"
        raise CheckpointFormatError(
            f"{path} has only PyTorch .bin weights; Baton loads *.safetensors (it never unpickles "
            f"weights). Convert once: {CONVERT_BIN.format(src=path, dst=converted)}"
        )
    raise CheckpointFormatError(f"no *.safetensors weights in {path}")
