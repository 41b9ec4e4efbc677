"""Request bodies of the OpenAI-compatible API (and of WebSocket `generate` frames): parsing,
validation with messages that name the field to fix, and conversion to engine parameters."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.errors import APIError
from core.request import MAX_SLO_MS, SLO
from core.sampling_params import InvalidRequestError, SamplingParams

EMPTY_PROMPT = "must not be empty; send some text or token ids"
# A prompt as the engine takes it: text to tokenize, or token ids as sent.
Prompt = str | list[int]

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


# Integers travel on as 64-bit values (trace attributes, tensors); JSON allows any size.
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
# Client-chosen strings that are echoed back or logged are bounded, so none amplifies output.
MAX_NAME_CHARS = 256
Name = Annotated[StrictStr, Field(max_length=MAX_NAME_CHARS)]


class StrictModel(BaseModel):
    """A body part whose every field is honoured: unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StreamOptions(StrictModel):
    include_usage: StrictBool = False


class SLOTargets(StrictModel):
    ttft_ms: StrictFloat | None = Field(default=None, gt=0, le=MAX_SLO_MS)
    tpot_ms: StrictFloat | None = Field(default=None, gt=0, le=MAX_SLO_MS)


class ChatMessage(BaseModel):
    """One chat turn. Extra keys (`name`, `tool_calls`, ...) reach the chat template as sent."""

    model_config = ConfigDict(extra="allow")

    role: StrictStr = Field(min_length=1)
    content: Any = None

    @field_validator("content")
    @classmethod
    def _text_content(cls, content: Any) -> str | None:
        # Text parts are joined as vLLM joins them, so templates always see a plain string.
        if content is None or isinstance(content, str):
            return content
        if isinstance(content, list) and all(_is_text_part(part) for part in content):
            return "\n".join(part["text"] for part in content)
        raise PydanticCustomError(
            "baton_content_type",
            "must be a string or a list of {'type': 'text', 'text': ...} parts; "
            "other content types are not supported",
        )


def _is_text_part(part: object) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


# OpenAI fields Baton does not implement yet, declared so that the values asking for nothing
# pass: the values accepted, and what a 400 says (after the field's name) to anything else.
ASK_NOTHING: dict[str, tuple[tuple[Any, ...], str]] = {
    "suffix": ((None, ""), "is not supported: Baton does not insert text; leave it out"),
    "response_format": (
        (None, {"type": "text"}),
        "is not supported yet (structured output); send {'type': 'text'} or leave it out",
    ),
    "tools": ((None, []), "are not supported yet (tool calling); leave them out"),
    "tool_choice": (
        (None, "none"),
        "is not supported yet (tool calling); send 'none' or leave it out",
    ),
    "modalities": ((None, ["text"]), "other than ['text'] are not supported; Baton serves text"),
    "store": ((None, False), "true is not supported: Baton keeps no completions"),
    "service_tier": ((None, "auto", "default"), "must be 'auto' or 'default': Baton has one tier"),
}


# Choices per prompt (`n`, and `best_of` candidates): each is an engine request of its own.
MAX_CHOICES = 16


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

    @field_validator(*ASK_NOTHING, check_fields=False)
    @classmethod
    def _asks_nothing(cls, value: Any, info: ValidationInfo) -> Any:
        accepted, message = ASK_NOTHING[info.field_name]
        if value not in accepted:
            raise PydanticCustomError("baton_unsupported", message)
        return value

    @field_validator("n")
    @classmethod
    def _bounded_choices(cls, n: int | None) -> int | None:
        if n is not None and not 1 <= n <= MAX_CHOICES:
            raise PydanticCustomError("baton_n", f"must be in [1, {MAX_CHOICES}], got {n}")
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

    def sampling_params(self) -> SamplingParams:
        """Engine parameters; OpenAI's defaults where a field is absent. Raises APIError."""
        max_tokens = self.requested_max_tokens()
        if max_tokens == 0 and not self.scores_prompt:
            raise APIError(
                400,
                f"{self.field_name('max_tokens')} 0 generates nothing: it is allowed only on "
                "/v1/completions with echo: true (to score the prompt); send a positive value",
                param=self.field_name("max_tokens"),
            )
        settings = {
            "max_tokens": self.default_max_tokens if max_tokens is None else max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "logprobs": self.requested_logprobs(),
            "prompt_logprobs": self.requested_prompt_logprobs(),
            "logit_bias": {int(k): v for k, v in self.logit_bias.items()}
            if self.logit_bias
            else None,
        }
        explicit = {k: v for k, v in settings.items() if v is not None or k == "max_tokens"}
        try:
            return SamplingParams(
                **explicit, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens
            )
        except InvalidRequestError as error:
            raise self.invalid(error) from None

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


class CompletionRequest(GenerationRequest):
    default_max_tokens: ClassVar[int | None] = 16  # OpenAI's default for completions

    prompt: Any
    logprobs: Int64 | None = None
    echo: StrictBool = False
    best_of: Int64 | None = None
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _known_prompt_shape(cls, prompt: Any) -> list[Prompt]:
        return _prompt_list(prompt)

    # vLLM's extension: the prompt tokens' log-probabilities with their top-N, echo or not.
    prompt_logprobs: Int64 | None = None

    @field_validator("best_of")
    @classmethod
    def _bounded_candidates(cls, best_of: int | None) -> int | None:
        if best_of is not None and not 1 <= best_of <= MAX_CHOICES:
            raise PydanticCustomError(
                "baton_best_of", f"must be in [1, {MAX_CHOICES}], got {best_of}"
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


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: Int64 | None = None
    logprobs: StrictBool = False
    top_logprobs: Int64 | None = None
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    modalities: list[StrictStr] | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    # Identifiers that ask nothing of the server: prefix caching is automatic here.
    prompt_cache_key: Name | None = None
    safety_identifier: Name | None = None

    @field_validator("messages")
    @classmethod
    def _some_messages(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if not messages:
            raise PydanticCustomError("baton_empty", "must not be empty; send at least one message")
        return messages

    def requested_max_tokens(self) -> int | None:
        # The newer name wins, as in OpenAI's API, where max_tokens is deprecated for chat.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    def field_name(self, param: str | None) -> str | None:
        if param == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        # The engine checks the tokenized template as `prompt` and top-N as `logprobs`.
        return {"prompt": "messages", "logprobs": "top_logprobs"}.get(param, param)

    def message_dicts(self) -> list[dict[str, Any]]:
        return [message.model_dump() for message in self.messages]


def _prompt_list(prompt: Any) -> list[Prompt]:
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


def validate_request(model: type[GenerationRequest], body: dict[str, Any]) -> GenerationRequest:
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
