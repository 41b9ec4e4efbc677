"""A GGUF file (llama.cpp's format) turned into the Hugging Face checkpoint folder Baton's loader
reads: config, tokenizer and chat template from the file's metadata, every tensor dequantized.

transformers' GGUF support does the reading (its architecture and tokenizer mappings, llama's
q/k un-permutation; the `gguf` package dequantizes), and `save_pretrained` writes the folder, so a
GGUF loads exactly as `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` would. The folder
is made once per file, in a cache keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from baton.core.checkpoint.checkpoint_check import CheckpointFormatError

logger = logging.getLogger(__name__)

# Beside the converted checkpoint: what the folder was made from, for the start-up log.
SOURCE_RECORD = "baton_gguf.json"


@dataclass(frozen=True, slots=True)
class GgufCheckpoint:
    """A GGUF file's checkpoint folder, and what the file held."""

    folder: Path
    # llama.cpp's name for the model's architecture (`general.architecture`): llama, qwen2, ...
    architecture: str
    # The file's quantization as llama.cpp names it: F32, F16, Q8_0, Q4_K_M, ...
    file_type: str
    # Whether this call converted the file (else the folder was made by an earlier start).
    converted_now: bool


def gguf_checkpoint(file: Path, cache: Path) -> GgufCheckpoint:
    """The checkpoint folder of the GGUF `file` under `cache`: converted now, or found there
    from an earlier conversion of the same file."""
    file = file.resolve()
    folder = cache / f"{file.stem}-{file_key(file)}"
    record = folder / SOURCE_RECORD
    if record.is_file():
        held = json.loads(record.read_text())
        return GgufCheckpoint(folder, held["architecture"], held["file_type"], False)
    architecture, file_type = describe(file)
    logger.info(
        "converting the GGUF file %s (%s, %s) into %s", file, architecture, file_type, folder
    )
    cache.mkdir(parents=True, exist_ok=True)
    # Made under another name and renamed when complete, so a killed conversion leaves nothing a
    # later start would take for finished; two starts racing keep whichever renamed first.
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=cache))
    try:
        write_checkpoint(file, partial)
        held = {"file": str(file), "architecture": architecture, "file_type": file_type}
        (partial / SOURCE_RECORD).write_text(json.dumps(held, indent=2))
        try:
            partial.rename(folder)
        except OSError:
            if not record.is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return GgufCheckpoint(folder, architecture, file_type, True)


def file_key(file: Path) -> str:
    """Names one version of `file`: its path, size and modification time, hashed. A file
    replaced or rewritten in place gets a new key, so a stale conversion is never reused."""
    stat = file.stat()
    identity = f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def describe(file: Path) -> tuple[str, str]:
    """(architecture, file type) from the file's metadata."""
    from gguf import GGUFReader, LlamaFileType
    from transformers.modeling_gguf_pytorch_utils import read_field

    try:
        reader = GGUFReader(file)
        (architecture,) = read_field(reader, "general.architecture")
    except (ValueError, OSError, IndexError, KeyError) as error:
        # The reader fails on a truncated or foreign file with whatever its parsing hit first.
        raise CheckpointFormatError(
            f"{file} is not a readable GGUF file ({type(error).__name__}: {error}); is the "
            "download complete?"
        ) from None
    try:
        name = LlamaFileType(read_field(reader, "general.file_type")[0]).name
        return architecture, name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (IndexError, ValueError):
        # No file type (older files), or one newer than the gguf package: name the tensor type
        # that holds the most weights.
        counts = Counter[str]()
        for tensor in reader.tensors:
            counts[tensor.tensor_type.name] += int(tensor.n_elements)
        return architecture, counts.most_common(1)[0][0]


def write_checkpoint(file: Path, out: Path) -> None:
    """Write the GGUF `file` to `out` as config.json, model.safetensors and the tokenizer files."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
        # On the meta device: only its parameter names and shapes are needed, to name the
        # file's tensors and to write them in a Hugging Face checkpoint's layout.
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        parsed = load_gguf_checkpoint(str(file), return_tensors=True, model_to_load=model)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    except (ValueError, KeyError, NotImplementedError) as error:
        raise CheckpointFormatError(
            f"transformers cannot read {file}: {str(error).rstrip('.')}. Baton reads GGUF files "
            "through transformers' GGUF support; serve the model's original Hugging Face "
            "checkpoint folder instead"
        ) from None
    weights = {name: narrowest_exact(tensor) for name, tensor in parsed["tensors"].items()}
    missing = set(model.load_state_dict(weights, strict=False, assign=True).missing_keys)
    if config.tie_word_embeddings:
        model.tie_weights()
        missing.discard("lm_head.weight")
    if missing:
        shown = ", ".join(sorted(missing)[:5])
        raise CheckpointFormatError(
            f"{file} lacks {len(missing)} of the tensors a {config.model_type} of its shape has "
            f"({shown}); is it the first part of a split GGUF, or a partial download?"
        )
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    drop_tokens_past(out / "tokenizer.json", config.vocab_size)


def narrowest_exact(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (float32, as dequantized) in bfloat16 or float16 where that holds every value
    exactly, else in float32: F16 and BF16 files keep their dtype and size, and no value is ever
    rounded, so Baton serves what the file holds. bfloat16 is tried first: most bfloat16 values
    fit float16 too, and a BF16 file should stay BF16."""
    for dtype in (torch.bfloat16, torch.float16):
        narrow = tensor.to(dtype)
        if torch.equal(narrow.float(), tensor):
            return narrow
    return tensor


def drop_tokens_past(tokenizer_file: Path, vocab_size: int) -> None:
    """Remove the added tokens whose ids the model has no embedding row for. transformers builds a
    byte-level GGUF vocabulary as GPT-2's tokenizer, which adds GPT-2's `<|endoftext|>` where the
    vocabulary lacks it; kept, that text in a prompt would encode to an id past the model's."""
    spec = json.loads(tokenizer_file.read_text())
    kept = [token for token in spec.get("added_tokens", []) if token["id"] < vocab_size]
    if len(kept) != len(spec.get("added_tokens", [])):
        spec["added_tokens"] = kept
        tokenizer_file.write_text(json.dumps(spec, ensure_ascii=False, indent=2))
