"""Greedy sampling's C++ argmax (kernels/csrc/sampling_cpu.cpp) answers as torch.argmax does:
the first index of the largest value, the first NaN's where a row has one, for any vocabulary
size and any values, ties and infinities included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.kernels import ops
from baton.kernels.cpu_extension import cpu_kernels_available


@pytest.fixture(autouse=True)
def kernels_built():
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()


def test_the_cpu_kernel_is_what_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch's argmax ran")

    monkeypatch.setattr(torch.Tensor, "argmax", refuse)
    assert ops.argmax(torch.tensor([[0.0, 2.0, 1.0]])).tolist() == [1]


@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("vocab", [1, 63, 64, 65, 1000, 32000, 151936])
def test_random_rows_equal_torch(rows, vocab):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows * vocab))
    assert torch.equal(ops.argmax(logits), logits.argmax(dim=-1))


def test_ties_zeros_infinities_and_nans_equal_torch():
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    logits[0, [5, 700, 999]] = 50.0  # a tie across blocks: the first
    logits[1] = float("-inf")  # all masked: index 0
    logits[2, 3], logits[2, 900] = float("inf"), float("nan")  # a NaN beats inf
    logits[3] = 0.0
    logits[3, :500] = -0.0  # -0.0 equals 0.0: index 0
    logits[4, 999] = float("inf")
    logits[5] = float("nan")
    assert ops.argmax(logits).tolist() == logits.argmax(dim=-1).tolist() == [5, 0, 900, 0, 999, 0]


def test_rows_read_with_a_stride():
    wide = torch.randn(4, 32001, generator=torch.Generator().manual_seed(1))
    wide[:, -1] = 100.0  # the padded column past the vocabulary is never chosen
    logits = wide[:, :32000]
    assert torch.equal(ops.argmax(logits), logits.argmax(dim=-1))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from([0.0, -0.0, 1.0, -1.0, 3.5, float("inf"), float("-inf"), float("nan")]),
            min_size=70,
            max_size=70,
        ),
        min_size=1,
        max_size=3,
    )
)
def test_rows_of_few_distinct_values_equal_torch(rows):
    logits = torch.tensor(rows, dtype=torch.float32)
    assert ops.argmax(logits).tolist() == logits.argmax(dim=-1).tolist()
