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


# A Qwen3-style template: `reasoning_effort` shows in a system turn, and `enable_thinking:
# false` closes an empty thinking block in the generation prompt.
THINK_TEMPLATE = (
    "{{ bos_token }}{% if reasoning_effort is defined %}<|system|>\n"
    "Reasoning: {{ reasoning_effort }}<|end|>\n{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


@pytest.fixture(scope="session")
def think_checkpoint(tmp_path_factory, hf_tokenizer) -> Path:
    """A tiny random checkpoint of a reasoning model: `<think>` and `</think>` are plain added
    tokens (as in Qwen3's tokenizer) and the chat template is THINK_TEMPLATE. The model's
    vocabulary is padded past the tokenizer's."""
    from transformers import PreTrainedTokenizerFast

    from baton.tools.random_checkpoint import write_checkpoint

    copy = tmp_path_factory.mktemp("think-tokenizer")
    hf_tokenizer.save_pretrained(copy)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(copy)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = THINK_TEMPLATE
    out = tmp_path_factory.mktemp("ckpt-think")
    return write_checkpoint(out, "llama", "tiny", tokenizer=tokenizer, vocab_size=640)


@pytest.fixture(scope="module")
def browser():
    """Headless chromium for the UI tests; Playwright loads only for the tests that use it."""
    from tests.browser import launched

    with launched() as browser:
        yield browser
