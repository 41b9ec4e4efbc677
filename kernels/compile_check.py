"""Compile every Triton kernel for a GPU architecture, no GPU needed: `python -m
baton.kernels.compile_check --arch 90`.

The interpreter tests check what the kernels compute; this checks that the compiler accepts
them (types, shapes of `tl.dot`, shared memory) for the shapes of the shipped benchmark models,
down to a cubin by the ptxas that ships with triton.
"""

from __future__ import annotations

import argparse
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from baton.kernels.activation_triton import _silu_and_mul_kernel
from baton.kernels.kv_cache_triton import _write_kv_cache_kernel
from baton.kernels.paged_attention_split_kv_triton import (
    _split_kv_partial_kernel,
    _split_kv_reduce_kernel,
)
from baton.kernels.paged_attention_triton import _paged_attention_kernel, block_d
from baton.kernels.rms_norm_triton import _rms_norm_kernel
from baton.kernels.rotary_triton import _rotary_kernel

TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# (query heads per KV head, head dim) of Llama-3.1-8B, Qwen2.5-0.5B, Qwen2.5-1.5B, Qwen3-0.6B,
# and heads that are not powers of two: Phi-2 and StableLM-3B (80), Phi-3-mini (96),
# DeepSeek-V2-Lite's latent attention on the generic path (192).
ATTENTION_SHAPES = [(4, 128), (7, 64), (6, 128), (2, 128), (1, 80), (1, 96), (1, 192)]
# (KV heads, head dim) of the KV-cache writes and rotations: Llama-3.1-8B's and Phi-3-mini's.
HEAD_SHAPES = [(8, 128), (32, 96)]


def compile_one(target: GPUTarget, kernel, types: dict[str, str], constants: dict) -> int:
    """Compile `kernel` with `constants`; an argument not in `types` is an int32 scalar."""
    signature = {
        name: "constexpr" if name in constants else types.get(name, "i32")
        for name in kernel.arg_names
    }
    compiled = triton.compile(ASTSource(kernel, signature, constants), target=target)
    return compiled.metadata.shared


def kernels_to_compile(dtype: str):
    """(kernel, pointer/float argument types, constexprs) for every configuration served."""
    ptr = "*" + TRITON_TYPES[dtype]
    precision = "ieee" if dtype == "float32" else "tf32"
    attention = dict(
        out_ptr=ptr,
        q_ptr=ptr,
        kv_ptr=ptr,
        block_tables_ptr="*i32",
        query_start_loc_ptr="*i32",
        seq_lens_ptr="*i32",
        sinks_ptr=ptr,
        qk_scale="fp32",
    )
    for group, head_dim in ATTENTION_SHAPES:
        # A decode tile (one token's group of heads) and a prefill tile of 64 rows.
        for block_m in (max(16, triton.next_power_of_2(group)), 64):
            yield (
                _paged_attention_kernel,
                attention,
                dict(
                    GROUP=group,
                    BLOCK_Q=block_m // group,
                    BLOCK_M=block_m,
                    BLOCK_N=64,
                    BLOCK_SIZE=16,
                    HEAD_DIM=head_dim,
                    BLOCK_D=block_d(head_dim),
                    DOT_PRECISION=precision,
                ),
            )
        partials = dict(
            attention, partial_out_ptr="*fp32", partial_max_ptr="*fp32", partial_sum_ptr="*fp32"
        )
        yield (
            _split_kv_partial_kernel,
            partials,
            dict(
                GROUP=group,
                BLOCK_M=max(16, triton.next_power_of_2(group)),
                BLOCK_N=64,
                BLOCK_SIZE=16,
                HEAD_DIM=head_dim,
                BLOCK_D=block_d(head_dim),
                DOT_PRECISION=precision,
            ),
        )
        yield (
            _split_kv_reduce_kernel,
            partials,
            dict(BLOCK_N=64, BLOCK_P=64, HEAD_DIM=head_dim, BLOCK_D=block_d(head_dim)),
        )
    rotary = dict(q_ptr=ptr, k_ptr=ptr, positions_ptr="*i64", cos_sin_ptr="*fp32")
    for num_kv_heads, head_dim in HEAD_SHAPES:
        yield (
            _write_kv_cache_kernel,
            dict(key_ptr=ptr, value_ptr=ptr, kv_ptr=ptr, slot_mapping_ptr="*i64"),
            dict(BLOCK_H=num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim)),
        )
        half = head_dim // 2
        yield (
            _rotary_kernel,
            rotary,
            dict(
                BLOCK_HQ=32,
                BLOCK_HK=num_kv_heads,
                HALF=half,
                BLOCK_HALF=triton.next_power_of_2(half),
            ),
        )
    norm = dict(
        out_ptr=ptr, residual_out_ptr=ptr, x_ptr=ptr, residual_ptr=ptr, weight_ptr=ptr, eps="fp32"
    )
    for has_residual in (True, False):
        yield _rms_norm_kernel, norm, dict(HAS_RESIDUAL=has_residual, BLOCK=4096)
    yield _silu_and_mul_kernel, dict(out_ptr=ptr, x_ptr=ptr), dict(BLOCK=1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability: 80, 90, ...")
    parser.add_argument(
        "--dtypes", nargs="+", choices=sorted(TRITON_TYPES), default=["bfloat16", "float16"]
    )
    args = parser.parse_args()
    target = GPUTarget("cuda", args.arch, 32)
    for dtype in args.dtypes:
        for kernel, types, constants in kernels_to_compile(dtype):
            start = time.perf_counter()
            shared = compile_one(target, kernel, types, constants)
            took = time.perf_counter() - start
            shown = ", ".join(f"{k}={v}" for k, v in constants.items())
            name = f"sm_{args.arch} {dtype} {kernel.__name__}({shown})"
            print(f"{name}: {shared} B shared memory, compiled in {took:.1f} s")


if __name__ == "__main__":
    main()
