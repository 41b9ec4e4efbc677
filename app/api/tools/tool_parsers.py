"""Tool calls written by a model in its chat template's format, parsed into OpenAI's shape:
Hermes/Qwen `<tool_call>{...}</tool_call>`, Llama 3 JSON `{"name": ..., "parameters": ...}`,
Mistral `[TOOL_CALLS][...]`. One small parser per format, chosen by name or by the template."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson


@dataclass(slots=True)
class ToolCall:
    """One call as OpenAI returns it; `arguments` is JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True)
class ParsedOutput:
    """A model's text split into what it said and what it called."""

    content: str
    tool_calls: list[ToolCall]


class ToolCallParser:
    """A format: the text that opens a call, and how calls are read out of the whole output."""

    name: ClassVar[str]
    # Where one of these appears, the text from there on may be a call: streaming holds it.
    markers: ClassVar[tuple[str, ...]]
    # True when a call can only start the output (a marker later on is plain text).
    only_at_start: ClassVar[bool] = False

    def parse(self, text: str) -> ParsedOutput:
        raise NotImplementedError

    def call_start(self, text: str) -> int | None:
        """Where the first possible call starts in `text`, also a marker cut off at its end
        (streaming cannot tell yet); None if no call can start in it."""
        body = text.lstrip() if self.only_at_start else text
        offset = len(text) - len(body)
        for marker in self.markers:
            if self.only_at_start:
                if body.startswith(marker) or (body and marker.startswith(body)):
                    return offset
                continue
            found = body.find(marker)
            if found >= 0:
                return offset + found
        if self.only_at_start:
            return None
        return _partial_marker_at_end(text, self.markers)


def _partial_marker_at_end(text: str, markers: tuple[str, ...]) -> int | None:
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:length]):
                return len(text) - length
    return None


def _call(value: Any, arguments_key: str) -> ToolCall | None:
    """A call from `{"name": ..., arguments_key: {...}}`; None for anything else."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):
        return ToolCall(value["name"], arguments)
    return ToolCall(value["name"], orjson.dumps(arguments).decode())


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


class HermesParser(ToolCallParser):
    """Hermes and Qwen 2.5/3: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
    any number, after optional text."""

    name = "hermes"
    markers = ("<tool_call>",)
    _CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> ParsedOutput:
        start = text.find("<tool_call>")
        if start < 0:
            return ParsedOutput(text, [])
        calls = [_call(_loads(body), "arguments") for body in self._CALL.findall(text[start:])]
        if not calls or None in calls:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start].rstrip(), [c for c in calls if c is not None])


class Llama3JSONParser(ToolCallParser):
    """Llama 3.1+: the whole output is `{"name": ..., "parameters": {...}}`, optionally after
    `<|python_tag|>`, several separated by `;`."""

    name = "llama3_json"
    markers = ("<|python_tag|>", "{")
    only_at_start = True

    def parse(self, text: str) -> ParsedOutput:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return ParsedOutput(text, [])
        calls = [_call(value, "parameters") for value in _objects(body)]
        if not calls or None in calls:
            return ParsedOutput(text, [])
        return ParsedOutput("", [c for c in calls if c is not None])


def _objects(body: str) -> list[Any]:
    """The values of `{...}; {...}`; a None entry where the text is not JSON."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    position = 0
    while position < len(body):
        try:
            value, position = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return [*values, None]
        values.append(value)
        position = len(body) - len(body[position:].lstrip().removeprefix(";").lstrip())
    return values


class MistralParser(ToolCallParser):
    """Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` after optional text."""

    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def parse(self, text: str) -> ParsedOutput:
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return ParsedOutput(text, [])
        value = _loads(text[start + len("[TOOL_CALLS]") :].strip())
        if isinstance(value, dict):
            value = [value]
        calls = [_call(v, "arguments") for v in value] if isinstance(value, list) else []
        if not calls or None in calls:
            return ParsedOutput(text, [])
        return ParsedOutput(text[:start].rstrip(), [c for c in calls if c is not None])


PARSERS: dict[str, type[ToolCallParser]] = {
    parser.name: parser for parser in (HermesParser, Llama3JSONParser, MistralParser)
}
# What in a chat template's text tells its format, checked in this order.
TEMPLATE_SIGNS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
)


def parser_for(name: str | None, chat_templates: dict[str, str]) -> ToolCallParser | None:
    """The parser `name`d (`--tool-call-parser`), else the one the chat template's text shows,
    else None."""
    if name is not None:
        return PARSERS[name]()
    text = "\n".join(chat_templates.values())
    for sign, parser in TEMPLATE_SIGNS:
        if sign in text:
            return PARSERS[parser]()
    return None
