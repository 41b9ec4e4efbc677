"""One chat choice's output text turned into content and tool calls, as stream deltas and as
the final message, for each `tool_choice`: a named function or required calls (the text is
calls only, read as it comes by baton.app.api.tools.forced_calls) or `auto` (calls parsed from the
model's own format, the text before them streamed as content)."""

from __future__ import annotations

from typing import Any

from baton.app.api.chat_protocol import ChatCompletionRequest
from baton.app.api.guided import ToolMode
from baton.app.api.protocol import GenerationRequest
from baton.app.api.tools.forced_calls import ForcedCalls
from baton.app.api.tools.tool_parsers import PARSERS, ToolCall, ToolCallParser, parser_for
from baton.app.errors import APIError
from baton.core.text.tokenizer import Tokenizer

# A delta: content text to send now, and OpenAI `tool_calls` delta entries.
Delta = tuple[str, list[dict[str, Any]]]


class ToolCallStream:
    def __init__(
        self, mode: ToolMode, parser: ToolCallParser | None, function_name: str | None
    ) -> None:
        self.parser = parser
        self.text = ""
        self.num_emitted = 0  # characters of `text` already sent as content
        self.content = ""
        # A forced output (required or named) is calls only, read as they are generated.
        self.forced = None if mode is ToolMode.AUTO else ForcedCalls(function_name)
        self.calls: list[ToolCall] = [] if self.forced is None else self.forced.calls

    def feed(self, piece: str) -> Delta:
        if self.forced is not None:
            return "", self.forced.feed(piece)
        self.text += piece
        assert self.parser is not None
        start = self.parser.call_start(self.text)
        end = len(self.text) if start is None else max(start, self.num_emitted)
        return self._content_up_to(end), []

    def finish(self) -> Delta:
        """The rest, once the output is complete."""
        if self.forced is not None:
            return "", self.forced.finish()
        assert self.parser is not None
        parsed = self.parser.parse(self.text)
        self.calls = parsed.tool_calls
        if not self.calls:
            return self._content_up_to(len(self.text)), []
        rest = parsed.content[self.num_emitted :]
        self.content = parsed.content
        self.num_emitted = len(self.text)
        return rest, [{"index": index, **call.to_dict()} for index, call in enumerate(self.calls)]

    def finish_reason(self, reason: str | None) -> str | None:
        # A turn whose answer is calls ends with "tool_calls", a forced named call included
        # (OpenAI says "stop" there; clients that branch on the reason want one rule). A forced
        # output cut short (max_tokens, a stop string) keeps the reason it was cut with.
        if reason != "stop":
            return reason
        done = self.forced.complete if self.forced is not None else bool(self.calls)
        return "tool_calls" if done else reason

    def message_fields(self) -> dict[str, Any]:
        """`content` and `tool_calls` of the final message (after `finish`)."""
        if not self.calls:
            # A forced output is never content, even cut before its first call had a name.
            return {"content": self.content if self.forced is None else None}
        return {"content": self.content or None, "tool_calls": [c.to_dict() for c in self.calls]}

    def _content_up_to(self, end: int) -> str:
        piece = self.text[self.num_emitted : end]
        self.num_emitted = max(end, self.num_emitted)
        self.content += piece
        return piece


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
