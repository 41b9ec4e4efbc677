"""Whether a checkpoint can draft for the served model (`--speculative-method draft`): Baton's
native model runs it, it has the served model's vocabulary token for token (a draft token is
verified by its id), and its context is as long as the served one. Checked before torch loads,
so a wrong draft model fails in a moment with what to change."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from baton.core.checkpoint.checkpoint_check import CheckpointFormatError
from baton.core.checkpoint.model_config import ModelConfig, UnsupportedModelError
from baton.core.checkpoint.model_impl import resolve_model_config


def resolve_draft_model(
    path: str | Path, model: ModelConfig, max_model_len: int, *, needs_weights: bool = True
) -> ModelConfig:
    """The draft model's config at `path`, for `model` served up to `max_model_len` tokens.
    Raises ValueError naming what differs."""
    if not Path(path).is_dir():
        raise ValueError(
            f"--speculative-model {path} is not a folder: it takes the draft model's Hugging Face "
            "checkpoint folder (config.json, *.safetensors, tokenizer.json)"
        )
    try:
        draft = resolve_model_config(path, "native", needs_weights=needs_weights)
    except CheckpointFormatError as error:
        # The checks speak of --model, the flag that usually names the folder.
        raise ValueError(str(error).replace("--model", "--speculative-model")) from error
    except UnsupportedModelError as error:
        raise ValueError(
            f"--speculative-model {path}: {error}; a draft model runs on Baton's native model "
            "only (Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3 and their MoE families)"
        ) from error
    if draft.vocab_size != model.vocab_size:
        raise ValueError(
            f"--speculative-model {draft.path} has a vocabulary of {draft.vocab_size} tokens "
            f"and the model {model.path} one of {model.vocab_size}: a draft model must share "
            "the model's tokenizer (pick one of the same family and tokenizer)"
        )
    difference = _vocabulary_difference(Path(model.path), Path(draft.path))
    if difference is not None:
        raise ValueError(
            f"--speculative-model {draft.path} has another tokenizer than the model "
            f"{model.path} ({difference}): a draft model must share the model's tokenizer "
            "(pick one of the same family and tokenizer)"
        )
    if draft.max_model_len < max_model_len:
        raise ValueError(
            f"--speculative-model {draft.path} serves {draft.max_model_len} tokens of context, "
            f"less than the {max_model_len} the model serves: lower --max-model-len to "
            f"{draft.max_model_len} or pick a draft model with a longer context"
        )
    return draft


def _vocabulary_difference(model_path: Path, draft_path: Path) -> str | None:
    """A token the two tokenizers number differently, in words; None when both give every
    token the same id, or when either folder has no tokenizer.json to compare."""
    files = [path / "tokenizer.json" for path in (model_path, draft_path)]
    if not all(file.is_file() for file in files):
        return None
    model_vocab, draft_vocab = (
        Tokenizer.from_file(str(file)).get_vocab(with_added_tokens=True) for file in files
    )
    if model_vocab == draft_vocab:
        return None
    for token, token_id in sorted(model_vocab.items(), key=lambda item: item[1]):
        if draft_vocab.get(token) != token_id:
            other = draft_vocab.get(token)
            where = "is not in it" if other is None else f"is id {other} there"
            return f"token {token!r} is id {token_id} in the model's and {where}"
    extra = next(token for token in draft_vocab if token not in model_vocab)
    return f"token {extra!r} is in the draft model's only"
