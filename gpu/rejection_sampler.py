"""Exact verification of draft tokens: the tokens a step keeps are distributed exactly as the
model's own samples, whatever the drafts were.

A sequence with draft tokens d1..dk has logits at k + 1 positions (after its last token and
after each draft). Row j is sampled as the plain path would sample it with the history it would
have had, the output so far plus d1..dj: penalties, min_tokens, logit_bias, the grammar and the
seed's position all hold per row. Row j accepts d(j+1) when its own draw is d(j+1), which
happens with the target's probability of it; the first row whose draw differs ends the run
with that draw, which, given that it is not the draft, is a draw from the residual (the target
without the draft, renormalised); when every draft passes, the last row's draw follows them.
This is rejection sampling against a point-mass draft (a prompt lookup has no distribution of
its own) with the acceptance test and the residual draw coupled to the plain path's noise, so a
seeded request gets exactly the tokens it gets without speculation.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from baton.core.batch import ExecutorOutput, ScheduledSequence
from baton.gpu.sampler import Sampler

if TYPE_CHECKING:
    from baton.gpu.structured_output import GrammarMask


def verification_rows(sequences: list[ScheduledSequence]) -> list[ScheduledSequence]:
    """One row per sampled position, in logits order: a sequence without drafts is its own row;
    one with k drafts gives k + 1, the j-th seeing its first j drafts as output already."""
    rows = []
    for seq in sequences:
        rows.append(seq)
        for j in range(1, len(seq.draft_token_ids) + 1):
            history = [*seq.all_token_ids, *seq.draft_token_ids[:j]]
            rows.append(dataclasses.replace(seq, all_token_ids=history, draft_token_ids=()))
    return rows


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    sequences: list[ScheduledSequence],
    rows: list[ScheduledSequence],
    grammar_mask: GrammarMask | None = None,
) -> ExecutorOutput:
    """The step's output for `sequences` (some with drafts) from `logits` [len(rows), vocab]
    over their `verification_rows`."""
    drawn = sampler(logits, rows, grammar_mask)
    row_tokens = drawn.sampled_token_ids
    output = ExecutorOutput([], [])
    row = 0
    for seq in sequences:
        drafts = seq.draft_token_ids
        num_accepted = 0
        while num_accepted < len(drafts) and row_tokens[row + num_accepted] == drafts[num_accepted]:
            num_accepted += 1
        last = row + num_accepted
        output.sampled_token_ids.append(row_tokens[last])
        output.logprobs.append(drawn.logprobs[last])
        if drafts:
            output.accepted_draft_ids[seq.request_id] = list(drafts[:num_accepted])
            if seq.sampling_params.logprobs is not None:
                output.draft_logprobs[seq.request_id] = drawn.logprobs[row:last]
        row += len(drafts) + 1
    return output
