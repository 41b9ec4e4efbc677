"""Linear layers on the CPU through oneDNN, over weights packed once when the model loads.

For float32 on the CPU `F.linear` calls MKL's sgemm, which picks its kernel by the number of
rows: a decode step's few dozen rows run at about half the speed of a large GEMM, and a row's
bits depend on how many rows share the step. oneDNN's inner product over a weight reordered
once into its blocked layout ran those shapes 1.2-1.9x faster on the 2-core AVX2 VM and gives a
row the same bits whatever the batch (docs/benchmarks.md, "The CPU's own kernels"). At one
row on a small model (hidden 256) it costs ~20 us more per call than MKL. The
operators are the ones torch's own compiler uses for CPU linears (`torch.ops.mkldnn`); a torch
built without them keeps `F.linear`.
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


def pack_linear_weight(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """`weight` [out, in] (float32, CPU) reordered into oneDNN's layout: an opaque tensor for
    `onednn_linear` only. `rows_hint` is the typical number of input rows; any count works."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows_hint)


def onednn_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for 2-d `x`, over the packed weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
