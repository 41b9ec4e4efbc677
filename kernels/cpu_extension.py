"""Baton's C++ kernels for the CPU (kernels/csrc), built by torch's extension builder on first use.

The build needs g++ and ninja (scripts/setup installs them) and is cached until the source,
flags or torch change, for the CPU that built it (`-march=native`, or the level that
`BATON_CPU_MARCH` names: one `TORCH_EXTENSIONS_DIR` per kind of machine); a cached build loads
without asking torch's builder. Where the build fails the CPU keeps the plain-torch path, and
says why once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from functools import cache
from pathlib import Path

import torch
import torch._appdirs

logger = logging.getLogger(__name__)

NAME = "baton_cpu_kernels"
SOURCES = [
    Path(__file__).parent / "csrc" / name
    for name in (
        "paged_attention_cpu.cpp",
        "layer_ops_cpu.cpp",
        "int8_linear_cpu.cpp",
        "f32_linear_cpu.cpp",
        "decoder_layers_cpu.cpp",
        "sampling_cpu.cpp",
    )
]
# Beside the build: which library the last build of which sources and flags made.
STAMP = "baton_build.json"
# torch's builder waits forever on a lock file a killed build left behind; a build takes well
# under a minute, so a lock older than this belongs to a process that died mid-build.
STALE_LOCK_S = 300.0
# The instruction set the kernels are built for: this CPU's own by default; a named level
# (`x86-64-v3` for AVX2 and FMA, `x86-64-v4` for AVX-512) makes one build that a fleet of
# machines can share, or measures another CPU's code path on this one.
MARCH_ENV = "BATON_CPU_MARCH"


def flags() -> list[str]:
    """The compiler flags of a build. Reassociation lets the compiler vectorize the dot
    products; the order it picks is fixed in the binary, so results still do not depend on the
    batch. `at::parallel_for` is inline OpenMP: without -fopenmp it runs on one thread. The
    library it links (soname libgomp.so.1) resolves to the one torch has already loaded, so both
    share torch's thread pool."""
    return [
        "-fopenmp",
        "-O3",
        f"-march={os.environ.get(MARCH_ENV) or 'native'}",
        "-fno-math-errno",
        "-fassociative-math",
        "-fno-signed-zeros",
        "-fno-trapping-math",
    ]


@cache
def cpu_kernels_available() -> bool:
    """Load the kernels, building them first where this source, these flags and this torch have
    no build yet; their ops live in `torch.ops.baton_cpu`."""
    try:
        directory = build_directory(default_build_root())
        library = cached_build(directory)
        if library is not None:
            torch.ops.load_library(str(library))
            return True
        from torch.utils import cpp_extension

        clear_stale_build_lock(directory)
        library = cpp_extension.load(
            name=NAME,
            build_directory=str(directory),
            sources=[str(source) for source in SOURCES],
            extra_cflags=flags(),
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
        )
        record_build(directory, Path(library))
    except Exception as error:  # any failure to build means the plain-torch path, said once
        logger.warning(
            "Baton's C++ CPU kernels did not build, so the CPU runs the slower plain-torch "
            "attention (install g++ and ninja, as scripts/setup does): %s",
            error,
        )
        return False
    return True


def default_build_root() -> str:
    """torch's default extensions root (`cpp_extension.get_default_build_root`), found without
    importing cpp_extension, which imports setuptools."""
    return os.path.realpath(torch._appdirs.user_cache_dir(appname="torch_extensions"))


def build_key() -> str:
    """What a build depends on: the sources, the flags, torch and Python. torch's own check
    (a ninja run, after importing setuptools) costs a cold start more than loading the kernels."""
    digest = hashlib.sha256()
    for source in sorted(SOURCES[0].parent.iterdir()):  # the sources and their headers
        digest.update(source.read_bytes())
    digest.update(" ".join(flags()).encode())
    digest.update(f"{torch.__version__} {sys.version}".encode())
    return digest.hexdigest()


def cached_build(directory: Path) -> Path | None:
    """The library built for `build_key()` in `directory`, if `record_build` noted one and no
    build has replaced the file since (another checkout sharing the directory may)."""
    try:
        stamp = json.loads((directory / STAMP).read_text())
        library = Path(stamp["library"])
        unchanged = stamp["file"] == file_identity(library)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return library if unchanged and stamp["key"] == build_key() else None


def record_build(directory: Path, library: Path) -> None:
    stamp = {"key": build_key(), "library": str(library), "file": file_identity(library)}
    # Written whole, then renamed: a server starting meanwhile reads the old stamp or the new.
    partial = directory / f"{STAMP}.{os.getpid()}"
    partial.write_text(json.dumps(stamp))
    partial.replace(directory / STAMP)


def file_identity(path: Path) -> list[int]:
    """What changes when a build rewrites the file: its size and modification time."""
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


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
