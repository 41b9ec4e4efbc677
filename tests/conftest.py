"""Shared fixtures: tiny random-weight checkpoints of each supported family, built once, and a
headless browser for the UI tests."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _drop_triton_teardown_report() -> None:
    """libtriton's nanobind bindings list "leaked" objects while the interpreter tears down, once
    torch has imported triton (transformers imports torch._dynamo, which does): a known triton
    issue that triton silences in its own workers the same way. It comes after pytest's summary
    and does not change the exit code; only that report is dropped."""
    if "triton" in sys.modules:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)


atexit.register(_drop_triton_teardown_report)


@pytest.fixture(scope="session")
def hf_tokenizer():
    """The byte-level BPE tokenizer every test checkpoint shares (trained once per session)."""
    from baton.tools.tokenizer_trainer import train_tokenizer

    return train_tokenizer(512)


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory, hf_tokenizer):
    """Build (and cache) a tiny random checkpoint: `make_checkpoint("qwen3", hidden_size=...)`."""
    from baton.tools.random_checkpoint import write_checkpoint

    built: dict[tuple, Path] = {}

    def make(family: str = "llama", **overrides) -> Path:
        key = (family, tuple(sorted(overrides.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(f"ckpt-{family}")
            built[key] = write_checkpoint(out, family, "tiny", tokenizer=hf_tokenizer, **overrides)
        return built[key]

    return make


@pytest.fixture(scope="session")
def llama_checkpoint(make_checkpoint) -> Path:
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def browser():
    """Headless chromium for the UI tests; Playwright loads only for the tests that use it."""
    from tests.browser import launched

    with launched() as browser:
        yield browser
