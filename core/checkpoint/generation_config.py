"""The sampling defaults a checkpoint's `generation_config.json` recommends, read without torch:
what a request gets for the sampling fields it leaves out (`--generation-config`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton.core.sampling_params import InvalidRequestError, SamplingParams

GENERATION_CONFIG = "generation_config.json"

# The file's sampling keys and the request fields they default: transformers' max_new_tokens is
# the API's max_tokens. Only sampling fields: the file's stopping and search settings (eos ids
# aside, which ModelConfig reads) are transformers' generate() options, not a request's.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}

# transformers' own defaults. Older save_pretrained wrote every default into the file, so a
# value equal to one of these says nothing about the author's choice; skipping them applies the
# defaults vLLM applies to the same file (it reads only what differs from GenerationConfig()).
TRANSFORMERS_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "repetition_penalty": 1.0,
}


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Values for the sampling fields a request omits; None: the API's own default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set, by SamplingParams' names."""
        return {
            field.name: value
            for field in dataclasses.fields(self)
            if (value := getattr(self, field.name)) is not None
        }

    def describe(self) -> str:
        """`temperature 0.6, top_p 0.95`: the defaults for a start-up log line."""
        return ", ".join(f"{name} {value:g}" for name, value in self.as_dict().items())

    def apply_to(self, params: SamplingParams) -> SamplingParams:
        """`params` with these defaults in place of its own (the offline API's default params)."""
        return dataclasses.replace(params, **self.as_dict())


# A server that applies no checkpoint defaults: every omitted field gets the API's default.
NO_DEFAULTS = SamplingDefaults()


def read_sampling_defaults(file: str | Path) -> SamplingDefaults:
    """The sampling defaults a generation_config.json recommends; none where there is no such
    file. Raises ValueError naming the file and the value to fix when the file is not JSON or
    a value is one no request could send."""
    file = Path(file)
    if not file.is_file():
        return SamplingDefaults()
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{file} is not valid JSON ({error}); {_REMEDY}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file} must hold a JSON object; {_REMEDY}")
    # do_sample is left unread, as vLLM leaves it: it switches transformers' generate() between
    # greedy and sampling, and its default (false) is written into many files that still give
    # a temperature; an API request samples unless it asks for temperature 0.
    values = {
        field: raw[key]
        for key, field in SAMPLING_KEYS.items()
        if raw.get(key) is not None and raw[key] != TRANSFORMERS_DEFAULTS.get(key)
    }
    if values.get("max_tokens") == 0:
        raise ValueError(f"{file}: max_new_tokens 0 would generate nothing; {_REMEDY}")
    try:
        SamplingParams(**values)  # each default must be a value a request could send itself
    except InvalidRequestError as error:
        key = next((k for k, f in SAMPLING_KEYS.items() if f == error.param), error.param)
        raise ValueError(f"{file}: {key} is unusable ({error}); {_REMEDY}") from None
    return SamplingDefaults(**values)


_REMEDY = "fix the file, or start with --generation-config none to ignore it"
