"""What `--model` points at, checked before anything heavy loads: each checkpoint Baton cannot
serve gets one error that names what was found and what to do instead.

Reads only file names and config.json, so a wrong path fails in milliseconds, before torch or
transformers are imported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from baton.core.checkpoint.unsupported_model import RefusalReason

# A hub id as people paste it: `owner/name`, nothing else.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The parts of a GGUF that llama.cpp's gguf-split cut in several files: `-00001-of-00003.gguf`.
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
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

DEQUANTIZE_MXFP4 = (
    'python -c "import torch, transformers as t; t.AutoModelForCausalLM.from_pretrained('
    "'{src}', quantization_config=t.Mxfp4Config(dequantize=True), dtype=torch.bfloat16)"
    ".save_pretrained('{src}-bf16')\""
)


class CheckpointFormatError(ValueError):
    """A `--model` Baton cannot load; the message says what was found and what to do, `reason`
    the cause where it is a model Baton refuses rather than a file it cannot read."""

    def __init__(self, message: str, reason: RefusalReason | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def check_checkpoint(model: str | Path, *, needs_weights: bool = True) -> Path:
    """The checkpoint folder `model` names, or a `CheckpointFormatError` saying why it cannot be
    served. `needs_weights=False` (random weights) skips the weight-file checks."""
    path = Path(model).expanduser()
    if not path.exists():
        raise CheckpointFormatError(_missing_message(str(model)))
    if gguf_file(path) is not None:
        raise CheckpointFormatError(
            f"{path} is GGUF, which Baton reads once converted into a checkpoint folder: pass it "
            "as --model to `baton serve` or `baton generate`, or to `LLM`, which convert it "
            "(baton.app.model_source.resolve_model)"
        )
    if not path.is_dir():
        raise CheckpointFormatError(
            f"{path} is a file; --model takes a Hugging Face checkpoint folder (config.json, "
            "*.safetensors and the tokenizer files) or a .gguf file"
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


def gguf_file(path: Path) -> Path | None:
    """The GGUF file `path` names: itself, or the one GGUF model file of a folder without a
    config.json (a vision projector, `mmproj-*.gguf`, set aside); None if it names none.

    A folder of several (a model's quantizations side by side, as GGUF repositories hold them)
    is refused rather than one guessed: which quantization to serve is the user's choice."""
    if path.suffix.lower() == ".gguf":
        candidates = [path]
    elif path.is_dir() and not (path / "config.json").exists():
        candidates = sorted(p for p in path.glob("*.gguf") if not p.name.startswith("mmproj"))
    else:
        return None
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise CheckpointFormatError(
            f"{path} holds {len(candidates)} GGUF files ({names}); pass the one to serve, "
            f"e.g. --model {candidates[0]}"
        )
    if candidates and SPLIT_GGUF.search(candidates[0].name):
        raise CheckpointFormatError(
            f"{candidates[0]} is one part of a split GGUF; merge the parts into one file first "
            f"(llama.cpp's `llama-gguf-split --merge {candidates[0].name} merged.gguf`)"
        )
    return candidates[0] if candidates else None


def _missing_message(model: str) -> str:
    if HUB_ID.match(model):
        # Only the offline API gets here: `baton serve` and `baton generate` resolve a hub id
        # to its folder first (baton.app.model_source).
        return (
            f"{model} is not a local folder: `baton serve {model}` fetches it from the hub; "
            f"here, pass the folder `huggingface_hub.snapshot_download('{model}')` returns"
        )
    return f"{model} does not exist; --model takes a Hugging Face checkpoint folder or a GGUF file"


def _check_causal_lm(path: Path, raw: dict) -> None:
    architectures = raw.get("architectures") or []
    if raw.get("is_encoder_decoder"):
        kind, reason = "an encoder-decoder model", RefusalReason.ENCODER_DECODER
    elif architectures and not any(a.endswith(CAUSAL_LM_SUFFIXES) for a in architectures):
        kind = "not a causal language model"
        multimodal = _names_multimodal(raw)
        reason = RefusalReason.MULTIMODAL if multimodal else RefusalReason.NO_CAUSAL_LM_CLASS
    else:
        return
    shown = ", ".join(architectures) or raw.get("model_type", "unknown")
    raise CheckpointFormatError(
        f"{path} holds {shown}, {kind}; Baton generates text with decoder-only causal LMs "
        f"(architectures ending in {' or '.join(CAUSAL_LM_SUFFIXES)})",
        reason,
    )


def _names_multimodal(raw: dict) -> bool:
    return any(key in raw for key in ("vision_config", "audio_config", "vq_config"))


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
    if method == "mxfp4":
        # gpt-oss ships only in MXFP4: there is no unquantized original to point at.
        dequantize = DEQUANTIZE_MXFP4.format(src=path)
        raise CheckpointFormatError(
            f"{path} is quantized (MXFP4, from config.json's quantization_config); Baton serves "
            f"{SUPPORTED_DTYPES} weights: dequantize it to bfloat16 once with {dequantize} and "
            "copy the tokenizer files beside it"
        )
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
