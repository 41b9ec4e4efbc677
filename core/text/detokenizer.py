"""Incremental detokenization: one request's token ids in, text deltas out, no character split.

A prefix window, as vLLM's; why not `tokenizers`' `DecodeStream` is in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from baton.core.text.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"
# Prompt tokens decoded ahead of the first output token: enough for its leading space.
PROMPT_CONTEXT_TOKENS = 4
# The window is cut back to its last character boundary once it holds this many ids, so a
# step costs one decode of about this many tokens whatever the output length.
WINDOW_TOKENS = 16
# A UTF-8 character is at most 4 bytes, so this many ids that never end on a whole character
# are invalid bytes (a degenerate model); they are released as U+FFFD to keep the window bounded.
MAX_HELD_TOKENS = 32


class IncrementalDetokenizer:
    """Turns one request's output ids into text deltas.

    The deltas and `flush()` concatenate to `decode(prompt + output)` minus `decode(prompt)`.
    Text ending in U+FFFD is held back, because that is how a decode shows a character whose
    remaining bytes are in tokens not yet generated. Only invalid UTF-8 (a degenerate model)
    can make them differ: past `MAX_HELD_TOKENS`, and with byte-fallback decoders, which turn
    earlier valid bytes of a byte-token run into U+FFFD once an invalid byte joins the run.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # vLLM's meaning for fast tokenizers: only shown special tokens can be adjacent.
        self._join_added_tokens = not (skip_special_tokens or spaces_between_special_tokens)
        self._last_was_added = False
        self._ids = _prompt_context(tokenizer, prompt_token_ids, skip_special_tokens)
        text = self._decode()
        # Characters of the window's decode that are out: handed out, or prompt context.
        self._num_settled = _num_final_chars(text)
        # Where in the window the last whole-character boundary is: the next place to cut it.
        self._boundary = len(self._ids) if self._num_settled == len(text) else 0
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        """All output text handed out so far."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def add(self, token_id: int) -> str:
        """Take the next output id; return the text it completes (often "", never broken)."""
        if self._skip_special_tokens and token_id in self._tokenizer.all_special_ids:
            # Decode would drop it anyway; kept out of the window, it cannot crowd out context.
            return ""
        if self._join_added_tokens:
            added = self._tokenizer.added_tokens.get(token_id)
            follows_added, self._last_was_added = self._last_was_added, added is not None
            if added is not None and follows_added:
                return self._restart_at(token_id, added)
        self._ids.append(token_id)
        text = self._decode()
        end = _num_final_chars(text)
        if end < len(text) and len(self._ids) - self._boundary > MAX_HELD_TOKENS:
            end = len(text)
        delta = text[self._num_settled : end]
        self._num_settled = max(self._num_settled, end)
        if end == len(text):
            self._at_boundary()
        if delta:
            self._pieces.append(delta)
        return delta

    def flush(self) -> str:
        """End of stream: return whatever is held back, an unfinished character as U+FFFD."""
        text = self._decode()
        delta = text[self._num_settled :]
        self._num_settled = len(text)
        self._at_boundary()
        if delta:
            self._pieces.append(delta)
        return delta

    def _restart_at(self, token_id: int, text: str) -> str:
        """Hand out `text` for `token_id` as written, and restart the window at it. Safe: the
        added token before it ended on a whole character, so nothing was held back."""
        self._ids = [token_id]
        self._num_settled = len(self._decode())
        self._boundary = 1
        self._pieces.append(text)
        return text

    def _at_boundary(self) -> None:
        """Everything decoded so far is out: cut the window back once it has grown."""
        if len(self._ids) > WINDOW_TOKENS and self._boundary > 0:
            # Cut at the previous boundary, not here, so the next token still has context. The
            # kept text must not be empty: decoders that drop the leading space of a decode's
            # first token would drop the next token's. If it is, keep the boundary and retry.
            kept = self._tokenizer.decode(self._ids[self._boundary :], self._skip_special_tokens)
            if not kept:
                return
            del self._ids[: self._boundary]
            self._num_settled = len(kept)
        self._boundary = len(self._ids)

    def _decode(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special_tokens)


def _num_final_chars(text: str) -> int:
    """Length of `text` without its trailing U+FFFD run, the part later ids may still change."""
    return len(text.rstrip(REPLACEMENT))


def _prompt_context(
    tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool
) -> list[int]:
    """The last few prompt ids that decode to text, not beginning inside a character."""
    # Three more than needed: a character's tail spans at most three byte tokens.
    wanted = PROMPT_CONTEXT_TOKENS + 3
    context: list[int] = []
    for token_id in reversed(prompt_token_ids):
        if len(context) == wanted:
            break
        if not (skip_special_tokens and token_id in tokenizer.all_special_ids):
            context.append(token_id)
    context.reverse()
    start = max(0, len(context) - PROMPT_CONTEXT_TOKENS)
    # Byte-fallback decoders turn a run of byte tokens into U+FFFDs unless the whole run is
    # valid UTF-8, so a window opening on the tail of a character would spoil what follows.
    while start > 0 and tokenizer.decode(context[start:], skip_special_tokens).startswith(
        REPLACEMENT
    ):
        start -= 1
    return context[start:]
