"""Completion request bodies (`/v1/completions`, WebSocket `generate` frames): prompts as
text or token ids, echo, best_of and prompt scoring."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import StrictStr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Int64
from baton.app.api.protocol import MAX_COMPLETIONS, GenerationRequest
from baton.app.errors import APIError

EMPTY_PROMPT = "must not be empty; send some text or token ids"
# A prompt as the engine takes it: text to tokenize, or token ids as sent.
Prompt = str | list[int]


class CompletionRequest(GenerationRequest):
    default_max_tokens: ClassVar[int | None] = 16  # OpenAI's default for completions

    prompt: Any
    logprobs: Int64 | None = None
    best_of: Int64 | None = None
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _known_prompt_shape(cls, prompt: Any) -> list[Prompt]:
        return prompt_list(prompt)

    # vLLM's extension: the prompt tokens' log-probabilities with their top-N, echo or not.
    prompt_logprobs: Int64 | None = None

    @field_validator("best_of")
    @classmethod
    def _bounded_candidates(cls, best_of: int | None) -> int | None:
        if best_of is not None and not 1 <= best_of <= MAX_COMPLETIONS:
            raise PydanticCustomError(
                "baton_best_of", f"must be in [1, {MAX_COMPLETIONS}], got {best_of}"
            )
        return best_of

    @model_validator(mode="after")
    def _best_of_fits_n(self) -> CompletionRequest:
        if self.best_of is None:
            return self
        if self.best_of < self.num_choices:
            raise APIError(
                400,
                f"best_of ({self.best_of}) must be at least n ({self.num_choices}): it is the "
                "number of candidates the n choices are picked from",
                param="best_of",
            )
        if self.stream and self.best_of > self.num_choices:
            raise APIError(
                400,
                "best_of greater than n cannot be streamed: the best choices are known only "
                "once every candidate has finished; drop stream or best_of",
                param="best_of",
            )
        return self

    @property
    def prompts(self) -> list[Prompt]:
        return self.prompt

    @property
    def num_candidates(self) -> int:
        return self.best_of or self.num_choices

    @property
    def scores_prompt(self) -> bool:
        return self.echo

    @property
    def shows_logprobs(self) -> bool:
        # best_of asks the engine for them to rank by; the client sees them only if it asked.
        return self.logprobs is not None

    def requested_logprobs(self) -> int | None:
        if self.logprobs is None and self.num_candidates > self.num_choices:
            return 0  # ranking by cumulative logprob needs the sampled tokens' own
        return self.logprobs

    def requested_prompt_logprobs(self) -> int | None:
        """`echo` with `logprobs` scores the prompt with the same top-N, as OpenAI's legacy
        API did; vLLM's `prompt_logprobs` asks for it directly."""
        asked = [
            value
            for value in (self.logprobs if self.echo else None, self.prompt_logprobs)
            if value is not None
        ]
        return max(asked) if asked else None


def prompt_list(prompt: Any) -> list[Prompt]:
    """A string, strings, token ids, or lists of token ids → one engine prompt per entry."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        prompts = prompt
    elif isinstance(prompt, list):
        raise PydanticCustomError("baton_empty", EMPTY_PROMPT)
    else:
        prompts = [None]
    for entry in prompts:
        if isinstance(entry, str) and entry:
            continue
        if isinstance(entry, list) and entry and all(_is_token_id(t) for t in entry):
            continue
        if entry == "" or entry == []:
            raise PydanticCustomError("baton_empty", EMPTY_PROMPT)
        raise PydanticCustomError(
            "baton_prompt_type",
            "must be a string, a list of strings, a list of token ids (integers) or a list of "
            "token-id lists",
        )
    return prompts


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
