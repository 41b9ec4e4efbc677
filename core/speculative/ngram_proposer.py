"""Prompt lookup: propose as draft tokens what followed the latest earlier occurrence of the
sequence's last n tokens, in its own prompt and output (no extra model)."""

from __future__ import annotations

from array import array

# Token ids as 4-byte machine integers, so bytes.rfind (C speed) finds token runs.
_ITEM = "i"
_ITEM_SIZE = array(_ITEM).itemsize


class NgramProposer:
    """Tries suffixes from `ngram_max` tokens down to `ngram_min`: a longer match is a better
    predictor, and the latest match is the most relevant context."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` draft tokens to follow `token_ids`; [] when no suffix recurs."""
        if max_tokens <= 0 or len(token_ids) <= self.ngram_min:
            return []
        haystack = array(_ITEM, token_ids).tobytes()
        longest = min(self.ngram_max, len(token_ids) - 1)
        # Every longer match contains the shortest: without that one, nothing recurs.
        if _latest_match(haystack, self.ngram_min) is None:
            return []
        for n in range(longest, self.ngram_min - 1, -1):
            start = _latest_match(haystack, n)
            if start is not None:
                return _copy_on(token_ids, start + n, max_tokens)
        return []


def _latest_match(haystack: bytes, n: int) -> int | None:
    """Where the latest earlier occurrence of the last `n` tokens starts (in tokens); it must
    end before the suffix itself does, so something follows it."""
    suffix = haystack[len(haystack) - n * _ITEM_SIZE :]
    end = len(haystack) - _ITEM_SIZE
    while (found := haystack.rfind(suffix, 0, end)) >= 0:
        if found % _ITEM_SIZE == 0:
            return found // _ITEM_SIZE
        # A byte-level hit across token boundaries: look further back.
        end = found + len(suffix) - 1
    return None


def _copy_on(token_ids: list[int], start: int, count: int) -> list[int]:
    """`count` tokens copied from `start` on, an overlapping copy (as LZ77's) that runs into
    what it has copied: a match `p` tokens back continues a period-`p` repetition past the end."""
    period = len(token_ids) - start
    return [token_ids[start + j % period] for j in range(count)]
