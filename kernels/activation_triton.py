"""The gated activations of MLPs in Triton, one pass over [gate | up]: `silu(gate) * up`
(Llama-style) and `gelu_tanh(gate) * up` (Gemma's GeGLU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, stride_out, size, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < size
    gate = tl.load(x_ptr + token * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * stride_x + size + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + token * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """`silu(gate) * up` for `x` = [gate | up] along the last dim: [T, 2I] -> [T, I]."""
    size = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * size)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], size), dtype=x.dtype, device=x.device)
    block = min(block, triton.next_power_of_2(size))
    if rows.shape[0]:
        grid = (rows.shape[0], triton.cdiv(size, block))
        _silu_and_mul_kernel[grid](out, rows, rows.stride(0), out.stride(0), size, BLOCK=block)
    return out.view(*x.shape[:-1], size)


@triton.jit
def _gelu_tanh_and_mul_kernel(out_ptr, x_ptr, stride_x, stride_out, size, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < size
    gate = tl.load(x_ptr + token * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + token * stride_x + size + cols, mask=mask, other=0.0).to(tl.float32)
    # 0.5 * (1 + tanh(y)) is sigmoid(2y): gelu_tanh(x) = x * sigmoid(2 * sqrt(2/pi) * (x + c x^3)).
    inner = 1.5957691216057308 * (gate + 0.044715 * gate * gate * gate)
    out = gate * tl.sigmoid(inner) * up
    tl.store(out_ptr + token * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def gelu_tanh_and_mul_triton(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """`gelu_tanh(gate) * up` for `x` = [gate | up] along the last dim: [T, 2I] -> [T, I]."""
    size = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * size)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], size), dtype=x.dtype, device=x.device)
    block = min(block, triton.next_power_of_2(size))
    if rows.shape[0]:
        grid = (rows.shape[0], triton.cdiv(size, block))
        _gelu_tanh_and_mul_kernel[grid](out, rows, rows.stride(0), out.stride(0), size, BLOCK=block)
    return out.view(*x.shape[:-1], size)
