"""A hub id (`ORG/NAME`) turned into a local checkpoint folder through huggingface_hub: the
local cache when it holds the model, else a download of only the files serving reads.

Imported only for a hub id, so a server started on a folder never imports huggingface_hub.
huggingface_hub reads its own environment: HF_ENDPOINT, HF_HUB_CACHE or HF_HOME, HF_TOKEN,
HF_HUB_OFFLINE.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, is_offline_mode, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hub_tqdm

logger = logging.getLogger("baton.model_hub")

# What serving reads: the config, the tokenizer and its chat template, the sampling defaults and
# the safetensors weights; never .bin (Baton does not unpickle), GGUF, ONNX or other formats.
SERVING_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
    "*.safetensors",
    "model.safetensors.index.json",
]
# The loader reads the repository's top level only (but for the named chat templates, which
# transformers saves in a folder of their own): weights and configs in subfolders belong to
# other formats. Mistral's repositories ship their weights a second time as
# consolidated.safetensors, for mistral-inference.
SKIPPED_FILES = ["*/*.safetensors", "*/*.json", "consolidated*.safetensors"]


class TerminalProgressBar(hub_tqdm):
    """huggingface_hub's progress bar, drawn only on a terminal: its file counter is made
    without tqdm's terminal check, and a log file would fill with its redraws."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("disable", None)  # tqdm's None: draw only on a terminal
        super().__init__(*args, **kwargs)


class ModelDownloadError(ValueError):
    """A hub id that cannot be served from the cache nor downloaded; the message says why."""


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    """A hub model's files in a local folder, and whether they were downloaded just now."""

    repo_id: str
    revision: str | None
    folder: Path
    downloaded: bool

    @property
    def origin(self) -> str:
        """Where the model came from, for the start-up log."""
        commit = self.folder.name[:7]  # the snapshot folder is named by its commit
        named = self.revision not in (None, self.folder.name)  # a branch or a tag
        at = f"revision {self.revision} ({commit})" if named else f"revision {commit}"
        where = "downloaded to" if self.downloaded else "from the local cache,"
        return f"the hub's {self.repo_id} at {at}, {where} {self.folder}"


def fetch_hub_model(repo_id: str, revision: str | None, cache_dir: str | None) -> HubSnapshot:
    """The folder holding `repo_id`'s serving files at `revision` (None: the default branch):
    the cache's when complete, else downloaded into the cache (`cache_dir` None: the hub's)."""
    request = dict(
        repo_id=repo_id,
        revision=revision,
        cache_dir=cache_dir,
        allow_patterns=SERVING_FILES,
        ignore_patterns=SKIPPED_FILES,
    )
    held = "is not in the local cache"
    try:
        cached = Path(snapshot_download(**request, local_files_only=True))
        lacking = missing_serving_file(cached)
        if lacking is None:
            return HubSnapshot(repo_id, revision, cached, downloaded=False)
        held = f"lacks {lacking} in the local cache"  # the hub has the rest
    except LocalEntryNotFoundError:
        pass
    cache = cache_dir or constants.HF_HUB_CACHE
    if is_offline_mode():
        raise ModelDownloadError(
            f"{repo_id} {held} ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it: unset "
            "HF_HUB_OFFLINE, or point HF_HUB_CACHE or --download-dir at a cache that holds it"
        )
    logger.info("downloading %s's serving files from %s to %s", repo_id, constants.ENDPOINT, cache)
    try:
        folder = Path(snapshot_download(**request, tqdm_class=TerminalProgressBar))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise ModelDownloadError(_download_failure(repo_id, revision, cache, error)) from None
    missing = missing_serving_file(folder)
    if missing is not None:
        raise ModelDownloadError(
            f"{repo_id} at {revision or 'its default branch'} has no {missing}: Baton serves "
            "checkpoints with config.json and *.safetensors weights"
        )
    return HubSnapshot(repo_id, revision, folder, downloaded=True)


def missing_serving_file(folder: Path) -> str | None:
    """What `folder` lacks that serving needs, in words; None when it has everything. A cache
    may hold a model in part: transformers fetches config.json alone for AutoConfig."""
    if not (folder / "config.json").is_file():
        return "config.json"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        absent = [shard for shard in shards if not (folder / shard).is_file()]
        return f"weight shard {absent[0]}" if absent else None
    return None if any(folder.glob("*.safetensors")) else "*.safetensors weights"


def _download_failure(repo_id: str, revision: str | None, cache: str, error: Exception) -> str:
    """One line saying why `repo_id` could not be fetched and what to change."""
    page = f"{constants.ENDPOINT}/{repo_id}"
    # GatedRepoError is a RepositoryNotFoundError: asked first.
    if isinstance(error, GatedRepoError):
        return (
            f"{repo_id} is gated: accept its licence at {page}, then set HF_TOKEN to a token of "
            "the account that accepted it"
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"{repo_id} is neither a local folder nor a model on the hub ({constants.ENDPOINT}): "
            "check the spelling; a private model needs HF_TOKEN set to a token that can read it"
        )
    if isinstance(error, RevisionNotFoundError):
        return f"{repo_id} has no revision {revision!r}: --revision takes a branch, tag or commit"
    if isinstance(error, LocalEntryNotFoundError):
        return (
            f"{repo_id} is not in the local cache ({cache}) and the hub ({constants.ENDPOINT}) "
            "could not be reached: check the network, or HF_ENDPOINT if it is set"
        )
    if isinstance(error, HfHubHTTPError) and error.response is not None:
        return (
            f"the hub ({constants.ENDPOINT}) answered HTTP {error.response.status_code} for "
            f"{repo_id}: {_first_line(error.server_message or str(error))}"
        )
    return f"downloading {repo_id} failed: {_first_line(str(error))}"


def _first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), text).strip()
