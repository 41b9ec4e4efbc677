"""The objects Baton sends in OpenAI's wire format: completion and chat responses, their stream
chunks and SSE framing, usage, Baton's `timing`, and log-probabilities in both endpoints' shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from baton.core.batch import TokenLogprobs
from baton.core.outputs import RequestTiming
from baton.core.text.tokenizer import Tokenizer

DONE_EVENT = b"data: [DONE]\n\n"
LEGACY_LOGPROBS_KEYS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def timing(
    value: RequestTiming | None, token_times: list[float] | None = None
) -> dict[str, Any] | None:
    """The `timing` object; with `token_times` (engine seconds, one per output token) also
    `token_ms`: when each token was ready, in ms since the request arrived."""
    if value is None:
        return None
    body: dict[str, Any] = {
        "queue_ms": value.queue_ms,
        "ttft_ms": value.ttft_ms,
        "tpot_ms": value.tpot_ms,
        "e2e_ms": value.e2e_ms,
        "cached_prompt_tokens": value.cached_prompt_tokens,
        "preemptions": value.preemptions,
    }
    if token_times is not None:
        # The first token is ready at TTFT; the rest follow on the same clock.
        first = token_times[0] if token_times else 0.0
        body["token_ms"] = [value.ttft_ms + (t - first) * 1e3 for t in token_times]
    return body


@dataclass(slots=True)
class Envelope:
    """What every response object and chunk of one request repeats."""

    id: str
    created: int
    model: str

    def wrap(self, object_name: str, **fields: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            **fields,
        }


class CompletionFormat:
    """`/v1/completions`: `text` in choices, logprobs as parallel lists."""

    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def opening_choices(self, num_choices: int) -> list[dict[str, Any]]:
        return []

    def delta_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict | None,
        tool_calls: list[dict[str, Any]] | None = None,
        reasoning: str = "",
    ) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def final_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict | None,
        message_fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return self.delta_choice(index, text, finish_reason, logprobs)

    def logprobs(self, entries: list[TokenLogprobs], text_offset: int) -> dict[str, list]:
        """OpenAI's legacy shape. `text_offset` is where this delta starts in the completion;
        tokens after the first are placed by the lengths of the token strings before them."""
        tokens, offsets = [], []
        for entry in entries:
            token = token_text(self.tokenizer, entry.token_id)
            tokens.append(token)
            offsets.append(text_offset)
            text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [entry.logprob for entry in entries],
            "top_logprobs": [
                {token_text(self.tokenizer, t): lp for t, lp in entry.top} for entry in entries
            ],
            "text_offset": offsets,
        }

    def echo_logprobs(
        self, prompt_token_ids: list[int], entries: list[TokenLogprobs | None] | None
    ) -> dict[str, list]:
        """The prompt's part of an `echo` response's logprobs, in the same legacy shape: the
        first token has no context, so its log-probability and alternatives are null."""
        tokens, offsets = [], []
        text_offset = 0
        for token_id in prompt_token_ids:
            token = token_text(self.tokenizer, token_id)
            tokens.append(token)
            offsets.append(text_offset)
            text_offset += len(token)
        entries = entries or [None] * len(prompt_token_ids)
        return {
            "tokens": tokens,
            "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [
                None if e is None else {token_text(self.tokenizer, t): lp for t, lp in e.top}
                for e in entries
            ],
            "text_offset": offsets,
        }

    def prompt_logprobs(self, entries: list[TokenLogprobs | None]) -> list[dict | None]:
        """vLLM's `prompt_logprobs` choice field: per prompt token, by token id (as a string),
        the prompt token's and its top alternatives' log-probability and text."""
        return [
            None
            if entry is None
            else {
                str(token_id): {
                    "logprob": logprob,
                    "decoded_token": token_text(self.tokenizer, token_id),
                }
                for token_id, logprob in ((entry.token_id, entry.logprob), *entry.top)
            }
            for entry in entries
        ]

    @staticmethod
    def merge_logprobs(parts: list[dict]) -> dict[str, list]:
        merged: dict[str, list] = {key: [] for key in LEGACY_LOGPROBS_KEYS}
        for part in parts:
            for key, values in part.items():
                merged[key].extend(values)
        return merged


class ChatFormat:
    """`/v1/chat/completions`: `delta`/`message` in choices, logprobs as `content` entries."""

    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def opening_choices(self, num_choices: int) -> list[dict[str, Any]]:
        # OpenAI opens each choice with a delta naming the role before any content.
        return [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for index in range(num_choices)
        ]

    def delta_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict | None,
        tool_calls: list[dict[str, Any]] | None = None,
        reasoning: str = "",
    ) -> dict[str, Any]:
        """`tool_calls` are OpenAI's delta entries: the first of a call carries its index, id,
        type and name; later ones only more `function.arguments` text for that index.
        `reasoning` is thinking text (--reasoning-parser), sent as `reasoning_content`."""
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if text or (finish_reason is None and not tool_calls and not reasoning):
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        return {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    def final_choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        logprobs: dict | None,
        message_fields: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`message_fields` (`content`, `tool_calls`) replace the plain text content."""
        return {
            "index": index,
            "message": {"role": "assistant", "content": text, **(message_fields or {})},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }

    def logprobs(self, entries: list[TokenLogprobs], text_offset: int) -> dict[str, list]:
        return {"content": [self._content_entry(entry) for entry in entries]}

    def _content_entry(self, entry: TokenLogprobs) -> dict[str, Any]:
        top = [self._alternative(token_id, logprob) for token_id, logprob in entry.top]
        return {**self._alternative(entry.token_id, entry.logprob), "top_logprobs": top}

    def _alternative(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = token_text(self.tokenizer, token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    @staticmethod
    def merge_logprobs(parts: list[dict]) -> dict[str, list]:
        return {"content": [entry for part in parts for entry in part["content"]]}


ResponseFormat = CompletionFormat | ChatFormat


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token as text; a token holding part of a character shows as U+FFFD, as in OpenAI's."""
    return tokenizer.decode([token_id], skip_special_tokens=False)
