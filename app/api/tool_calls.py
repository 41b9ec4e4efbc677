"""One chat choice's output text turned into content and tool calls, as stream deltas and as
the final message, for each `tool_choice`: a named function (the text is its arguments), a
required call (the text is a JSON array of calls) or `auto` (calls parsed from the model's own
format, the text before them streamed as content)."""

from __future__ import annotations

from typing import Any

import orjson

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.guided import ToolMode
from baton.app.api.protocol import GenerationRequest
from baton.app.api.tool_parsers import PARSERS, ToolCall, ToolCallParser, parser_for
from baton.app.errors import APIError
from baton.core.text.tokenizer import Tokenizer

# A delta: content text to send now, and OpenAI `tool_calls` delta entries.
Delta = tuple[str, list[dict[str, Any]]]


class ToolCallStream:
    def __init__(
        self, mode: ToolMode, parser: ToolCallParser | None, function_name: str | None
    ) -> None:
        self.mode = mode
        self.parser = parser
        self.function_name = function_name
        self.text = ""
        self.num_emitted = 0  # characters of `text` already sent as content or arguments
        self.calls: list[ToolCall] = []
        self.content = ""
        self._announced = False

    def feed(self, piece: str) -> Delta:
        self.text += piece
        if self.mode is ToolMode.NAMED:
            return "", self._argument_delta()
        if self.mode is ToolMode.REQUIRED:
            return "", []  # the array is read whole at the end
        assert self.parser is not None
        start = self.parser.call_start(self.text)
        end = len(self.text) if start is None else max(start, self.num_emitted)
        return self._content_up_to(end), []

    def finish(self) -> Delta:
        """The rest, once the output is complete."""
        if self.mode is ToolMode.NAMED:
            return "", self._argument_delta(closing=True)
        if self.mode is ToolMode.REQUIRED:
            self.calls = _required_calls(self.text)
        else:
            assert self.parser is not None
            parsed = self.parser.parse(self.text)
            self.calls = parsed.tool_calls
            if self.calls:
                rest = parsed.content[self.num_emitted :]
                self.content = parsed.content
                self.num_emitted = len(self.text)
                return rest, self._call_deltas()
        if not self.calls:
            return self._content_up_to(len(self.text)), []
        self.num_emitted = len(self.text)
        return "", self._call_deltas()

    def finish_reason(self, reason: str | None) -> str | None:
        # OpenAI ends a forced named call with "stop", and any other turn that called with
        # "tool_calls".
        if reason == "stop" and self.calls and self.mode is not ToolMode.NAMED:
            return "tool_calls"
        return reason

    def message_fields(self) -> dict[str, Any]:
        """`content` and `tool_calls` of the final message (after `finish`)."""
        if not self.calls:
            return {"content": self.content}
        return {"content": self.content or None, "tool_calls": [c.to_dict() for c in self.calls]}

    def _content_up_to(self, end: int) -> str:
        piece = self.text[self.num_emitted : end]
        self.num_emitted = max(end, self.num_emitted)
        self.content += piece
        return piece

    def _argument_delta(self, closing: bool = False) -> list[dict[str, Any]]:
        piece = self.text[self.num_emitted :]
        self.num_emitted = len(self.text)
        if not self.calls:
            assert self.function_name is not None
            self.calls = [ToolCall(self.function_name, "")]
        call = self.calls[0]
        call.arguments += piece
        if not self._announced:
            if not piece and not closing:
                return []
            # The first delta of a call carries its id and name, as OpenAI's do.
            self._announced = True
            return [{"index": 0, **call.to_dict()}]
        return [{"index": 0, "function": {"arguments": piece}}] if piece else []

    def _call_deltas(self) -> list[dict[str, Any]]:
        return [{"index": index, **call.to_dict()} for index, call in enumerate(self.calls)]


def _required_calls(text: str) -> list[ToolCall]:
    """The calls of `[{"name": ..., "parameters": {...}}, ...]`, the shape the schema forced;
    none if the output was cut short (max_tokens) before the array closed."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return [
        ToolCall(entry["name"], orjson.dumps(entry["parameters"]).decode())
        for entry in value
        if isinstance(entry, dict) and "name" in entry and "parameters" in entry
    ]


def tool_call_streams(
    request: GenerationRequest, tokenizer: Tokenizer, parser_name: str | None, num_choices: int
) -> list[ToolCallStream] | None:
    """One stream per choice when the request has tools the model may call, else None; a 400
    for `auto` when no format is known for this model."""
    if not isinstance(request, ChatCompletionRequest):
        return None
    mode = request.tool_mode()
    if mode is ToolMode.NONE:
        return None
    parser = None
    if mode is ToolMode.AUTO:
        parser = parser_for(parser_name, tokenizer.chat_templates)
        if parser is None:
            raise APIError(
                400,
                "tool_choice 'auto' needs the model's tool-call format, and this model's chat "
                "template shows none; start the server with --tool-call-parser "
                f"{{{','.join(PARSERS)}}}, or send tool_choice 'required' or a named function",
                param="tool_choice",
            )
    name = None
    if mode is ToolMode.NAMED:
        assert request.tool_choice is not None and not isinstance(request.tool_choice, str)
        name = request.tool_choice.function.name
    return [ToolCallStream(mode, parser, name) for _ in range(num_choices)]
