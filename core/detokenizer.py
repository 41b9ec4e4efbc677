"""Incremental detokenization: one request's token ids in, text deltas out, no character split.

The method is the prefix-window one (as in vLLM and `tokenizers`' own `DecodeStream`): decode a
short window of recent ids and hand out the part of its text not handed out before. Decoding the
window rather than the new token alone keeps what depends on neighbours right: byte-level BPE
characters split over several tokens, and the leading space SentencePiece decoders drop from the
first token of a decode. It is written here rather than taken from `DecodeStream` because that
keeps no way to release what it holds back when the stream ends (an unfinished character would
vanish instead of showing as U+FFFD) and withholds all new text while it ends in U+FFFD, where
this releases the text before the unfinished character.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.tokenizer import Tokenizer

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
    """Turns one request's output ids into text deltas whose concatenation (with `flush()`)
    equals the tokenizer's decode of all the output ids.

    Text ending in U+FFFD is held back, because that is how a decode shows a character whose
    remaining bytes are in tokens not yet generated.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
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

    def _at_boundary(self) -> None:
        """Everything decoded so far is out: cut the window back once it has grown."""
        if len(self._ids) > WINDOW_TOKENS and self._boundary > 0:
            # Cut at the previous boundary, not here, so the next token still has context.
            del self._ids[: self._boundary]
            self._num_settled = len(self._decode())
        self._boundary = len(self._ids)

    def _decode(self) -> str:
        return self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special_tokens)


def _num_final_chars(text: str) -> int:
    """Length of `text` without its trailing U+FFFD run, the part later ids may still change."""
    return len(text.rstrip(REPLACEMENT))


def _prompt_context(
    tokenizer: Tokenizer, prompt_token_ids: Sequence[int], skip_special_tokens: bool
) -> list[int]:
    """The last few prompt ids, widened so they do not begin in the middle of a character."""
    start = max(0, len(prompt_token_ids) - PROMPT_CONTEXT_TOKENS)
    # Byte-fallback decoders turn a run of byte tokens into U+FFFDs unless the whole run is
    # valid UTF-8, so a window opening on the tail of a character would spoil what follows.
    for _ in range(3):
        if start == 0:
            break
        head = tokenizer.decode(list(prompt_token_ids[start:]), skip_special_tokens)
        if not head.startswith(REPLACEMENT):
            break
        start -= 1
    return list(prompt_token_ids[start:])
