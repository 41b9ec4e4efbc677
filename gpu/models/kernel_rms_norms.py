"""transformers' RMSNorm modules run by Baton's kernel (`baton.kernels.ops.rms_norm`): one call
where their code makes eight small torch calls.

A module is taken by what it computes, not by its name: it holds one parameter, a weight vector,
and an epsilon attribute, and given random inputs, a random weight and a large epsilon it returns
what `x / sqrt(mean(x^2) + eps) * weight` does (Gemma's `1 + weight`, a LayerNorm, an epsilon
added elsewhere all fail that). Calls the check did not see (other dtypes, more arguments) go to
the module itself.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from baton.kernels import ops
from baton.kernels.rms_norm import rms_norm_ref

# Where transformers' norms keep their epsilon.
EPS_ATTRIBUTES = ("variance_epsilon", "eps", "epsilon")
# A large epsilon in the check, so that where a module adds it is seen.
CHECK_EPS = 0.5


class KernelRMSNorm(nn.Module):
    """An RMSNorm module of transformers' model, run by Baton's kernel on float32 CPU inputs."""

    def __init__(self, norm: nn.Module, eps: float) -> None:
        super().__init__()
        self.norm = norm
        self.weight = norm.weight
        self.eps = eps

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        # More arguments (a gate) ask for what the check did not see: the module's own code.
        if args or kwargs or x.dtype != torch.float32 or x.device.type != "cpu":
            return self.norm(x, *args, **kwargs)
        # Rows the kernel does not take (channels strided) go to its reference.
        return ops.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)


def rms_norm_eps(module: nn.Module) -> float | None:
    """The epsilon of `module` if it computes an RMSNorm by its weight, else None."""
    params = dict(module.named_parameters(recurse=False))
    weight = params.get("weight")
    if len(params) != 1 or weight is None or weight.dim() != 1 or next(module.children(), None):
        return None
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return None
    names = [name for name in EPS_ATTRIBUTES if isinstance(getattr(module, name, None), float)]
    if len(names) != 1:
        return None
    eps = getattr(module, names[0])
    probe = copy.deepcopy(module)
    generator = torch.Generator().manual_seed(0)
    size = weight.shape[0]
    with torch.no_grad():
        probe.weight.copy_(torch.randn(size, generator=generator))
        setattr(probe, names[0], CHECK_EPS)
        x = torch.randn(3, size, generator=generator) * 0.3
        try:
            out = probe(x)
        except Exception:  # any failure to run alone means: not a plain norm
            return None
    expected = rms_norm_ref(x, probe.weight, CHECK_EPS)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or out.dtype != x.dtype:
        return None
    return eps if torch.allclose(out, expected, rtol=1e-5, atol=1e-6) else None


def run_rms_norms_in_kernel(model: nn.Module) -> None:
    """Replace every RMSNorm module in `model` (`rms_norm_eps`) by a `KernelRMSNorm`, a module
    held in several places by one."""
    replaced: dict[nn.Module, KernelRMSNorm] = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, KernelRMSNorm):
                continue
            if child not in replaced:
                eps = rms_norm_eps(child)
                if eps is None:
                    continue
                replaced[child] = KernelRMSNorm(child, eps)
            setattr(parent, name, replaced[child])
