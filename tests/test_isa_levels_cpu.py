"""The C++ CPU kernels at every instruction-set level this CPU can run, not only the one the suite
builds for: each level's own build (`BATON_CPU_MARCH`, in a build folder of its own) runs the
tests of the kernels whose code that level changes, in a subprocess. And the float32 linears
take Baton's kernel only where it was built with vector code, oneDNN elsewhere."""

from __future__ import annotations

import logging
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import torch

from baton.core.checkpoint.model_config import ModelConfig
from baton.gpu.loader import load_model
from baton.gpu.models.model import Linear
from baton.kernels.cpu_extension import (
    MARCH_ENV,
    SOURCES,
    cpu_kernels_available,
)
from baton.kernels.f32_linear import f32_kernel_available

ROOT = Path(__file__).parent.parent
# A level's build and its tests, with room for a loaded machine's slow compiles.
LEVEL_TIMEOUT_S = 900

# What /proc/cpuinfo lists for each x86-64 psABI level's instructions.
V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2"})
V3 = V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}

F32_LINEAR = ("tests/test_f32_linear_cpu.py", "tests/test_f32_gated_linear_cpu.py")
INT8_LINEAR = ("tests/test_int8_linear_cpu.py",)
# Attention (its AVX2 scores), the norms, gates and rotary, the float16 cache's conversions
# (half_convert.h's F16C code, which attention and rotary share) and argmax.
OTHER_KERNELS = (
    "tests/test_paged_attention_cpu.py",
    "tests/test_layer_ops_cpu.py",
    "tests/test_kv_cache_dtype.py::test_the_decode_kernel_reads_float16_as_its_float32_widening",
    "tests/test_kv_cache_dtype.py::"
    "test_a_prefill_chunks_rows_over_float16_have_their_bits_alone_and_over_float32",
    "tests/test_kv_cache_dtype.py::test_the_rotary_write_rounds_as_torch_does",
    "tests/test_kv_cache_dtype.py::"
    "test_cpu_attention_over_float16_is_float32_attention_over_the_widened_cache",
    "tests/test_sampling_cpu.py",
)
# What the level's float32 linear kernel says it was built with.
VECTOR_CODE = (
    f"tests/{Path(__file__).name}::test_the_float32_kernel_reports_the_vector_code_of_its_flags",
)
# Where that is the portable code, the float32 linears run in oneDNN, and say so once; the
# one-call decoder layers over them, as the suite checks them over Baton's kernel.
ONEDNN_FALLBACK = (
    f"tests/{Path(__file__).name}::test_float32_linears_take_the_kernel_only_with_vector_code",
    f"tests/{Path(__file__).name}::test_the_fallback_to_onednn_is_said_once",
    "tests/test_cpu_layers.py",
)


@dataclass(frozen=True)
class Level:
    """An instruction-set level the kernels build for, what the CPU needs to run that build, and
    the tests of the kernels whose code the level changes."""

    march: str
    cpu_flags: frozenset[str]
    tests: tuple[str, ...]


# With the suite's own build (this CPU's, -march=native) these cover the three families of the
# kernels' `#if`s: AVX-512 (the suite's build on an AVX-512 CPU), AVX2 and the portable code.
# The float32 linear's portable tiles serve no model (f32_kernel_available): no level runs them.
# Two sub-variants are left to the CPUs whose own build selects them, since a level costs a
# whole build of the kernels and the suite has a time budget: int8's AVX2 tiles with AVX-VNNI
# (-march=alderlake) and its AVX-512 tiles without VNNI (-march=x86-64-v4, where this CPU has
# AVX512_VNNI); int8's AVX2 tiles' AVX512_VNNI branch needs that without AVX512BW, which no CPU
# has.
LEVELS = (
    # SSE4.2 only: every other kernel's portable code, and the float linears in oneDNN.
    Level("x86-64-v2", V2, INT8_LINEAR + OTHER_KERNELS + VECTOR_CODE + ONEDNN_FALLBACK),
    Level("x86-64-v3", V3, F32_LINEAR + INT8_LINEAR + OTHER_KERNELS + VECTOR_CODE),
)


