"""Static batching's mechanism, for the `static` policy: a batch formed once, each member holding
KV for its longest possible answer from the start, run as one padded tensor until its longest
member ends. The scheduler reserves and records the batch; this module says how much a slot
reserves and what padding each step of the batch carries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from baton.core.batch import Batch, Padding
from baton.core.request import Request


def reserved_tokens(request: Request) -> int:
    """The tokens a static slot holds KV for from the start: the prompt plus `max_tokens` (the
    engine resolves an unset one to the room the context, or the whole cache, leaves)."""
    max_tokens = request.sampling_params.max_tokens
    assert max_tokens is not None, "the engine resolves max_tokens before scheduling"
    return request.num_prompt_tokens + max_tokens


@dataclass(frozen=True, slots=True)
class StaticBatch:
    """A static batch as a dense executor lays it out: one row per member for as long as the
    batch runs, finished members included, each prompt left-padded to the longest
    (`prompt_len`), so that every row is as long as the longest prompt plus the tokens
    generated so far."""

    rows: int
    prompt_len: int

    @classmethod
    def of(cls, members: Sequence[Request]) -> StaticBatch:
        return cls(len(members), max(r.num_prompt_tokens for r in members))

    def padding(self, batch: Batch) -> Padding:
        """What a step of this batch computes beyond `batch`'s sequences: the step that forms
        the batch prefills every row at the longest prompt, every later step decodes one token
        in every row, and each row's attention reads the padded length."""
        context = sum(seq.seq_len for seq in batch.sequences)
        if batch.num_prefill_tokens:
            # Only the forming step prefills: the prompts go whole and nobody joins later.
            padded = self.rows * self.prompt_len
            return Padding(padded - batch.num_prefill_tokens, 0, padded - context)
        # The rows decode in lockstep, so the live ones have all generated the same count.
        generated = max(seq.seq_len - seq.num_prompt_tokens for seq in batch.sequences)
        padded_context = self.rows * (self.prompt_len + generated)
        return Padding(0, self.rows - batch.num_decode_tokens, padded_context - context)
