"""What the generic path swaps into transformers' modules for speed keeps every output: linears
that read one input run as one matmul (gpu/models/shared_input_linears.py), and RMSNorms found
by what they compute run in Baton's kernel (gpu/models/kernel_rms_norms.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from baton.app.llm import LLM
from baton.gpu.models import shared_input_linears
from baton.gpu.models.kernel_rms_norms import KernelRMSNorm, rms_norm_eps
from baton.gpu.models.shared_input_linears import GroupedLinear, grouped_linears
from baton.gpu.models.transformers_model import PackedLinear


@pytest.fixture
def kernel_calls(monkeypatch) -> list[int]:
    """Counts the matmuls the grouped linears run."""
    calls: list[int] = []
    matmul = shared_input_linears.packed_linear

    def counted(*args):
        calls.append(1)
        return matmul(*args)

    monkeypatch.setattr(shared_input_linears, "packed_linear", counted)
    return calls


def q_k_v(bias: bool = True) -> list[nn.Linear]:
    torch.manual_seed(0)
    return [nn.Linear(64, size, bias=bias) for size in (64, 32, 40)]


def test_linears_reading_one_input_compute_one_matmul_with_the_same_outputs(kernel_calls):
    linears = q_k_v()
    x = torch.randn(2, 5, 64)
    alone = [PackedLinear(linear, rows_hint=8)(x) for linear in linears]
    grouped = [member(x) for member in grouped_linears(linears, rows_hint=8)]
    assert len(kernel_calls) == 1
    for ours, theirs in zip(grouped, alone, strict=True):
        assert ours.shape == theirs.shape
        assert torch.equal(ours, theirs)


def test_a_member_asking_again_or_for_another_input_gets_a_new_product(kernel_calls):
    linears = q_k_v(bias=False)
    q, k, _ = grouped_linears(linears, rows_hint=8)
    x, y = torch.randn(3, 64), torch.randn(3, 64)
    expected_q = PackedLinear(linears[0], rows_hint=8)(x)
    q(x).mul_(0.0)  # the model's code may scale its slice in place
    assert torch.equal(q(x), expected_q)
    assert torch.equal(k(y), PackedLinear(linears[1], rows_hint=8)(y))
    assert len(kernel_calls) == 3


class _ScalesBetween(nn.Module):
    """Two linears of one input, which its forward modifies in place between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        a = self.a(x)
        x.mul_(2.0)
        return a + self.b(x) + self.c(x)


def test_only_linears_given_one_unmodified_input_are_grouped():
    model = _ScalesBetween()
    groups = shared_input_linears.shared_input_linears(
        [model.a, model.b, model.c], lambda: model(torch.randn(1, 8))
    )
    assert groups == [[model.b, model.c]]


def test_rmsnorms_are_found_by_what_they_compute():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert rms_norm_eps(LlamaRMSNorm(64, eps=1e-5)) == 1e-5
    assert rms_norm_eps(GemmaRMSNorm(64, eps=1e-6)) is None  # scales by 1 + weight
    assert rms_norm_eps(nn.LayerNorm(64, bias=False)) is None  # subtracts the mean
    assert rms_norm_eps(nn.Linear(64, 64)) is None


def test_an_rmsnorm_in_the_kernel_gives_the_modules_output():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(2, 64, 7).transpose(1, 2)  # [2, 7, 64], its channels strided
    torch.testing.assert_close(KernelRMSNorm(norm, 1e-5)(x), norm(x), rtol=1e-6, atol=1e-6)


def test_the_generic_llama_groups_qkv_and_gate_up_and_norms_in_the_kernel(make_checkpoint):
    llm = LLM(make_checkpoint("llama"), device="cpu", model_impl="transformers")
    model = llm.engine.executor.model
    layers = model.config.num_hidden_layers
    groups = {id(m.group): m.group for m in model.modules() if isinstance(m, GroupedLinear)}
    assert sorted(group.num_members for group in groups.values()) == [2] * layers + [3] * layers
    norms = [m for m in model.modules() if isinstance(m, KernelRMSNorm)]
    assert len(norms) == 2 * layers + 1
