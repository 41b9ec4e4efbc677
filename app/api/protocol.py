"""Request bodies of the OpenAI-compatible API (and of WebSocket `generate` frames): parsing,
validation with messages that name the field to fix, and conversion to engine parameters.
The fields completions and chat share are here; each endpoint's own are in
app/api/completion_protocol.py and app/api/chat_protocol.py."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, TypeVar

import orjson
from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Int64, Name, StrictModel
from baton.app.api.guided import (
    ResponseFormat,
    StructuredOutputs,
    ToolMode,
    structured_output,
)
from baton.app.errors import APIError
from baton.core.checkpoint.generation_config import NO_DEFAULTS, SamplingDefaults
from baton.core.request import MAX_SLO_MS, SLO
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.core.structured_output import StructuredOutput

# Any request body model: generation requests, and /tokenize's and /detokenize's.
Body = TypeVar("Body", bound=BaseModel)

# What a JSON value is called in error messages, by its Python type after parsing.
JSON_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def parse_json_object(body: bytes | str, what: str = "the request body") -> dict[str, Any]:
    """Parse a JSON object; anything else (bad JSON, bad UTF-8, a lone surrogate) is a 400."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise APIError(
            400,
            f"{what} is not valid JSON ({error}); send a UTF-8 JSON object without NaN, "
            "Infinity or unpaired surrogate escapes",
        ) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{what} must be a JSON object, got {json_type(value)}")
    return value


def json_type(value: object) -> str:
    return JSON_TYPE_NAMES.get(type(value), type(value).__name__)


class StreamOptions(StrictModel):
    include_usage: StrictBool = False


class SLOTargets(StrictModel):
    ttft_ms: StrictFloat | None = Field(default=None, gt=0, le=MAX_SLO_MS)
    tpot_ms: StrictFloat | None = Field(default=None, gt=0, le=MAX_SLO_MS)


# OpenAI fields Baton does not implement yet, declared so that the values asking for nothing
# pass: the values accepted, and what a 400 says (after the field's name) to anything else.
ASK_NOTHING: dict[str, tuple[tuple[Any, ...], str]] = {
    "suffix": ((None, ""), "is not supported: Baton does not insert text; leave it out"),
    "modalities": ((None, ["text"]), "other than ['text'] are not supported; Baton serves text"),
    "service_tier": ((None, "auto", "default"), "must be 'auto' or 'default': Baton has one tier"),
}


# Completions per prompt (`n`, and `best_of` candidates): each is an engine request of its own.
MAX_COMPLETIONS = 16


