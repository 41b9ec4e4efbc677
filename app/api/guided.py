"""Structured output and tool fields of a request body: their shapes (`response_format`,
vLLM's `guided_*` extensions, `tools`, `tool_choice`) and the one output constraint they ask
the engine for."""

from __future__ import annotations

import enum
from typing import Any, Literal

import orjson
from pydantic import Field, StrictBool, StrictStr

from baton.app.api.body_fields import Name, StrictModel
from baton.app.errors import APIError
from baton.core.structured_output import GuideKind, StructuredOutput

MAX_CHOICES = 1024
MAX_TOOLS = 128


class JSONSchemaFormat(StrictModel):
    name: Name = "response"
    description: StrictStr | None = None
    # `schema` is a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class FunctionDefinition(StrictModel):
    name: Name = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictModel):
    name: Name


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolMode(str, enum.Enum):
    """How a chat request's tools shape its output."""

    NONE = "none"  # no tools, or tool_choice "none": plain text
    AUTO = "auto"  # the model may call; calls are parsed from its text
    REQUIRED = "required"  # at least one call, generated under a schema
    NAMED = "named"  # exactly this function, its arguments generated under its schema


def tool_mode(tools: list[Tool] | None, tool_choice: ToolChoice | None) -> ToolMode:
    if tool_choice is not None and not tools and tool_choice != "none":
        raise APIError(
            400, "tool_choice needs tools; send the functions it may call", param="tool_choice"
        )
    if not tools or tool_choice == "none":
        return ToolMode.NONE
    if tool_choice is None or tool_choice == "auto":
        return ToolMode.AUTO  # OpenAI's default whenever tools are present
    if tool_choice == "required":
        return ToolMode.REQUIRED
    assert isinstance(tool_choice, NamedToolChoice)
    if named_tool(tools, tool_choice) is None:
        raise APIError(
            400,
            f"tool_choice names the function {tool_choice.function.name!r}, which is not among "
            f"tools ({', '.join(t.function.name for t in tools)})",
            param="tool_choice",
        )
    return ToolMode.NAMED


def named_tool(tools: list[Tool], choice: NamedToolChoice) -> Tool | None:
    return next((t for t in tools if t.function.name == choice.function.name), None)


def function_parameters(tool: Tool) -> dict[str, Any]:
    # A function without parameters takes an empty object, as OpenAI treats it.
    return tool.function.parameters or {"type": "object", "properties": {}}


def required_calls_schema(tools: list[Tool], parallel: bool) -> dict[str, Any]:
    """A JSON array of one or more `{"name", "parameters"}` calls, each valid for its function."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": function_parameters(t),
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def structured_output(
    fields: dict[str, Any], tools: list[Tool] | None = None, tool_choice: ToolChoice | None = None
) -> StructuredOutput | None:
    """The constraint the request's fields ask for, or None; a 400 when they ask for more than
    one. `fields` maps response_format and the guided_* field names to their values."""
    asked = [(name, value) for name, value in fields.items() if _asks(name, value)]
    mode = tool_mode(tools, tool_choice)
    if mode in (ToolMode.REQUIRED, ToolMode.NAMED):
        asked.append(("tool_choice", tool_choice))
    if len(asked) > 1:
        names = " and ".join(name for name, _ in asked)
        raise APIError(
            400, f"{names} each constrain the output; send one of them", param=asked[1][0]
        )
    if not asked:
        return None
    name, value = asked[0]
    if name == "tool_choice":
        assert tools is not None
        return _tool_constraint(tools, tool_choice, fields.get("parallel_tool_calls"))
    return _field_constraint(name, value)


def _asks(name: str, value: Any) -> bool:
    if name == "parallel_tool_calls" or value is None:
        return False
    return not (isinstance(value, ResponseFormat) and value.type == "text")


def _tool_constraint(
    tools: list[Tool], tool_choice: ToolChoice | None, parallel: bool | None
) -> StructuredOutput:
    if isinstance(tool_choice, NamedToolChoice):
        tool = named_tool(tools, tool_choice)
        assert tool is not None
        schema = function_parameters(tool)
    else:
        schema = required_calls_schema(tools, parallel is not False)
    return StructuredOutput(GuideKind.JSON_SCHEMA, _json_text(schema), "tool_choice")


def _field_constraint(name: str, value: Any) -> StructuredOutput:
    if isinstance(value, ResponseFormat):
        if value.type == "json_object":
            return StructuredOutput(GuideKind.JSON_OBJECT, "", name)
        if value.json_schema is None:
            raise APIError(
                400,
                "response_format of type json_schema needs json_schema: {name, schema}",
                param="response_format.json_schema",
            )
        return StructuredOutput(GuideKind.JSON_SCHEMA, _json_text(value.json_schema.schema_), name)
    if name == "guided_json":
        schema = value if isinstance(value, dict) else _parsed_schema(value)
        return StructuredOutput(GuideKind.JSON_SCHEMA, _json_text(schema), name)
    if name == "guided_regex":
        return StructuredOutput(GuideKind.REGEX, value, name)
    if name == "guided_choice":
        return StructuredOutput(GuideKind.CHOICE, _json_text(value), name)
    return StructuredOutput(GuideKind.GRAMMAR, value, name)


def _parsed_schema(text: str) -> dict[str, Any]:
    try:
        schema = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise APIError(
            400, f"guided_json is not a JSON schema ({error})", param="guided_json"
        ) from None
    if not isinstance(schema, dict):
        raise APIError(400, "guided_json must be a JSON schema object", param="guided_json")
    return schema


def _json_text(value: Any) -> str:
    # Key order kept: a schema's property order is the order the output writes them in.
    return orjson.dumps(value).decode()
