"""Exact verification of draft tokens: the tokens a step keeps are distributed exactly as the
model's own samples, whatever the drafts were.

A sequence with draft tokens d1..dk has logits at k + 1 positions (after its last token and
after each draft). Row j is processed with the history it would have had: the output so far
plus d1..dj, so penalties, min_tokens, logit_bias and the seed's position all hold per row.
Row j accepts d(j+1) with the target's probability of it (greedy: when it is the argmax), as
rejection sampling with a point-mass draft does; the first rejection is replaced by a draw from
the target with d(j+1) removed and renormalised (the residual), and when every draft passes, a
token is drawn from the last row. A prompt-lookup draft has no distribution of its own, so this
is the standard residual rule with the draft's distribution a point mass.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from baton.core.batch import ExecutorOutput, ScheduledSequence
from baton.gpu.sampler import Sampler, gather_logprobs
from baton.kernels import ops

if TYPE_CHECKING:
    from baton.gpu.structured_output import GrammarMask


def verification_rows(sequences: list[ScheduledSequence]) -> list[ScheduledSequence]:
    """One row per sampled position, in logits order: a sequence without drafts is its own row;
    one with k drafts gives k + 1, the j-th seeing its first j drafts as output already."""
    rows = []
    for seq in sequences:
        rows.append(seq)
        for j in range(1, len(seq.draft_token_ids) + 1):
            history = seq.all_token_ids + seq.draft_token_ids[:j]
            rows.append(dataclasses.replace(seq, all_token_ids=history, draft_token_ids=[]))
    return rows


def row_drafts(sequences: list[ScheduledSequence]) -> list[int | None]:
    """The draft each row checks, aligned with `verification_rows`; None for a last row."""
    drafts: list[int | None] = []
    for seq in sequences:
        drafts.extend(seq.draft_token_ids)
        drafts.append(None)
    return drafts


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    sequences: list[ScheduledSequence],
    rows: list[ScheduledSequence],
    grammar_mask: GrammarMask | None = None,
) -> tuple[ExecutorOutput, list[int]]:
    """The step's output for `sequences` (some with drafts) from `logits` [len(rows), vocab],
    and each row's token (for the grammar matchers)."""
    drafts = row_drafts(sequences)
    device = logits.device
    raw, processed = sampler.process(logits, rows, grammar_mask)
    params = [row.sampling_params for row in rows]
    has_draft = torch.tensor([d is not None for d in drafts], device=device)
    draft_ids = torch.tensor([0 if d is None else d for d in drafts], device=device)
    target = ops.argmax(processed)
    if all(p.greedy for p in params):
        accepted = has_draft & (target == draft_ids)
        tokens = target
    else:
        accepted, tokens = _verify_sampled(sampler, processed, rows, has_draft, draft_ids)
        greedy = torch.tensor([p.greedy for p in params], device=device)
        accepted = torch.where(greedy, has_draft & (target == draft_ids), accepted)
        tokens = torch.where(greedy, target, tokens)
    row_tokens = torch.where(accepted, draft_ids, tokens).tolist()
    accepted_rows = accepted.tolist()
    logprobs = gather_logprobs(raw, row_tokens, params)
    output = ExecutorOutput([], [])
    row = 0
    for seq in sequences:
        num_accepted = 0
        for _ in seq.draft_token_ids:
            if not accepted_rows[row + num_accepted]:
                break
            num_accepted += 1
        last = row + num_accepted
        output.sampled_token_ids.append(row_tokens[last])
        output.logprobs.append(logprobs[last])
        if seq.draft_token_ids:
            output.accepted_draft_ids[seq.request_id] = seq.draft_token_ids[:num_accepted]
            if seq.sampling_params.logprobs is not None:
                output.draft_logprobs[seq.request_id] = logprobs[row:last]
        row += len(seq.draft_token_ids) + 1
    return output, row_tokens


def _verify_sampled(
    sampler: Sampler,
    processed: torch.Tensor,
    rows: list[ScheduledSequence],
    has_draft: torch.Tensor,
    draft_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which rows accept their draft (u < p(draft)) and each row's draw: from the residual
    where a draft is checked (used if it is rejected), else from the target itself."""
    probs = sampler.probabilities(processed, rows)
    uniform = torch.empty(probs.shape[0], device=probs.device)
    noise = sampler.exponential_noise(probs, rows, uniform)
    draft_prob = probs.gather(1, draft_ids.unsqueeze(1)).squeeze(1)
    accepted = has_draft & (uniform < draft_prob)
    residual = torch.where(
        has_draft.unsqueeze(1), probs.scatter(1, draft_ids.unsqueeze(1), 0.0), probs
    )
    # The exponential race needs no normalising; a residual with no mass left belongs to a
    # draft that held all of it, which is always accepted.
    drawn = ops.argmax(residual / noise)
    drawn = torch.where(residual.sum(dim=1) > 0, drawn, draft_ids)
    return accepted, drawn
