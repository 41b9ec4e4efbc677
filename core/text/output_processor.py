"""Turns sampled tokens into text and decides when a request stops: EOS, stop tokens, stop
strings, max_tokens, the context length. Text that might still become a stop string is held
back, so a stop string never reaches the client."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.request import FinishReason, Request
from baton.core.text.detokenizer import IncrementalDetokenizer
from baton.core.text.tokenizer import Tokenizer


@dataclass(slots=True)
class _Stream:
    detokenizer: IncrementalDetokenizer | None
    # Longest stop string: what may still turn into one is held back, where matches can start.
    max_stop_len: int
    text: str = ""
    num_emitted_chars: int = 0


class OutputProcessor:
    def __init__(
        self, tokenizer: Tokenizer | None, eos_token_ids: list[int], max_model_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self._streams: dict[str, _Stream] = {}

    def add(self, request: Request) -> None:
        detokenizer = None
        if self.tokenizer is not None:
            params = request.sampling_params
            detokenizer = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                params.skip_special_tokens,
                params.spaces_between_special_tokens,
            )
        stops = request.sampling_params.stop
        stream = _Stream(detokenizer, max(map(len, stops), default=0))
        self._streams[request.request_id] = stream
        if detokenizer is not None and request.num_output_tokens:
            # Decoding one that another engine prefilled: its first token's text went out
            # there, less what a stop string might still claim, as `process` held it back.
            for token_id in request.token_ids[request.num_prompt_tokens :]:
                stream.text += detokenizer.add(token_id)
            holdback = (
                0 if request.sampling_params.include_stop_str_in_output else stream.max_stop_len - 1
            )
            stream.num_emitted_chars = max(0, len(stream.text) - max(holdback, 0))

    def remove(self, request_id: str) -> str:
        """Forget a request; returns whatever text it still held back."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return ""
        return stream.text[stream.num_emitted_chars :]

    def process(self, request: Request, token_id: int) -> tuple[str, FinishReason | None]:
        """Account for the token just appended to `request`: its text delta and stop reason."""
        params = request.sampling_params
        stream = self._streams[request.request_id]
        num_output = request.num_output_tokens
        may_stop = num_output >= params.min_tokens
        stop_token = (may_stop and not params.ignore_eos and token_id in self.eos_token_ids) or (
            may_stop and token_id in params.stop_token_ids
        )
        if stop_token:
            if params.include_stop_str_in_output and stream.detokenizer is not None:
                stream.text += stream.detokenizer.add(token_id)
            return self._release(stream, None), FinishReason.STOP
        at_limit = (params.max_tokens is not None and num_output >= params.max_tokens) or (
            request.num_tokens >= self.max_model_len
        )
        if stream.detokenizer is None:
            # No tokenizer (the simulator, tests), no text: nothing to hold back or match.
            return "", FinishReason.LENGTH if at_limit else None
        stream.text += stream.detokenizer.add(token_id)
        if params.stop and may_stop:
            cut = _find_stop(stream, params.stop, params.include_stop_str_in_output)
            if cut is not None:
                return self._release(stream, cut), FinishReason.STOP
        if at_limit:
            return self._release(stream, None), FinishReason.LENGTH
        # A stop string that is kept need not be held back: text after it only ever arrives
        # with the token that completes it, and is cut there.
        holdback = 0 if params.include_stop_str_in_output else max(stream.max_stop_len - 1, 0)
        end = max(stream.num_emitted_chars, len(stream.text) - holdback)
        delta = stream.text[stream.num_emitted_chars : end]
        stream.num_emitted_chars = end
        return delta, None

    def _release(self, stream: _Stream, cut: int | None) -> str:
        """The last delta of a finished request: all held-back text up to `cut`."""
        if cut is not None:
            stream.text = stream.text[:cut]
        elif stream.detokenizer is not None:
            stream.text += stream.detokenizer.flush()
        delta = stream.text[stream.num_emitted_chars :]
        stream.num_emitted_chars = len(stream.text)
        return delta


def _find_stop(stream: _Stream, stops: list[str], keep: bool) -> int | None:
    """Where the output ends for the earliest stop string: where it starts, or with `keep`
    where it ends. Looks only where a new match can be."""
    start = max(0, stream.num_emitted_chars - stream.max_stop_len)
    found = [(i, len(s)) for s in stops if (i := stream.text.find(s, start)) >= 0]
    if not found:
        return None
    index, length = min(found)
    return index + length if keep else index
