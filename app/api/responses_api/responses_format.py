"""The Responses API's wire objects: the output items of one response as they grow (reasoning,
message, function calls), the typed stream events that announce each change, and the
`response` object itself. Streamed or whole, a response is built by the same calls, so the
events always add up to the final object."""

from __future__ import annotations

import copy
import secrets
import time
from typing import Any

import orjson

# Where the text of each kind of item goes, and the names of its delta and done events.
TEXT_ITEMS = {
    "message": ("output_text", "response.output_text"),
    "reasoning": ("reasoning_text", "response.reasoning_text"),
}


def sse_typed_event(event: dict[str, Any]) -> bytes:
    """One event framed as OpenAI frames the Responses stream: its type as the SSE event name."""
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class ResponseBuilder:
    """One response's output items and the events that tell of them, numbered in order.

    At most one item is open at a time: text of another kind, or a new function call, closes
    it first, so each item's events come in one run as OpenAI's do."""

    def __init__(self, response_id: str, model: str, echo: dict[str, Any]) -> None:
        self.response_id = response_id
        self.model = model
        # The request's own settings, repeated in every response object as OpenAI does.
        self.echo = echo
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.sequence_number = 0
        self._open: dict[str, Any] | None = None
        self._index: dict[str, int] = {}  # output index by item id
        # Function calls by their index in the chat deltas, which number them from 0.
        self._calls: dict[int, dict[str, Any]] = {}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def response(
        self,
        status: str,
        usage: dict[str, Any] | None = None,
        incomplete_reason: str | None = None,
        error: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": copy.deepcopy(self.output),
            "error": error,
            "incomplete_details": None
            if incomplete_reason is None
            else {"reason": incomplete_reason},
            "usage": usage,
            **self.echo,
        }

    def opening(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress")
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def add_text(self, kind: str, delta: str) -> list[dict[str, Any]]:
        """`delta` appended to the open item of `kind` ("message" or "reasoning"), opening
        one if need be."""
        if not delta:
            return []
        events = []
        item = self._open
        if item is None or item["type"] != kind:
            events += self.close()
            events += self._open_text_item(kind)
            item = self._open
        assert item is not None
        item["content"][0]["text"] += delta
        _, prefix = TEXT_ITEMS[kind]
        fields = {"logprobs": []} if kind == "message" else {}
        events.append(self.event(f"{prefix}.delta", **self._where(item), delta=delta, **fields))
        return events

    def add_call_deltas(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Chat `tool_calls` delta entries as function_call items: an entry with an unseen
        index opens its call (it carries the call's id and name), later ones add arguments."""
        events = []
        for entry in entries:
            function = entry.get("function", {})
            item = self._calls.get(entry["index"])
            if item is None:
                events += self.close()
                item = {
                    "id": item_id("fc"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": entry["id"],
                    "name": function["name"],
                    "arguments": "",
                }
                self._calls[entry["index"]] = item
                events += self._add_item(item)
            delta = function.get("arguments") or ""
            if delta:
                item["arguments"] += delta
                events.append(
                    self.event(
                        "response.function_call_arguments.delta", **self._where(item), delta=delta
                    )
                )
        return events

    def close(self, status: str = "completed") -> list[dict[str, Any]]:
        """Close the open item, if any, with `status`."""
        item, self._open = self._open, None
        if item is None:
            return []
        where = self._where(item)
        events = []
        if item["type"] == "function_call":
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=where["item_id"],
                    output_index=where["output_index"],
                    arguments=item["arguments"],
                )
            )
        else:
            part = item["content"][0]
            _, prefix = TEXT_ITEMS[item["type"]]
            fields = {"logprobs": []} if item["type"] == "message" else {}
            events.append(self.event(f"{prefix}.done", **where, text=part["text"], **fields))
            events.append(self.event("response.content_part.done", **where, part=dict(part)))
        item["status"] = status
        events.append(
            self.event(
                "response.output_item.done",
                output_index=where["output_index"],
                item=copy.deepcopy(item),
            )
        )
        return events

    def _open_text_item(self, kind: str) -> list[dict[str, Any]]:
        part_type, _ = TEXT_ITEMS[kind]
        part: dict[str, Any] = {"type": part_type, "text": ""}
        if kind == "message":
            part |= {"annotations": [], "logprobs": []}
            item = {"id": item_id("msg"), "type": "message", "role": "assistant"}
        else:
            item = {"id": item_id("rs"), "type": "reasoning", "summary": []}
        item |= {"status": "in_progress", "content": []}
        events = self._add_item(item)
        item["content"].append(part)
        events.append(self.event("response.content_part.added", **self._where(item), part=part))
        return events

    def _add_item(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self._open = item
        index = len(self.output) - 1
        self._index[item["id"]] = index
        # A copy: the added event shows the item as it opened, before any content.
        return [
            self.event("response.output_item.added", output_index=index, item=copy.deepcopy(item))
        ]

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        fields: dict[str, Any] = {"item_id": item["id"], "output_index": self._index[item["id"]]}
        if item["type"] != "function_call":
            fields["content_index"] = 0
        return fields


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        # Thinking and answer tokens come as one count from the engine.
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
