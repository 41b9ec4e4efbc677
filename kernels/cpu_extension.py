"""Baton's C++ kernels for the CPU (kernels/csrc), built by torch's extension builder on first use.

The build needs g++ and ninja (scripts/setup installs them) and is cached by torch until the
source or flags change, for the CPU that built it (`-march=native`: one `TORCH_EXTENSIONS_DIR`
per kind of machine). Where it fails the CPU keeps the plain-torch path, and says why once.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

NAME = "baton_cpu_kernels"
SOURCES = [
    Path(__file__).parent / "csrc" / name for name in ("paged_decode_cpu.cpp", "layer_ops_cpu.cpp")
]
# torch's builder waits forever on a lock file a killed build left behind; a build takes well
# under a minute, so a lock older than this belongs to a process that died mid-build.
STALE_LOCK_S = 300.0
# Reassociation lets the compiler vectorize the dot products; the order it picks is fixed in
# the binary, so results still do not depend on the batch. `at::parallel_for` is inline OpenMP:
# without -fopenmp it runs on one thread. The library it links (soname libgomp.so.1) resolves to
# the one torch has already loaded, so both share torch's thread pool.
FLAGS = [
    "-fopenmp",
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
]


@cache
def cpu_kernels_available() -> bool:
    """Build (or load the cached build of) the kernels; their ops live in `torch.ops.baton_cpu`."""
    try:
        from torch.utils import cpp_extension

        directory = build_directory(cpp_extension.get_default_build_root())
        clear_stale_build_lock(directory)
        cpp_extension.load(
            name=NAME,
            build_directory=str(directory),
            sources=[str(source) for source in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
    except Exception as error:  # any failure to build means the plain-torch path, said once
        logger.warning(
            "Baton's C++ CPU kernels did not build, so the CPU runs the slower plain-torch "
            "attention (install g++ and ninja, as scripts/setup does): %s",
            error,
        )
        return False
    return True


def build_directory(default_root: str) -> Path:
    """Where torch would build the kernels (`TORCH_EXTENSIONS_DIR` or its default root, then
    Python version and `cpu`), named here so the lock file inside is known."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or default_root)
    directory = root / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / NAME
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def clear_stale_build_lock(directory: Path, now: float | None = None) -> bool:
    """Remove a build lock older than STALE_LOCK_S; whether one was removed."""
    lock = directory / "lock"
    try:
        age_s = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age_s <= STALE_LOCK_S:
        return False
    logger.warning("removing a kernel build lock left %.0f s ago by a dead build: %s", age_s, lock)
    lock.unlink(missing_ok=True)
    return True
