"""Verification keeps the target's distribution: over many draws on a six-token vocabulary, the
tokens a step emits after checking fixed drafts are distributed as the model's own samples at
each position (chi-square against the target, fixed seed, so the test is deterministic)."""

from __future__ import annotations

import torch

from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.gpu.rejection_sampler import verification_rows, verify
from baton.gpu.sampler import Sampler

VOCAB = 6
NUM_DRAWS = 20_000
# The 0.999 quantile of chi-square with VOCAB - 1 = 5 degrees of freedom.
CHI_SQUARE_999 = 20.515
DRAFTS = [3, 4]
# The target's logits after the last token, after the first draft and after the second: each
# row its own distribution, so a row read at the wrong position shows.
LOGITS = torch.tensor(
    [
        [0.2, 1.0, -0.5, 0.9, 0.1, -1.0],
        [1.2, -0.3, 0.4, 0.0, 0.8, -0.2],
        [-0.4, 0.6, 0.3, 0.2, -0.1, 1.1],
    ]
)
TEMPERATURE = 0.8


def sequences(params: SamplingParams) -> list[ScheduledSequence]:
    return [
        ScheduledSequence(
            f"r{i}", [5, *DRAFTS], 2, [0], True, params, [1, 5], 1, draft_token_ids=list(DRAFTS)
        )
        for i in range(NUM_DRAWS)
    ]


def chi_square(samples: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(samples), minlength=VOCAB).double()
    expected = probs.double() * len(samples)
    return float(((counts - expected) ** 2 / expected).sum())


def emitted(output, seqs: list[ScheduledSequence]) -> list[list[int]]:
    """The tokens each sequence gained: its accepted drafts, then the token drawn after them."""
    return [
        [*output.accepted_draft_ids[seq.request_id], token]
        for seq, token in zip(seqs, output.sampled_token_ids, strict=True)
    ]


def test_verified_tokens_follow_the_target_distribution_at_each_position():
    torch.manual_seed(0)
    seqs = sequences(SamplingParams(temperature=TEMPERATURE, max_tokens=8))
    rows = verification_rows(seqs)
    logits = LOGITS.repeat(NUM_DRAWS, 1)
    output = verify(Sampler(VOCAB, []), logits, seqs, rows)
    runs = emitted(output, seqs)
    target = (LOGITS / TEMPERATURE).softmax(dim=-1)

    first = [run[0] for run in runs]
    assert chi_square(first, target[0]) < CHI_SQUARE_999
    # Given the first draft was emitted, the next token follows the second row's distribution.
    second = [run[1] for run in runs if run[0] == DRAFTS[0]]
    assert len(second) > NUM_DRAWS * target[0, DRAFTS[0]] * 0.9
    assert chi_square(second, target[1]) < CHI_SQUARE_999
    third = [run[2] for run in runs if run[:2] == DRAFTS]
    assert chi_square(third, target[2]) < CHI_SQUARE_999


def test_greedy_verification_accepts_exactly_the_argmax_prefix():
    seqs = sequences(SamplingParams(temperature=0.0, max_tokens=8))[:2]
    logits = LOGITS.clone()
    logits[0, DRAFTS[0]] = 5.0  # the first draft is the argmax; the second is not (row 1: 0)
    output = verify(Sampler(VOCAB, []), logits.repeat(2, 1), seqs, verification_rows(seqs))
    assert emitted(output, seqs) == [[DRAFTS[0], 0], [DRAFTS[0], 0]]
