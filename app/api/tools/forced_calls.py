"""The calls a grammar forced (tool_choice "required" or a named function) read as they are
generated: a call is announced once its name is whole, then its arguments follow fragment by
fragment, the way OpenAI streams them.

The grammar fixes the shape, so reading needs no backtracking: a named call's output is its
arguments alone; a required one is the compact array `[{"name":"f","parameters":{...}},...]`,
its keys in that order (xgrammar writes required properties in schema order)."""

from __future__ import annotations

import re
from typing import Any

from baton.app.api.tools.tool_parsers import ToolCall

# The opening of one call in the required array, up to where its arguments start.
_CALL_HEAD = re.compile(r'\{"name":"([^"\\]*)","parameters":')


class _ValueEnd:
    """Finds where one JSON value ends, one character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def take(self, char: str) -> bool:
        """Whether `char` belongs to the value; `done` once the value is whole. A bare number,
        boolean or null ends only at the next character, which is not its own."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
                self.done = self.depth == 0
            return True
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]" or (char == "," and self.depth == 0):
            if self.depth == 0:
                self.done = True
                return False
            self.depth -= 1
            self.done = self.depth == 0
        return True


class ForcedCalls:
    """The calls read so far from a forced output; `complete` once the grammar's shape closed
    (the array's `]`, or a named call's whole arguments)."""

    def __init__(self, function_name: str | None) -> None:
        self.calls: list[ToolCall] = []
        self.complete = False
        self._text = ""
        self._pos = 0  # characters of `_text` already read
        self._arguments: _ValueEnd | None = None  # set while inside a call's arguments
        self._num_announced = 0
        if function_name is not None:
            self.calls.append(ToolCall(function_name, ""))
            self._arguments = _ValueEnd()
        self._in_array = function_name is None

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """OpenAI `tool_calls` delta entries for the calls `piece` starts or continues."""
        self._text += piece
        fragments: dict[int, str] = {}
        while self._pos < len(self._text) and not self.complete:
            if self._arguments is not None:
                index = len(self.calls) - 1
                fragments[index] = fragments.get(index, "") + self._read_arguments()
            elif not self._read_between_calls():
                break  # a call's opening not yet whole
            elif self._arguments is not None:
                fragments.setdefault(len(self.calls) - 1, "")  # announced with its name
        return self._deltas(fragments)

    def finish(self) -> list[dict[str, Any]]:
        """The calls not yet announced (a named call whose output was empty)."""
        return self._deltas({index: "" for index in range(self._num_announced, len(self.calls))})

    def _read_arguments(self) -> str:
        assert self._arguments is not None
        start = self._pos
        while self._pos < len(self._text) and not self._arguments.done:
            if not self._arguments.take(self._text[self._pos]):
                break
            self._pos += 1
        fragment = self._text[start : self._pos]
        self.calls[-1].arguments += fragment
        if self._arguments.done:
            self._arguments = None
            self.complete = not self._in_array
        return fragment

    def _read_between_calls(self) -> bool:
        """Reads the array's punctuation or a call's opening; False when more text is needed."""
        char = self._text[self._pos]
        # The array opens, a call follows or a call object closes; the grammar writes no
        # whitespace, but a decoded first token may carry a leading space.
        if char in "[,} \n":
            self._pos += 1
            return True
        if char == "]":
            self._pos += 1
            self.complete = True
            return True
        head = _CALL_HEAD.match(self._text, self._pos)
        if head is None:
            return False
        self.calls.append(ToolCall(head.group(1), ""))
        self._arguments = _ValueEnd()
        self._pos = head.end()
        return True

    def _deltas(self, fragments: dict[int, str]) -> list[dict[str, Any]]:
        entries = []
        for index in sorted(fragments):
            call = self.calls[index]
            if index >= self._num_announced:
                # A call's first delta carries its id, type and name, as OpenAI's do.
                entry = {"index": index, **call.to_dict()}
                entry["function"]["arguments"] = fragments[index]
                entries.append(entry)
            elif fragments[index]:
                entries.append({"index": index, "function": {"arguments": fragments[index]}})
        self._num_announced = max(self._num_announced, max(fragments, default=-1) + 1)
        return entries
