"""Chat completion request bodies (`/v1/chat/completions`, WebSocket chat frames): the
messages as the chat template sees them, tools, and the chat spellings of shared fields."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Int64, Name
from baton.app.api.guided import MAX_TOOLS, Tool, ToolChoice, ToolMode, structured_output, tool_mode
from baton.app.api.protocol import GenerationRequest
from baton.app.errors import APIError
from baton.core.structured_output import StructuredOutput


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