def branch_macros() -> frozenset[str]:
    """The instruction-set macros the kernels' sources branch on (`defined(__AVX2__)` ...)."""
    text = "".join(path.read_text() for path in SOURCES[0].parent.iterdir())
    return frozenset(re.findall(r"defined\((__\w+__)\)", text))


@cache
def isa_macros(march: str) -> frozenset[str]:
    """Which of `branch_macros` the compiler defines at `-march=march`: the kernels' paths."""
    compiler = os.environ.get("CXX", "c++")
    result = subprocess.run(
        [compiler, f"-march={march}", "-dM", "-E", "-x", "c++", os.devnull],
        capture_output=True,
        text=True,
        check=True,
    )
    defined = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define")}
    return branch_macros() & defined


def suite_march() -> str:
    return os.environ.get(MARCH_ENV) or "native"


def cpu_flags() -> frozenset[str] | None:
    """The instruction-set flags /proc/cpuinfo lists, None where it lists none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line else None


def skip_reason(level: Level) -> str | None:
    if platform.machine() != "x86_64":
        return f"{platform.machine()} is not an x86-64 CPU"
    flags = cpu_flags()
    if flags is None:
        return "no /proc/cpuinfo to read this CPU's instruction sets from"
    missing = sorted(level.cpu_flags - flags)
    if missing:
        return f"this CPU cannot run {level.march} code: it lacks {', '.join(missing)}"
    if isa_macros(level.march) == isa_macros(suite_march()):
        return f"the suite's own build (-march={suite_march()}) compiles {level.march}'s paths"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: level.march)
def test_the_kernel_tests_pass_at_every_level_this_cpu_runs(level: Level) -> None:
    reason = skip_reason(level)
    if reason is not None:
        pytest.skip(reason)
    # The level is part of the build's key, so each level keeps its own build folder beside the
    # suite's and reuses it between runs.
    env = {**os.environ, MARCH_ENV: level.march}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *level.tests]

    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LEVEL_TIMEOUT_S
    )

    assert result.returncode == 0, (
        f"the kernel tests failed at -march={level.march}:\n"
        f"{result.stdout[-12000:]}\n{result.stderr[-4000:]}"
    )


def vector_code(macros: frozenset[str]) -> str:
    """The float32 linear's tiles at these macros, as kernels/csrc/f32_linear_cpu.cpp picks them."""
    if "__AVX512F__" in macros:
        return "avx512"
    if {"__AVX2__", "__FMA__"} <= macros:
        return "avx2"
    return "portable"


def test_the_float32_kernel_reports_the_vector_code_of_its_flags() -> None:
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()

    isa = torch.ops.baton_cpu.f32_linear_isa()

    assert isa == vector_code(isa_macros(suite_march()))


def test_float32_linears_take_the_kernel_only_with_vector_code(make_checkpoint) -> None:
    assert cpu_kernels_available()
    portable = torch.ops.baton_cpu.f32_linear_isa() == "portable"
    config = ModelConfig.from_pretrained(make_checkpoint("llama", tie_word_embeddings=True))
    model = load_model(config, "cpu", torch.float32)
    hidden = torch.randn(3, config.hidden_size)
    expected = model.compute_logits(hidden)

    assert model.pack_linear_weights(rows_hint=4)

    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert [m.packed_weight.is_mkldnn for m in linears] == [portable] * len(linears)
    assert model.packed_logits_weight is not None
    assert model.packed_logits_weight.is_mkldnn == portable
    assert model.layers[0].mlp.gated_in_kernel == (not portable)
    torch.testing.assert_close(model.compute_logits(hidden), expected)


def test_the_fallback_to_onednn_is_said_once(caplog) -> None:
    assert cpu_kernels_available()
    portable = torch.ops.baton_cpu.f32_linear_isa() == "portable"
    f32_kernel_available.cache_clear()

    with caplog.at_level(logging.INFO):
        answers = {f32_kernel_available() for _ in range(3)}

    assert answers == {not portable}
    said = [r for r in caplog.records if "linear layers run in oneDNN" in r.getMessage()]
    assert len(said) == (1 if portable else 0)
