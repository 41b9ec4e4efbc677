"""Chat completion request bodies (`/v1/chat/completions`, WebSocket chat frames): the
messages as the chat template sees them, tools, and the chat spellings of shared fields."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Int64, Name
from baton.app.api.guided import MAX_TOOLS, Tool, ToolChoice, ToolMode, structured_output, tool_mode
from baton.app.api.protocol import GenerationRequest
from baton.app.errors import APIError
from baton.core.structured_output import StructuredOutput

# OpenAI's bounds on `metadata`.
MAX_METADATA_PAIRS = 16
MetadataKey = Annotated[StrictStr, Field(max_length=64)]
MetadataValue = Annotated[StrictStr, Field(max_length=512)]
# vLLM's values: OpenAI's, and DeepSeek's "max".
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
# Template variables the request sets through fields of their own.
RESERVED_TEMPLATE_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "continue_final_message"}
)


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


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: Int64 | None = None
    logprobs: StrictBool = False
    top_logprobs: Int64 | None = None
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    modalities: list[StrictStr] | None = None
    service_tier: StrictStr | None = None
    # Identifiers that ask nothing of the server: prefix caching is automatic here.
    prompt_cache_key: Name | None = None
    safety_identifier: Name | None = None
    # OpenAI's tags for stored completions, and `store` itself: accepted and kept nowhere, as
    # vLLM does; they ask for retention after the response, and the response is the same.
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS
    )
    store: StrictBool | None = None
    # The chat template's inputs beyond the messages and tools (vLLM's).
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    reasoning_effort: ReasoningEffort | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _no_reserved_variables(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        for key in kwargs or {}:
            if key in RESERVED_TEMPLATE_VARIABLES:
                raise PydanticCustomError(
                    "baton_reserved",
                    f"must not set {key!r}: the request's own {key} field sets it",
                )
        return kwargs

    @model_validator(mode="after")
    def _continue_or_open(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError(
                400,
                "continue_final_message continues the last message, and add_generation_prompt "
                "(true unless sent) opens a new one; send add_generation_prompt: false with it",
                param="continue_final_message",
            )
        return self

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

    def structured_output(self) -> StructuredOutput | None:
        fields = {**self._guided_fields(), "parallel_tool_calls": self.parallel_tool_calls}
        return structured_output(fields, self.tools, self.tool_choice)

    def tool_mode(self) -> ToolMode:
        return tool_mode(self.tools, self.tool_choice)

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template sees them; None when the model may not call any."""
        if self.tool_mode() is ToolMode.NONE or not self.tools:
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def message_dicts(self) -> list[dict[str, Any]]:
        return [template_message(message.model_dump()) for message in self.messages]

    def template_variables(self) -> dict[str, Any]:
        """The chat template's variables besides the messages: the tools, `reasoning_effort`
        as vLLM passes it, then `chat_template_kwargs`, which win."""
        variables: dict[str, Any] = {}
        if (tools := self.tool_dicts()) is not None:
            variables["tools"] = tools
        if self.reasoning_effort is not None:
            variables["reasoning_effort"] = self.reasoning_effort
            # vLLM's: templates that think only when asked to (enable_thinking) follow it.
            variables["enable_thinking"] = self.reasoning_effort != "none"
        return {**variables, **(self.chat_template_kwargs or {})}

    def echo_text(self) -> str:
        """What `echo` puts before the answer: the last message's text when it is the
        assistant's (a prefill the answer continues), else nothing, as vLLM does."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant" or not isinstance(last.content, str):
            return ""
        return last.content


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn's tool calls with their arguments as objects: OpenAI sends them as
    JSON text, and chat templates (Qwen's, Llama's) write them out with `tojson`."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    converted = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, str):
            # Text that is not JSON is left as sent: the template shows it as text.
            with contextlib.suppress(orjson.JSONDecodeError):
                call = {**call, "function": {**function, "arguments": orjson.loads(arguments)}}
        converted.append(call)
    return {**message, "tool_calls": converted}
