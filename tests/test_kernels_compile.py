"""Every Triton kernel compiles for an H100 (sm_90) down to a cubin, with no GPU present.

The interpreter accepts code the compiler rejects (dot shapes, dtypes, shared memory), so CPU
machines check compilation too; `baton.kernels.compile_check` runs in a subprocess because the
interpreter tests set `TRITON_INTERPRET` for this process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

KERNELS = (
    "_paged_attention_kernel",
    "_split_kv_partial_kernel",
    "_split_kv_reduce_kernel",
    "_write_kv_cache_kernel",
    "_rms_norm_kernel",
    "_rotary_kernel",
    "_silu_and_mul_kernel",
)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_in_bf16():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "baton.kernels.compile_check",
            "--arch",
            "90",
            "--dtypes",
            "bfloat16",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for kernel in KERNELS:
        assert f"sm_90 bfloat16 {kernel}(" in result.stdout
    # Heads that are not powers of two compile in a padded tile (Phi-2, Phi-3-mini, MLA).
    for head_dim, block_d in ((80, 128), (96, 128), (192, 256)):
        assert f"HEAD_DIM={head_dim}, BLOCK_D={block_d}, DOT_PRECISION" in result.stdout