class GenerationRequest(StrictModel):
    """The parameters completions and chat share, OpenAI's and Baton's extensions alike.

    Every field is honoured or refused with a 400 naming it: OpenAI fields Baton does not
    implement are either left undeclared (refused as unknown) or declared with the one value
    that asks for nothing (`suffix: ""`, `tools: []`), so a client never gets a 200 that
    silently ignored what it asked for. `user` and the other identifiers are accepted: they
    ask the server to do nothing but carry a name."""

    # Chat runs to the end of the context unless told otherwise; completions override this.
    default_max_tokens: ClassVar[int | None] = None

    model: Name | None = None
    max_tokens: Int64 | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    n: Int64 | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: Any = None
    seed: Int64 | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    logit_bias: dict[str, Any] | None = None
    user: Name | None = None
    top_k: Int64 | None = None
    min_p: StrictFloat | None = None
    repetition_penalty: StrictFloat | None = None
    ignore_eos: StrictBool = False
    min_tokens: Int64 = 0
    stop_token_ids: list[Int64] | None = None
    priority: Int64 = 0
    slo: SLOTargets | None = None
    # Baton's extension: `timing.token_ms` lists when each output token was ready.
    return_token_timestamps: StrictBool = False
    # Structured output: OpenAI's response_format, and vLLM's extensions (at most one).
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = Field(default=None, min_length=1)
    # How many choices, and how long, is a cost bound (baton.core.request_bounds).
    guided_choice: list[Annotated[StrictStr, Field(min_length=1)]] | None = Field(
        default=None, min_length=1
    )
    guided_grammar: StrictStr | None = Field(default=None, min_length=1)
    structured_outputs: StructuredOutputs | None = None
    # vLLM's text options (baton.core.sampling_params). skip_special_tokens unset is true,
    # except with tool_choice auto, whose parser reads the call markers.
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # vLLM's: keep only the prompt's last N tokens (-1: as many as fit beside max_tokens).
    truncate_prompt_tokens: Int64 | None = None
    # Completions: the prompt, before the completion; chat: the last message, when it is the
    # assistant's, before the answer (vLLM's meaning).
    echo: StrictBool = False

    @field_validator(*ASK_NOTHING, check_fields=False)
    @classmethod
    def _asks_nothing(cls, value: Any, info: ValidationInfo) -> Any:
        accepted, message = ASK_NOTHING[info.field_name]
        if value not in accepted:
            raise PydanticCustomError("baton_unsupported", message)
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _kept_tokens(cls, count: int | None) -> int | None:
        if count is not None and count != -1 and count < 1:
            raise PydanticCustomError(
                "baton_truncate",
                f"must be a number of tokens to keep (at least 1), or -1 for as many as fit; "
                f"got {count}",
            )
        return count

    @field_validator("n")
    @classmethod
    def _bounded_choices(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_COMPLETIONS:
            raise PydanticCustomError("baton_n", f"must be in [1, {MAX_COMPLETIONS}], got {n}")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, logit_bias: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in logit_bias or {}:
            if not key.isascii() or not key.isdigit():
                raise PydanticCustomError(
                    "baton_logit_bias",
                    f'keys must be token ids written as decimal strings (such as "50256"), '
                    f"got {key[:32]!r}",
                )
        return logit_bias

    @property
    def num_choices(self) -> int:
        """Choices returned per prompt (`n`)."""
        return self.n or 1

    @property
    def num_candidates(self) -> int:
        """Engine requests per prompt: `best_of` where the request asks to pick among more."""
        return self.num_choices

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: Any) -> list[str] | None:
        if stop is None or (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            return stop
        if isinstance(stop, str):
            return [stop]
        raise PydanticCustomError("baton_stop_type", "must be a string or a list of strings")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def kept_prompt_tokens(self, max_model_len: int, max_tokens: int | None) -> int | None:
        """How many of the prompt's last tokens to keep (`truncate_prompt_tokens`); None: all.
        -1 keeps as many as leave room for `max_tokens` (for one token when it is unset)."""
        count = self.truncate_prompt_tokens
        if count is None:
            return None
        if count == -1:
            return max(1, max_model_len - (max_tokens or 1))
        if count > max_model_len:
            raise APIError(
                400,
                f"truncate_prompt_tokens ({count}) is more than the context length of "
                f"{max_model_len} tokens; send at most {max_model_len}, or -1 for as many as fit",
                param="truncate_prompt_tokens",
            )
        return count

    def requested_logprobs(self) -> int | None:
        return None

    def requested_prompt_logprobs(self) -> int | None:
        return None

    @property
    def shows_logprobs(self) -> bool:
        """Whether the response carries the sampled tokens' log-probabilities."""
        return self.requested_logprobs() is not None

    @property
    def scores_prompt(self) -> bool:
        """Whether the prompt is the point (completions' `echo`): then max_tokens may be 0."""
        return False

    def sampling_params(self, defaults: SamplingDefaults = NO_DEFAULTS) -> SamplingParams:
        """Engine parameters: each field the request leaves out (or sends as null, as OpenAI's
        clients do for "unset") from `defaults` (the checkpoint's generation_config.json),
        else OpenAI's default. A max_tokens from `defaults` stays unset here: the validator
        bounds it by the room the prompt leaves (`default_max_tokens`). Raises APIError."""
        max_tokens = self.requested_max_tokens()
        if max_tokens == 0 and not self.scores_prompt:
            raise APIError(
                400,
                f"{self.field_name('max_tokens')} 0 generates nothing: it is allowed only on "
                "/v1/completions with echo: true (to score the prompt); send a positive value",
                param=self.field_name("max_tokens"),
            )
        if max_tokens is None and defaults.max_tokens is None:
            max_tokens = self.default_max_tokens
        settings = {
            "max_tokens": max_tokens,
            "temperature": _given(self.temperature, defaults.temperature),
            "top_p": _given(self.top_p, defaults.top_p),
            "top_k": _given(self.top_k, defaults.top_k),
            "min_p": _given(self.min_p, defaults.min_p),
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": _given(self.repetition_penalty, defaults.repetition_penalty),
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "logprobs": self.requested_logprobs(),
            "prompt_logprobs": self.requested_prompt_logprobs(),
            "logit_bias": {int(k): v for k, v in self.logit_bias.items()}
            if self.logit_bias
            else None,
            "structured_output": self.structured_output(),
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
        }
        if self.tool_mode() is ToolMode.AUTO:
            # Tool-call markers such as Mistral's [TOOL_CALLS] are special tokens; the parser
            # takes them out of the text, so the client never sees them either way.
            settings["skip_special_tokens"] = False
        explicit = {k: v for k, v in settings.items() if v is not None or k == "max_tokens"}
        try:
            return SamplingParams(
                **explicit, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens
            )
        except InvalidRequestError as error:
            raise self.invalid(error) from None

    def structured_output(self) -> StructuredOutput | None:
        """The output constraint the request asks for; a 400 if it asks for several."""
        return structured_output(self._guided_fields())

    def _guided_fields(self) -> dict[str, Any]:
        return {
            "response_format": self.response_format,
            "guided_json": self.guided_json,
            "guided_regex": self.guided_regex,
            "guided_choice": self.guided_choice,
            "guided_grammar": self.guided_grammar,
            "structured_outputs": self.structured_outputs,
        }

    def tool_mode(self) -> ToolMode:
        return ToolMode.NONE

    def slo_targets(self, default: SLO) -> SLO:
        """The request's latency targets, each falling back to the server's default."""
        if self.slo is None:
            return default
        return SLO(  # in range already: SLOTargets has SLO's own bounds
            ttft_ms=self.slo.ttft_ms if self.slo.ttft_ms is not None else default.ttft_ms,
            tpot_ms=self.slo.tpot_ms if self.slo.tpot_ms is not None else default.tpot_ms,
        )

    def invalid(self, error: InvalidRequestError) -> APIError:
        """A 400 for an engine-side check, naming the field as this request spelled it."""
        return APIError(400, str(error), param=self.field_name(error.param), code=error.code)

    def field_name(self, param: str | None) -> str | None:
        return param


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def validate_request(model: type[Body], body: dict[str, Any]) -> Body:
    """`model.model_validate(body)`, with the first problem as a 400 naming its field."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise _validation_error(error) from None


def _validation_error(error: ValidationError) -> APIError:
    first = error.errors(include_url=False)[0]
    param = _field_path(first["loc"])
    message = first["msg"]
    if first["type"] == "missing":
        return APIError(400, f"{param} is required", param=param)
    if first["type"] == "extra_forbidden":
        return APIError(
            400,
            f"{param} is not supported by this server; remove it (unknown fields are refused "
            "rather than ignored, so nothing asked for is silently dropped)",
            param=param,
        )
    if first["type"].endswith("_type"):
        message = f"{message}, got {json_type(first['input'])}"
    if first["type"].startswith("baton_"):
        # Baton's own messages are predicates written to follow the field's name.
        return APIError(400, f"{param} {message}", param=param)
    return APIError(400, f"{param}: {message}", param=param)


def _field_path(loc: tuple[int | str, ...]) -> str:
    """`("messages", 0, "content")` → `messages[0].content`."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path
