"""Where `--model` comes from: the folder the loader reads, the name the API serves it under by
default, and a line for the start-up log saying where it came from.

A local Hugging Face checkpoint folder is read where it is. Every other kind of `--model` a user
may hold (a hub id, a GGUF file) is turned here into such a folder, so the loader, the tokenizer
and the replicas see one kind of checkpoint. A local path that exists wins over a hub id of the
same spelling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from baton.app.model_settings import DEMO_MODEL, DEMO_MODEL_NAME, ModelSettings
from baton.core.checkpoint.checkpoint_check import HUB_ID, gguf_file


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A `--model` resolved to a checkpoint folder."""

    folder: Path
    # The name /v1/models reports when --served-model-name is not given.
    name: str
    # Where the model came from, for the start-up log.
    origin: str


def resolve_model(settings: ModelSettings) -> ModelSource:
    """The checkpoint folder `settings.model` names. A path that is neither a folder nor a file
    is passed on as it is, so the checkpoint check names what is wrong with it."""
    path = Path(settings.model).expanduser()
    if path.resolve() == DEMO_MODEL:
        return ModelSource(DEMO_MODEL, DEMO_MODEL_NAME, "the built-in demo model")
    if path.exists() and (gguf := gguf_file(path)) is not None:
        return from_gguf(gguf, path.resolve().name if path.is_dir() else gguf.stem)
    if path.is_dir():
        return ModelSource(path, path.resolve().name, f"the folder {path}")
    if path.is_file():
        return ModelSource(path, path.stem, f"the file {path}")
    if HUB_ID.match(settings.model):
        from baton.app.model_hub import fetch_hub_model  # huggingface_hub loads for hub ids only

        hub = fetch_hub_model(settings.model, settings.revision, settings.download_dir)
        return ModelSource(hub.folder, settings.model, hub.origin)
    return ModelSource(path, path.name, str(path))


def from_gguf(file: Path, name: str) -> ModelSource:
    """The checkpoint folder a GGUF file converts to, made on the first start that needs it."""
    from baton.gpu.gguf_checkpoint import gguf_checkpoint  # torch and transformers load here

    made = gguf_checkpoint(file, cache_dir() / "gguf")
    how = "converted into" if made.converted_now else "converted before, read from"
    origin = f"the GGUF file {file} ({made.architecture}, {made.file_type}; {how} {made.folder})"
    return ModelSource(made.folder, name, origin)


def cache_dir() -> Path:
    """Where Baton keeps what it makes from a `--model` (converted GGUF files): `BATON_CACHE`,
    else `baton` in the XDG cache folder."""
    if os.environ.get("BATON_CACHE"):
        return Path(os.environ["BATON_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "baton"
