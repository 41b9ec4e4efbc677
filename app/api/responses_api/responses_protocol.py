"""The body of `POST /v1/responses` (OpenAI's Responses API): its input items, tools and text
format, checked field by field, and the chat request it becomes, so the Responses API runs on
the chat machinery (template, admission, structured output, tool-call parsing)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Int64, Name, StrictModel
from baton.app.api.chat_protocol import (
    MAX_METADATA_PAIRS,
    ChatCompletionRequest,
    MetadataKey,
    MetadataValue,
    ReasoningEffort,
)
from baton.app.api.guided import MAX_TOOLS, FunctionDefinition, JSONSchemaFormat
from baton.app.api.protocol import json_type, validate_request
from baton.app.errors import APIError


class TextPart(StrictModel):
    """A text content part: `input_text` in what the user sends, `output_text` in assistant
    turns a client passes back from an earlier response."""

    type: Literal["input_text", "output_text"]
    text: StrictStr
    # Carried by output_text parts passed back; they say nothing about the new response.
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class MessageItem(StrictModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[TextPart]
    # Output items passed back as input keep their id and status; neither changes the prompt.
    id: Name | None = None
    status: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class FunctionCallItem(StrictModel):
    """A call the model made in an earlier response, passed back with the conversation."""

    type: Literal["function_call"]
    call_id: Name
    name: Name
    arguments: StrictStr
    id: Name | None = None
    status: StrictStr | None = None


class FunctionCallOutputItem(StrictModel):
    """What the client's function returned for `call_id`."""

    type: Literal["function_call_output"]
    call_id: Name
    output: StrictStr | list[TextPart]
    id: Name | None = None
    status: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(part.text for part in self.output)


class ReasoningItem(StrictModel):
    """An earlier response's reasoning, passed back when a client resends the whole output.
    It is left out of the prompt, as chat templates leave out earlier turns' thinking."""

    type: Literal["reasoning"]
    id: Name | None = None
    summary: list[Any] | None = None
    content: list[Any] | None = None
    encrypted_content: StrictStr | None = None
    status: StrictStr | None = None


def _item_type(item: Any) -> str | None:
    # A message may leave out its type, as OpenAI's "easy" input messages do.
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", None)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(
        _item_type,
        custom_error_type="baton_item_type",
        custom_error_message="must be a message, function_call, function_call_output or "
        "reasoning item; other item types are not supported",
    ),
]


class FunctionTool(FunctionDefinition):
    """The Responses API's flat function tool: the chat tool's `function` fields beside `type`."""

    type: Literal["function"]

    def chat_tool(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class NamedFunction(StrictModel):
    type: Literal["function"]
    name: Name


class SchemaTextFormat(JSONSchemaFormat):
    type: Literal["json_schema"]


class PlainTextFormat(StrictModel):
    type: Literal["text", "json_object"]


class TextConfig(StrictModel):
    format: PlainTextFormat | SchemaTextFormat | None = None
    # "medium" is what a model says unprompted; the other values ask for a style Baton
    # cannot impose on an open model.
    verbosity: Literal["medium"] | None = None


class ReasoningConfig(StrictModel):
    effort: ReasoningEffort | None = None


class ResponsesRequest(StrictModel):
    """`POST /v1/responses`. Every field is honoured or refused with a 400 naming it; Baton
    keeps no responses, so `store` is accepted and nothing is stored, and
    `previous_response_id` is refused."""

    model: Name | None = None
    input: list[InputItem]
    instructions: StrictStr | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    max_output_tokens: Int64 | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    stream: StrictBool = False
    store: StrictBool | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(
        default=None, max_length=MAX_METADATA_PAIRS
    )
    previous_response_id: StrictStr | None = None
    # Asks for nothing beyond what Baton does: the whole input fits or the request is a 400.
    truncation: Literal["disabled"] | None = None
    user: Name | None = None
    prompt_cache_key: Name | None = None
    safety_identifier: Name | None = None

    @field_validator("previous_response_id")
    @classmethod
    def _nothing_stored(cls, value: str | None) -> None:
        if value is not None:
            raise PydanticCustomError(
                "baton_unsupported",
                "is not supported: Baton keeps no responses to continue from; send the "
                "conversation so far as input items (messages, function_call and "
                "function_call_output items) instead",
            )

    @model_validator(mode="before")
    @classmethod
    def _text_input_as_a_message(cls, body: Any) -> Any:
        # A string is one user message; as a list it gets the items' checks and error paths.
        value = body.get("input") if isinstance(body, dict) else None
        if isinstance(value, str):
            return {**body, "input": [{"role": "user", "content": value}]}
        if value is not None and not isinstance(value, list):
            raise APIError(
                400,
                f"input must be a string or a list of input items, got {json_type(value)}",
                param="input",
            )
        return body

    @field_validator("input")
    @classmethod
    def _some_input(cls, items: list[Any]) -> list[Any]:
        if not items:
            raise PydanticCustomError("baton_empty", "must not be empty; send at least one item")
        return items

    @model_validator(mode="after")
    def _one_constraint(self) -> ResponsesRequest:
        form = self.text.format if self.text is not None else None
        forced = self.tool_choice == "required" or isinstance(self.tool_choice, NamedFunction)
        if forced and form is not None and form.type != "text":
            raise APIError(
                400,
                "text.format and tool_choice each constrain the output; send one of them",
                param="tool_choice",
            )
        return self

    def chat_request(self) -> ResponsesChatRequest:
        """The same request as a chat completion, which admission and the tool and
        structured-output machinery already serve."""
        body: dict[str, Any] = {
            "messages": self.chat_messages(),
            "model": self.model,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_completion_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls,
            "stream": self.stream,
            "user": self.user,
        }
        if self.tools is not None:
            body["tools"] = [tool.chat_tool() for tool in self.tools]
        if isinstance(self.tool_choice, NamedFunction):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        else:
            body["tool_choice"] = self.tool_choice
        if self.text is not None and self.text.format is not None:
            body["response_format"] = _response_format(self.text.format)
        if self.reasoning is not None:
            body["reasoning_effort"] = self.reasoning.effort
        return validate_request(ResponsesChatRequest, body)

    def chat_messages(self) -> list[dict[str, Any]]:
        """The input as chat turns: `instructions` as the system turn, consecutive function
        calls as one assistant turn's tool_calls, function outputs as tool turns."""
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            if isinstance(item, MessageItem):
                # Open models' templates know "system"; OpenAI's developer role is its successor.
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": item.text()})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
                )
        if not messages:
            raise APIError(
                400, "input holds only reasoning items; send at least one message", param="input"
            )
        return messages


def _response_format(form: PlainTextFormat | SchemaTextFormat) -> dict[str, Any]:
    if isinstance(form, SchemaTextFormat):
        schema = form.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
        return {"type": "json_schema", "json_schema": schema}
    return {"type": form.type}


class ResponsesChatRequest(ChatCompletionRequest):
    """A Responses request in its chat form: errors found past parsing (by admission, the
    engine's checks, the grammar compiler) name the field as the Responses API spells it."""

    def field_name(self, param: str | None) -> str | None:
        name = super().field_name(param)
        return {
            "max_completion_tokens": "max_output_tokens",
            "max_tokens": "max_output_tokens",
            "messages": "input",
            "response_format": "text.format",
        }.get(name or "", name)
