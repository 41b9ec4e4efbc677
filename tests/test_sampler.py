"""The sampler: greedy, temperature draws, filters, penalties, min_tokens, seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from baton.core.batch import ScheduledSequence
from baton.core.sampling_params import SamplingParams
from baton.gpu.sampler import Sampler, apply_penalties

EOS = 2


def make_seq(
    params: SamplingParams, prompt: tuple[int, ...] = (0, 1), output: tuple[int, ...] = ()
) -> ScheduledSequence:
    all_ids = [*prompt, *output]
    return ScheduledSequence(
        request_id="r",
        token_ids=[all_ids[-1]],
        start_position=len(all_ids) - 1,
        block_table=[0],
        sample=True,
        sampling_params=params,
        all_token_ids=all_ids,
        num_prompt_tokens=len(prompt),
    )


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_greedy_rows_take_argmax_even_beside_random_rows() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    greedy = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=1)]
    sequences = [make_seq(greedy[i % 2]) for i in range(8)]
    assert Sampler(50, [EOS])(logits, sequences).sampled_token_ids == logits.argmax(-1).tolist()

    mixed = [make_seq(greedy[0]) if i % 2 else make_seq(SamplingParams()) for i in range(8)]
    sampled = Sampler(50, [EOS])(logits, mixed).sampled_token_ids
    assert sampled[1::2] == logits.argmax(-1)[1::2].tolist()


def chi_square(sampled: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(sampled), minlength=len(probs)).double()
    expected = probs.double() * len(sampled)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("seeded", [False, True])
def test_temperature_draws_follow_the_tempered_softmax(seeded: bool) -> None:
    torch.manual_seed(1)
    base = logits_of([0.1, 0.2, 0.3, 0.4])
    rows = 4000
    # Seeded rows each get their own seed, which exercises the per-row generator path.
    sequences = [
        make_seq(SamplingParams(temperature=0.7, seed=i if seeded else None)) for i in range(rows)
    ]
    sampled = Sampler(4, [EOS])(base.expand(rows, 4), sequences).sampled_token_ids
    # 16.27 is the 0.1% critical value of chi-square with 3 degrees of freedom.
    assert chi_square(sampled, (base / 0.7).softmax(-1)) < 16.27


# Token ids are deliberately not in probability order, so the filters must map back correctly.
FILTER_PROBS = [0.1, 0.4, 0.04, 0.25, 0.06, 0.15]  # rank order: 1, 3, 5, 0, 4, 2


@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (SamplingParams(top_k=3), {1, 3, 5}),
        (SamplingParams(top_p=0.6), {1, 3}),
        (SamplingParams(top_p=0.85), {1, 3, 5, 0}),
        (SamplingParams(min_p=0.3), {1, 3, 5}),
        (SamplingParams(min_p=0.2), {1, 3, 5, 0}),
        # top_p counts mass after top_k renormalizes: 0.65 / 0.9 = 0.72 is already past 0.7.
        (SamplingParams(top_k=4, top_p=0.7), {1, 3}),
        (SamplingParams(), {0, 1, 2, 3, 4, 5}),
    ],
)
def test_filters_never_sample_a_filtered_token_and_keep_the_rest_reachable(
    params: SamplingParams, allowed: set[int]
) -> None:
    torch.manual_seed(2)
    rows = 3000
    # Unfiltered rows in the same batch must not loosen or tighten this row's filter.
    sequences = [
        make_seq(params if i % 2 else SamplingParams(temperature=0.5)) for i in range(rows)
    ]
    logits = logits_of(FILTER_PROBS).expand(rows, 6)
    sampled = Sampler(6, [EOS])(logits, sequences).sampled_token_ids
    assert set(sampled[1::2]) == allowed


def test_penalties_follow_the_repetition_presence_and_frequency_formulas() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 0.0]]).repeat(3, 1)
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    sequences = [
        make_seq(params, prompt=(0, 1), output=(1, 3, 3)),
        make_seq(SamplingParams(), prompt=(0, 1), output=(1, 3, 3)),
        # Presence and frequency count output tokens only, never the prompt.
        make_seq(SamplingParams(frequency_penalty=1.0), prompt=(4, 4, 4), output=(0,)),
    ]
    out = apply_penalties(logits, sequences)
    expected = [
        # 0: prompt only, 2/2. 1: -1*2 - 0.5 - 0.25. 3: 3/2 - 0.5 - 2*0.25.
        [1.0, -2.75, 0.5, 0.5, -2.0, 0.0],
        [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
        [1.0, -1.0, 0.5, 3.0, -2.0, 0.0],
    ]
    assert out.tolist() == expected


def test_sampler_skips_repeated_tokens_under_repetition_penalty() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 0.0]])
    seq = make_seq(SamplingParams(temperature=0.0, repetition_penalty=2.0), output=(1,))
    assert Sampler(4, [EOS])(logits, [seq]).sampled_token_ids == [2]


def test_min_tokens_blocks_eos_and_stop_tokens_until_reached() -> None:
    torch.manual_seed(3)
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0, 0.0, 8.0]])
    sampler = Sampler(6, [EOS])
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, min_tokens=3, stop_token_ids=[5, 99])
        early = [make_seq(params, output=(0,) * n) for n in range(3)] * 100
        sampled = sampler(logits.expand(len(early), 6), early).sampled_token_ids
        assert not {EOS, 5} & set(sampled)
        done = make_seq(params, output=(0, 0, 0))
        assert sampler(logits, [done]).sampled_token_ids[0] in {EOS, 5}
    greedy_done = make_seq(SamplingParams(temperature=0.0, min_tokens=2), output=(0, 0))
    assert sampler(logits, [greedy_done]).sampled_token_ids == [EOS]


def test_padded_vocab_columns_are_never_sampled() -> None:
    logits = torch.zeros(64, 10)
    logits[:, 8:] = 100.0
    sequences = [make_seq(SamplingParams(temperature=0.0 if i == 0 else 1.0)) for i in range(64)]
    sampled = Sampler(8, [EOS])(logits, sequences).sampled_token_ids
    assert max(sampled) < 8


def test_an_all_greedy_batch_takes_the_argmax_of_the_vocabulary_columns_only() -> None:
    logits = torch.zeros(4, 10)
    logits[:, 8:] = 100.0
    logits[torch.arange(4), torch.tensor([3, 0, 7, 3])] = 1.0
    sequences = [make_seq(SamplingParams(temperature=0.0)) for _ in range(4)]

    output = Sampler(8, [EOS])(logits, sequences)

    assert output.sampled_token_ids == [3, 0, 7, 3]
    assert output.logprobs == [None] * 4


def generate(sampler: Sampler, logits: torch.Tensor, seed: int, row: int, steps: int) -> list[int]:
    """Sample `steps` tokens for the seeded request at `row`, beside unseeded rows."""
    tokens: list[int] = []
    for _ in range(steps):
        sequences = [make_seq(SamplingParams(top_p=0.95)) for _ in range(len(logits))]
        sequences[row] = make_seq(SamplingParams(seed=seed, top_p=0.95), output=tuple(tokens))
        tokens.append(sampler(logits, sequences).sampled_token_ids[row])
    return tokens


def test_seeded_request_gets_same_tokens_alone_or_in_a_batch_and_after_recompute() -> None:
    torch.manual_seed(4)
    row_logits = torch.randn(1, 1000)
    batch_logits = torch.randn(16, 1000)
    batch_logits[7] = row_logits[0]
    sampler = Sampler(1000, [EOS])
    alone = generate(sampler, row_logits, seed=1234, row=0, steps=20)
    assert generate(sampler, batch_logits, seed=1234, row=7, steps=20) == alone
    # A preempted request recomputes and samples again at the same output position.
    resumed = make_seq(SamplingParams(seed=1234, top_p=0.95), output=tuple(alone[:10]))
    assert sampler(row_logits, [resumed]).sampled_token_ids == [alone[10]]
    assert generate(sampler, row_logits, seed=4321, row=0, steps=20) != alone


def test_logprobs_come_from_the_raw_distribution_with_sorted_top_n() -> None:
    torch.manual_seed(5)
    logits = torch.randn(4, 30)
    sequences = [
        make_seq(SamplingParams(logprobs=3, temperature=0.5, repetition_penalty=1.5)),
        make_seq(SamplingParams(logprobs=0)),
        make_seq(SamplingParams()),
        make_seq(SamplingParams(logprobs=20, temperature=0.0, presence_penalty=2.0), output=(1,)),
    ]
    out = Sampler(30, [EOS])(logits, sequences)
    raw = logits.log_softmax(-1)
    assert out.logprobs[2] is None
    for row, n in ((0, 3), (1, 0), (3, 20)):
        entry = out.logprobs[row]
        assert entry is not None
        assert entry.token_id == out.sampled_token_ids[row]
        assert math.isclose(entry.logprob, float(raw[row, entry.token_id]), abs_tol=1e-5)
        values, ids = raw[row].topk(n)
        assert [t for t, _ in entry.top] == ids.tolist()
        assert [v for _, v in entry.top] == pytest.approx(values.tolist(), abs=1e-5)
        assert [v for _, v in entry.top] == sorted((v for _, v in entry.top), reverse=True)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1e-300),
        SamplingParams(temperature=5e-324),
        SamplingParams(temperature=1e-6),
        SamplingParams(temperature=1.0, top_p=1e-300),
        SamplingParams(temperature=1.0, top_p=5e-324, seed=3),
        SamplingParams(temperature=0.7, min_p=1e-320, top_p=1e-45),
    ],
)
def test_values_below_float32_range_sample_the_most_likely_token(params) -> None:
    # Divided in float32, such a temperature or top_p rounds to 0 and would turn every row
    # into NaN or all -inf, so the "draw" would be token 0 whatever the logits.
    torch.manual_seed(1)
    logits = torch.randn(6, 50)
    logits[:, 0] = -10.0
    sampler = Sampler(50, [EOS])
    output = sampler(logits, [make_seq(params, prompt=(5, row)) for row in range(6)])
    assert output.sampled_token_ids == logits.argmax(dim=-1).tolist()
