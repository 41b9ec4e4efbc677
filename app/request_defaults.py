"""What the front end gives a request where it says nothing, read once at start-up: the sampling
defaults of `--generation-config` and the chat template of `--chat-template`. Read before the
model loads, so a bad file fails in a moment with one line saying what to change."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from baton.core.checkpoint.generation_config import (
    GENERATION_CONFIG,
    NO_DEFAULTS,
    SamplingDefaults,
    read_sampling_defaults,
)
from baton.core.text.tokenizer import Tokenizer, compile_chat_template

logger = logging.getLogger("baton.server")

# Text holding these is a template given inline; anything else names a file.
TEMPLATE_MARKS = ("{%", "{{")


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    """The sampling defaults for omitted fields, and the chat template that replaces the
    checkpoint's (None: the checkpoint's own), with where each came from for the log."""

    sampling: SamplingDefaults = NO_DEFAULTS
    sampling_origin: str = ""
    chat_template: str | None = None
    chat_template_origin: str = ""

    def tokenizer_for(self, tokenizer: Tokenizer) -> Tokenizer:
        """`tokenizer` with the --chat-template in place of its own, where one was given."""
        if self.chat_template is None:
            return tokenizer
        return tokenizer.with_chat_template(self.chat_template, self.chat_template_origin)

    def log(self) -> None:
        """One line per default in force, so an operator sees why output differs from the API's
        defaults."""
        if self.sampling.as_dict():
            logger.info(
                "sampling defaults from %s: %s", self.sampling_origin, self.sampling.describe()
            )
        if self.chat_template is not None:
            logger.info("chat template from --chat-template: %s", self.chat_template_origin)


# The checkpoint's own template and the API's sampling defaults: what tests and benchmarks get.
NO_REQUEST_DEFAULTS = RequestDefaults()


def read_request_defaults(
    folder: Path, generation_config: str = "auto", chat_template: str | None = None
) -> RequestDefaults:
    """The defaults `--generation-config` and `--chat-template` give for the checkpoint in
    `folder`. Raises ValueError (one line, naming the file) for a file that cannot be read or
    a template that does not compile."""
    sampling, sampling_origin = _sampling_defaults(folder, generation_config)
    if chat_template is None:
        return RequestDefaults(sampling, sampling_origin)
    template, origin = _chat_template(chat_template)
    compile_chat_template(template, origin, "fix it, or leave --chat-template out")
    return RequestDefaults(sampling, sampling_origin, template, origin)


def _sampling_defaults(folder: Path, generation_config: str) -> tuple[SamplingDefaults, str]:
    if generation_config == "none":
        return SamplingDefaults(), ""
    if generation_config == "auto":
        file = folder / GENERATION_CONFIG
        return read_sampling_defaults(file), str(file)
    # vLLM's third form: a folder (or the file itself) holding the defaults to use instead.
    path = Path(generation_config).expanduser()
    file = path / GENERATION_CONFIG if path.is_dir() else path
    if not file.is_file():
        raise ValueError(
            f"--generation-config {generation_config}: no such file or folder holding "
            f"{GENERATION_CONFIG}; give auto (the checkpoint's), none, or a folder holding one"
        )
    return read_sampling_defaults(file), str(file)


def _chat_template(value: str) -> tuple[str, str]:
    """The template text `--chat-template` gives, and where it came from: a file's contents,
    or the value itself when it holds Jinja tags (vLLM takes both)."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--chat-template: cannot read {path} ({error})") from None
    if any(mark in value for mark in TEMPLATE_MARKS):
        return value, "given inline"
    raise FileNotFoundError(
        f"--chat-template: no file {value}; give a Jinja template file, or the template itself"
    )
