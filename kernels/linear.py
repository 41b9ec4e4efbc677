"""Linear layers on the CPU through oneDNN, over weights packed once when the model loads.

Chosen over `F.linear` (MKL's sgemm, whose kernel and so a row's bits depend on how many rows
share the call): oneDNN over a weight reordered once is faster at a decode step's few dozen rows
and batch-invariant (docs/decisions.md). The operators are the ones
torch's compiler uses for CPU linears; a torch built without them keeps `F.linear`.
"""

from __future__ import annotations

from functools import cache

import torch


@cache
def onednn_linear_available() -> bool:
    """Whether this torch can pack linear weights for oneDNN."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512_BF16 or AMX); elsewhere torch and
    oneDNN emulate it by widening every operand to float32."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def pack_linear_weight(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """`weight` [out, in] (float32, CPU) reordered into oneDNN's layout: an opaque tensor for
    `onednn_linear` only. `rows_hint` is the typical number of input rows; any count works."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows_hint)


def onednn_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for 2-d `x`, over the packed weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
