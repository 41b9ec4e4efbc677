"""How one request's next tokens are chosen and when its generation stops."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field

from baton.core.pooling import Pooling
from baton.core.setting import setting
from baton.core.structured_output import StructuredOutput

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LOGPROBS = 20
# OpenAI's own bound on logit_bias entries; each costs one scattered add per step.
MAX_LOGIT_BIAS_ENTRIES = 300
LOGIT_BIAS_RANGE = (-100.0, 100.0)
# Below this a temperature is greedy, as other servers treat it: dividing float32 logits by a
# smaller one overflows to inf and the draw becomes noise.
MIN_TEMPERATURE = 1e-5
# Beyond these the float32 arithmetic of the sampler stops meaning anything; 1 disables.
MAX_TEMPERATURE = 100.0
REPETITION_PENALTY_RANGE = (0.01, 100.0)


class InvalidRequestError(ValueError):
    """A request the user can fix; `param` names the offending field, `code` is a stable
    machine-readable reason where a client may act on it (OpenAI's codes where they exist)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


# OpenAI's code for a prompt plus max_tokens that do not fit the model's context: chat clients
# (the UI here) answer it by leaving out the oldest turns.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(slots=True)
class SamplingParams:
    """Sampling and stopping for one request, validated on construction.

    `max_tokens=None` lets the request run to the end of the context window; `max_tokens=0`
    generates nothing: the request finishes after its prompt is computed (scoring a prompt).
    `top_k` of -1 (or 0) and `top_p` of 1.0 disable those filters; `temperature` 0 (or below
    MIN_TEMPERATURE) is greedy.
    `logprobs=N` returns the sampled token's log-probability and the N most likely alternatives;
    `prompt_logprobs=N` the same for every prompt token after the first (what scoring harnesses
    read). `logit_bias` adds a bias in [-100, 100] to the logits of the token ids it names.
    `structured_output` constrains the output to a grammar (compiled before the request runs).
    `pooling` makes the request an embedding: it generates nothing (`max_tokens` 0) and finishes
    with its prompt's final hidden states pooled (core/pooling.py).
    The text options are vLLM's: `include_stop_str_in_output` keeps the stop string (or the
    stop token's text) that ended the output; `skip_special_tokens` leaves special tokens out of
    the text; `spaces_between_special_tokens` false writes an added token that follows another
    without the space a decoder (WordPiece's) puts between them.
    """

    # Fields declared with `setting` are flags too: `baton generate` samples by them, and
    # `baton bench` sends --ignore-eos.
    max_tokens: int | None = setting(16, help="tokens to generate at most")
    temperature: float = setting(1.0, help="sampling temperature (0: greedy)")
    top_p: float = setting(
        1.0, help="sample from the most likely tokens whose probabilities sum to this (1: off)"
    )
    top_k: int = setting(-1, help="sample from this many most likely tokens (-1: off)")
    min_p: float = setting(
        0.0, help="drop tokens less likely than this share of the most likely one's (0: off)"
    )
    seed: int | None = setting(
        None,
        name="--sampling-seed",
        help="per-request seed: the same seed samples the same tokens",
        default_text="none: requests draw from the engine's generator (--seed)",
    )
    stop: list[str] = setting(
        default_factory=list, repeatable=True, help="stop string (repeatable)"
    )
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = setting(
        False, help="keep generating past the end-of-sequence token, up to the token limit"
    )
    min_tokens: int = 0
    repetition_penalty: float = setting(
        1.0, help="penalise tokens already in the prompt or output (1: off; above 1 penalises)"
    )
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_output: StructuredOutput | None = None
    pooling: Pooling | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.logit_bias is not None:
            self.logit_bias = dict(self.logit_bias)
        self._validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    def _validate(self) -> None:
        if self.max_tokens is not None and (_not_int(self.max_tokens) or self.max_tokens < 0):
            raise InvalidRequestError(
                f"max_tokens must be an integer >= 0, got {self.max_tokens!r}", "max_tokens"
            )
        _require_finite(self.temperature, "temperature")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature must be in [0, {MAX_TEMPERATURE:g}] (0 means greedy), "
                f"got {self.temperature}",
                "temperature",
            )
        _require_finite(self.top_p, "top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(
                f"top_p must be in (0, 1], got {self.top_p}; use 1 to disable it", "top_p"
            )
        if _not_int(self.top_k) or self.top_k < -1:
            raise InvalidRequestError(
                f"top_k must be an integer >= -1 (-1 or 0 disables it), got {self.top_k!r}",
                "top_k",
            )
        _require_finite(self.min_p, "min_p")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {self.min_p}", "min_p")
        if self.seed is not None and _not_int(self.seed):
            raise InvalidRequestError(f"seed must be an integer, got {self.seed!r}", "seed")
        self._validate_stops()
        if _not_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequestError(
                f"min_tokens must be an integer >= 0, got {self.min_tokens!r}", "min_tokens"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                "min_tokens",
            )
        _require_finite(self.repetition_penalty, "repetition_penalty")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise InvalidRequestError(
                f"repetition_penalty must be in [{low:g}, {high:g}] (1 disables it), "
                f"got {self.repetition_penalty}",
                "repetition_penalty",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _require_finite(value, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(f"{name} must be in [-2, 2], got {value}", name)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (_not_int(value) or not 0 <= value <= MAX_LOGPROBS):
                raise InvalidRequestError(
                    f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}", name
                )
        self._validate_logit_bias()
        if self.pooling is not None and not isinstance(self.pooling, Pooling):
            if self.pooling not in {p.value for p in Pooling}:
                names = ", ".join(p.value for p in Pooling)
                raise InvalidRequestError(
                    f"pooling must be one of {names}, got {self.pooling!r}", "pooling"
                )
            self.pooling = Pooling(self.pooling)
        if self.pooling is not None and self.max_tokens != 0:
            # An embedding is read off the prompt alone; a sampled token would have no use.
            raise InvalidRequestError(
                "a pooling request generates nothing: max_tokens must be 0, "
                f"got {self.max_tokens!r}",
                "max_tokens",
            )
        if self.structured_output is not None and (self.ignore_eos or self.min_tokens):
            # The grammar ends on the stop token; forbidding or ignoring it has no output.
            raise InvalidRequestError(
                f"{self.structured_output.param} cannot be combined with ignore_eos or "
                "min_tokens: a constrained output ends where its grammar does; leave them out",
                "ignore_eos" if self.ignore_eos else "min_tokens",
            )

    def _validate_logit_bias(self) -> None:
        if not self.logit_bias:
            self.logit_bias = None  # an empty map asks for nothing; the sampler skips None
            return
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidRequestError(
                f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, "
                f"got {len(self.logit_bias)}",
                "logit_bias",
            )
        low, high = LOGIT_BIAS_RANGE
        for token_id, bias in self.logit_bias.items():
            if _not_int(token_id) or token_id < 0:
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids (integers >= 0), got {token_id!r}",
                    "logit_bias",
                )
            _require_finite(bias, "logit_bias")
            if not low <= bias <= high:
                raise InvalidRequestError(
                    f"logit_bias values must be in [{low:g}, {high:g}], got {bias} for token "
                    f"{token_id}",
                    "logit_bias",
                )

    def for_choice(self, index: int) -> SamplingParams:
        """The params of choice `index` of a request asking for several (`n`, `best_of`).

        With a seed, each choice draws from its own seed derived from the request's, so the
        choices differ and each stays repeatable; choice 0 keeps the request's own seed.
        """
        if index == 0 or self.seed is None:
            return self
        digest = hashlib.blake2b(f"{self.seed}/choice/{index}".encode(), digest_size=8).digest()
        return dataclasses.replace(self, seed=int.from_bytes(digest, "little") >> 1)

    def _validate_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(
                f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}",
                "stop",
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError("stop strings must be non-empty strings", "stop")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise InvalidRequestError(
                    f"a stop string may be at most {MAX_STOP_STRING_CHARS} characters, "
                    f"got one of {len(s)}",
                    "stop",
                )
        for t in self.stop_token_ids:
            if _not_int(t) or t < 0:
                raise InvalidRequestError(
                    f"stop_token_ids must be non-negative integers, got {t!r}", "stop_token_ids"
                )


def _not_int(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int)


def _require_finite(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", name)
