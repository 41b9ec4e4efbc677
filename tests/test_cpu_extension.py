"""The C++ CPU kernels' build cache: a recorded build loads straight away, and only for the
sources, flags and torch it was built from (baton.kernels.cpu_extension)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import baton.kernels.cpu_extension
from baton.kernels.cpu_extension import (
    MARCH_ENV,
    STAMP,
    build_key,
    cached_build,
    cpu_kernels_available,
    flags,
    record_build,
)


def test_a_recorded_build_is_found_only_for_the_same_sources_flags_torch_and_file(
    tmp_path,
) -> None:
    library = tmp_path / "baton_cpu_kernels_v2.so"
    library.write_bytes(b"")
    assert cached_build(tmp_path) is None

    record_build(tmp_path, library)
    assert cached_build(tmp_path) == library

    stamp = json.loads((tmp_path / STAMP).read_text())
    (tmp_path / STAMP).write_text(json.dumps({**stamp, "key": "an older source"}))
    assert cached_build(tmp_path) is None
    (tmp_path / STAMP).write_text(json.dumps(stamp))
    assert cached_build(tmp_path) == library
    # Rebuilt by another checkout (or torch's builder) since: not the build recorded.
    library.write_bytes(b"another build")
    assert cached_build(tmp_path) is None
    library.unlink()
    assert cached_build(tmp_path) is None


def test_the_build_key_covers_the_headers_beside_the_sources(tmp_path, monkeypatch) -> None:
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernel.cpp").write_text('#include "shared.h"\n')
    (csrc / "shared.h").write_text("// one schedule\n")
    monkeypatch.setattr(baton.kernels.cpu_extension, "SOURCES", [csrc / "kernel.cpp"])
    before = build_key()

    (csrc / "shared.h").write_text("// another schedule\n")

    assert build_key() != before


def test_the_build_key_and_flags_follow_the_named_instruction_set(monkeypatch) -> None:
    monkeypatch.delenv(MARCH_ENV, raising=False)
    native = build_key()
    assert "-march=native" in flags()

    monkeypatch.setenv(MARCH_ENV, "x86-64-v3")

    assert "-march=x86-64-v3" in flags() and "-march=native" not in flags()
    assert build_key() != native  # a build for one level is never loaded for another


def test_a_cached_build_loads_without_torchs_extension_builder() -> None:
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()  # builds, or loads a build, and records it
    code = (
        "import sys\n"
        "import torch\n"
        "from baton.kernels.cpu_extension import cpu_kernels_available\n"
        "assert cpu_kernels_available() and hasattr(torch.ops.baton_cpu, 'paged_attention')\n"
        "print('torch.utils.cpp_extension' in sys.modules, 'setuptools' in sys.modules)\n"
    )
    root = Path(__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
