"""Greedy output of a rounded variant of the engine (int8 weights, a float16 KV cache) against
float32's, on the trained demo model: a random checkpoint's flat next-token distributions are
near ties everywhere, so any rounding flips them. Most prompts must give the same tokens, and
where one parts, float32's top two candidates there must be a near tie."""

from __future__ import annotations

from baton.core.outputs import RequestOutput

PROMPTS = [
    "Once upon a time",
    "The little dog",
    "She opened the door and",
    "In the morning, the sun",
    "Tom and his friend went",
    "The bird sang",
    "A girl named Lily",
    "He was very sad because",
    "They played in the park",
    "The cat saw a",
    "One day, a big",
    "Mom said to",
    "The tree was",
    "After lunch, they",
    "Ben wanted to",
    "The boat on the lake",
]
NUM_NEW_TOKENS = 16
# Near ties may flip with another rounding; each parting must be at one (log-prob gap).
NEAR_TIE = 0.05


def assert_greedy_agreement(
    reference: list[RequestOutput], rounded: list[RequestOutput], min_identical: int
) -> None:
    """`reference` and `rounded` answer PROMPTS in order, with `logprobs=2` on the reference."""
    identical = sum(a.token_ids == b.token_ids for a, b in zip(reference, rounded, strict=True))
    assert identical >= min_identical, f"{identical} of {len(PROMPTS)} identical"
    for prompt, a, b in zip(PROMPTS, reference, rounded, strict=True):
        parted = next(
            (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)) if x != y),
            None,
        )
        if parted is not None:
            (_, first), (_, second) = a.logprobs[parted].top
            assert first - second < NEAR_TIE, (prompt, parted, first - second)
