"""Structured output and tool fields of a request body: their shapes (`response_format`,
vLLM's `guided_*` extensions and `structured_outputs`, `tools`, `tool_choice`) and the one
output constraint they ask the engine for."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, StrictBool, StrictStr, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from baton.app.api.body_fields import Name, StrictModel
from baton.app.errors import APIError
from baton.core.structured_output import GuideKind, StructuredOutput

MAX_TOOLS = 128
# orjson writes at most this many nested arrays and objects.
MAX_JSON_DEPTH = 254
# The most calls one forced turn may make: the bound closes the array, so a model that keeps
# repeating a call still ends its turn with calls instead of running into max_tokens.
MAX_PARALLEL_CALLS = 16


class JSONSchemaFormat(StrictModel):
    name: Name = "response"
    description: StrictStr | None = None
    # `schema` is a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class StructuredOutputs(StrictModel):
    """vLLM's `structured_outputs`: the newer spelling of its guided_* fields, one constraint
    per request. Baton's JSON is always compact and never has properties the schema leaves out
    (xgrammar's strict mode), which is what the two `disable_*` options ask for; either value
    is accepted, as neither asks for whitespace or extra properties. One backend, so nothing
    ever falls back (`disable_fallback`)."""

    # `json` is a BaseModel attribute, hence the alias.
    json_: dict[str, Any] | StrictStr | None = Field(default=None, alias="json")
    regex: StrictStr | None = Field(default=None, min_length=1)
    choice: list[Annotated[StrictStr, Field(min_length=1)]] | None = Field(
        default=None, min_length=1
    )
    grammar: StrictStr | None = Field(default=None, min_length=1)
    json_object: StrictBool | None = None
    disable_any_whitespace: StrictBool = False
    disable_additional_properties: StrictBool = False
    disable_fallback: StrictBool = False
    whitespace_pattern: Any = None
    structural_tag: Any = None

    @field_validator("whitespace_pattern", "structural_tag")
    @classmethod
    def _not_supported(cls, value: Any, info: ValidationInfo) -> None:
        if value is not None:
            reason = {
                "whitespace_pattern": "Baton's JSON is compact, without free whitespace",
                "structural_tag": "Baton constrains the whole output, not tagged parts of it",
            }[info.field_name]
            raise PydanticCustomError(
                "baton_unsupported", f"is not supported: {reason}; leave it out"
            )

    def asked(self) -> list[tuple[str, Any]]:
        """The constraints it names, as (field path, value)."""
        values = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object or None,
        }
        return [(f"structured_outputs.{k}", v) for k, v in values.items() if v is not None]


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
    """A JSON array of `{"name", "parameters"}` calls, each valid for its function: one, or one
    to MAX_PARALLEL_CALLS with parallel calls."""
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
    most = MAX_PARALLEL_CALLS if parallel else 1
    return {"type": "array", "items": {"anyOf": calls}, "minItems": 1, "maxItems": most}


def structured_output(
    fields: dict[str, Any], tools: list[Tool] | None = None, tool_choice: ToolChoice | None = None
) -> StructuredOutput | None:
    """The constraint the request's fields ask for, or None; a 400 when they ask for more than
    one. `fields` maps response_format and the guided_* field names to their values."""
    asked = []
    for name, value in fields.items():
        if isinstance(value, StructuredOutputs):
            asked.extend(_one_of(value))
        elif _asks(name, value):
            asked.append((name, value))
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


def _one_of(request: StructuredOutputs) -> list[tuple[str, Any]]:
    asked = request.asked()
    if not asked:
        raise APIError(
            400,
            "structured_outputs names no constraint; send one of json, regex, choice, grammar "
            "or json_object: true",
            param="structured_outputs",
        )
    return asked


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
    return StructuredOutput(GuideKind.JSON_SCHEMA, _json_text(schema, "tools"), "tool_choice")


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
        schema = _json_text(value.json_schema.schema_, f"{name}.json_schema.schema")
        return StructuredOutput(GuideKind.JSON_SCHEMA, schema, name)
    # guided_json and structured_outputs.json, guided_regex and structured_outputs.regex, ...
    kind = name.removeprefix("structured_outputs.").removeprefix("guided_")
    if kind == "json":
        schema = value if isinstance(value, dict) else _parsed_schema(value, name)
        return StructuredOutput(GuideKind.JSON_SCHEMA, _json_text(schema, name), name)
    if kind == "json_object":
        return StructuredOutput(GuideKind.JSON_OBJECT, "", name)
    if kind == "regex":
        return StructuredOutput(GuideKind.REGEX, value, name)
    if kind == "choice":
        return StructuredOutput(GuideKind.CHOICE, _json_text(value, name), name)
    return StructuredOutput(GuideKind.GRAMMAR, value, name)


def _parsed_schema(text: str, param: str) -> dict[str, Any]:
    try:
        schema = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise APIError(400, f"{param} is not a JSON schema ({error})", param=param) from None
    if not isinstance(schema, dict):
        raise APIError(400, f"{param} must be a JSON schema object", param=param)
    return schema


def _json_text(value: Any, param: str) -> str:
    # Key order kept: a schema's property order is the order the output writes them in.
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        # The only failure for parsed JSON: nesting past orjson's limit (the request bounds
        # refuse far shallower schemas, but only once this text exists).
        raise APIError(
            400,
            f"{param} nests more than {MAX_JSON_DEPTH} levels deep; flatten it",
            param=param,
        ) from None
