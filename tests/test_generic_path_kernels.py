"""The generic path runs transformers' RMSNorm modules in Baton's kernel where they compute one
(gpu/models/kernel_rms_norms.py), found by what they compute, with the modules' own outputs."""

from __future__ import annotations

import torch
from torch import nn

from baton.app.llm import LLM
from baton.gpu.models.kernel_rms_norms import KernelRMSNorm, rms_norm_eps
from baton.kernels.cpu_extension import cpu_kernels_available


class _EpsOutsideTheRoot(nn.Module):
    """x / (rms(x) + eps) * weight: an RMSNorm by its parameters, not by what it computes."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight


class _GatedRMSNorm(nn.Module):
    """An RMSNorm alone, and scaled by SiLU of a gate when given one (Mamba-2's)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size))
        self.variance_epsilon = 1e-6

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * (normed if gate is None else normed * nn.functional.silu(gate))


def test_rmsnorms_are_found_by_what_they_compute():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert rms_norm_eps(LlamaRMSNorm(64, eps=1e-5)) == 1e-5
    assert rms_norm_eps(GemmaRMSNorm(64, eps=1e-6)) is None  # scales by 1 + weight
    assert rms_norm_eps(nn.LayerNorm(64, bias=False)) is None  # subtracts the mean
    assert rms_norm_eps(_EpsOutsideTheRoot(64)) is None
    assert rms_norm_eps(nn.Linear(64, 64, bias=False)) is None


def test_an_rmsnorm_in_the_kernel_gives_the_modules_output():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    kernel_norm = KernelRMSNorm(norm, 1e-5)
    x = torch.randn(1, 7, 64)  # a step's packed tokens, as transformers' layers hold them
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        out = kernel_norm(x)
    assert cpu_kernels_available()
    assert "baton_cpu::rms_norm" in {event.name for event in profile.events()}
    torch.testing.assert_close(out, norm(x), rtol=1e-6, atol=1e-6)
    strided = torch.randn(64, 7).t()  # the kernel's reference takes these
    torch.testing.assert_close(kernel_norm(strided), norm(strided), rtol=1e-6, atol=1e-6)


def test_a_norm_given_more_than_its_input_runs_its_own_code():
    gated = _GatedRMSNorm(64)
    eps = rms_norm_eps(gated)
    assert eps == 1e-6  # alone, it computes an RMSNorm
    x, gate = torch.randn(3, 64), torch.randn(3, 64)
    torch.testing.assert_close(KernelRMSNorm(gated, eps)(x, gate), gated(x, gate))


def test_the_generic_llamas_norms_run_in_the_kernel(make_checkpoint):
    llm = LLM(make_checkpoint("llama"), device="cpu", model_impl="transformers")
    model = llm.engine.executor.model
    norms = [m for m in model.modules() if isinstance(m, KernelRMSNorm)]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
