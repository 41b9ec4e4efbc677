"""Baton's C++ kernels for the CPU (kernels/csrc), built by torch's extension builder on first use
or ahead of time (`baton kernels build`).

A build lives in a folder named by its key (`build_key`: every file of kernels/csrc, the flags,
torch and Python) under torch's extensions root (`TORCH_EXTENSIONS_DIR`, else its default), so a
checkout, a wheel's install, another venv and another `BATON_CPU_MARCH` level each keep their own
build, and share one exactly when they would build the same library. The build needs g++ and
ninja (scripts/setup installs them); where it fails, the CPU keeps the plain-torch path and the
log says the compiler's first error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import torch
import torch._appdirs

from baton.kernels.build_lock import BuildLockTimeout, build_lock

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
LDFLAGS = ("-fopenmp",)
# Beside the build: which library the build of this key made, written once it is whole.
STAMP = "baton_build.json"
# Beside a failed build: the builder's whole output.
BUILD_LOG = "build.log"
# The instruction set the kernels are built for: this CPU's own by default; a named level
# (`x86-64-v3` for AVX2 and FMA, `x86-64-v4` for AVX-512) makes one build that a fleet of
# machines can share, or measures another CPU's code path on this one.
MARCH_ENV = "BATON_CPU_MARCH"
# How long a start waits for another live process's build of the same key before it serves
# with plain torch: longer than a build takes on a loaded small machine.
BUILD_WAIT_S = 1200.0


def march() -> str:
    return os.environ.get(MARCH_ENV) or "native"


def flags() -> list[str]:
    """The compiler flags of a build. Reassociation lets the compiler vectorize the dot
    products; the order it picks is fixed in the binary, so results still do not depend on the
    batch. `at::parallel_for` is inline OpenMP: without -fopenmp it runs on one thread. The
    library it links (soname libgomp.so.1) resolves to the one torch has already loaded, so both
    share torch's thread pool."""
    return [
        "-fopenmp",
        "-O3",
        f"-march={march()}",
        "-fno-math-errno",
        "-fassociative-math",
        "-fno-signed-zeros",
        "-fno-trapping-math",
    ]


class KernelBuildError(Exception):
    """Why the kernels did not build, in the words a user can act on."""


@dataclass(frozen=True, slots=True)
class KernelBuild:
    """What loading the kernels came to: `built` now, `loaded` (an earlier build of this key),
    or `unavailable`, with the reason."""

    state: Literal["built", "loaded", "unavailable"]
    directory: Path
    key: str
    seconds: float = 0.0
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.state != "unavailable"

    def describe(self) -> str:
        if self.state == "built":
            return f"C++ CPU kernels: built in {self.seconds:.0f} s into {self.directory}"
        if self.state == "loaded":
            return f"C++ CPU kernels: loaded from {self.directory}"
        return (
            f"C++ CPU kernels: unavailable ({self.reason}), so the CPU runs the slower "
            "plain-torch path"
        )


@cache
def cpu_kernels() -> KernelBuild:
    """The kernels, loaded once a process (built first where this key has no build yet), their
    ops in `torch.ops.baton_cpu`; what it came to is logged once."""
    build = load_or_build(build_directory())
    if build.available:
        logger.info("%s", build.describe())
    else:
        logger.warning("%s", build.describe())
    return build


def cpu_kernels_available() -> bool:
    return cpu_kernels().available


def load_or_build(directory: Path, wait_s: float = BUILD_WAIT_S) -> KernelBuild:
    """Load the build of this key in `directory`, building it first if there is none. Only one
    process builds into a folder at a time; the others wait for its build and load it."""
    key = build_key()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        library = cached_build(directory)
        if library is None:
            with build_lock(directory, wait_s):
                library = cached_build(directory)  # built by the owner this process waited on
                if library is None:
                    start = time.monotonic()
                    build(directory)
                    return KernelBuild("built", directory, key, time.monotonic() - start)
        torch.ops.load_library(str(library))
    except (KernelBuildError, BuildLockTimeout) as error:
        return KernelBuild("unavailable", directory, key, reason=str(error))
    except Exception as error:  # whatever else stops the kernels, the CPU still serves
        return KernelBuild("unavailable", directory, key, reason=f"{type(error).__name__}: {error}")
    return KernelBuild("loaded", directory, key)


def build(directory: Path) -> Path:
    """Compile the kernels into `directory` (whose build lock the caller holds) and load them;
    the library's path."""
    missing = [tool for tool in (compiler(), "ninja") if shutil.which(tool) is None]
    if missing:
        raise KernelBuildError(
            f"{' and '.join(missing)} not found on PATH; install g++ and ninja "
            "(scripts/setup does: apt-get install g++ ninja-build)"
        )
    from torch.utils import cpp_extension  # imports setuptools: only when building

    # torch's builder has a lock of its own, a file whose existence is the lock: one left by a
    # build killed midway would make it wait forever. Under build_lock no one else builds here,
    # so such a file is always a dead build's.
    (directory / "lock").unlink(missing_ok=True)
    logger.info(
        "building Baton's C++ CPU kernels for %s (first start of this build; a minute or a "
        "few) into %s...",
        march(),
        directory,
    )
    try:
        with progress_line("compiling Baton's C++ CPU kernels:"):
            library = cpp_extension.load(
                name=NAME,
                build_directory=str(directory),
                sources=[str(source) for source in SOURCES],
                extra_cflags=flags(),
                extra_ldflags=list(LDFLAGS),  # a copy: the builder appends to it
                is_python_module=False,
            )
    except Exception as error:
        log = directory / BUILD_LOG
        log.write_text(str(error))
        raise KernelBuildError(f"{first_error(str(error))} (the whole log: {log})") from error
    record_build(directory, Path(library))
    return Path(library)


def compiler() -> str:
    """The C++ compiler torch's builder runs (its `get_cxx_compiler`, without importing it)."""
    return os.environ.get("CXX") or "c++"


def first_error(output: str) -> str:
    """The line of a failed build's output that says why: the compiler's first error (the
    linker's summary only if nothing better), else a missing program, else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for wanted in (
        lambda line: "error:" in line and not line.startswith("collect2"),
        lambda line: "undefined reference" in line,
        lambda line: "error:" in line,
        lambda line: "not found" in line,
    ):
        for line in lines:
            if wanted(line):
                return line
    return lines[-1] if lines else "the build failed and printed nothing"


@contextlib.contextmanager
def progress_line(text: str, every_s: float = 1.0) -> Iterator[None]:
    """On a terminal, `text` and the seconds so far on one line, redrawn every `every_s` and
    erased at the end; elsewhere nothing (a log file gets the lines before and after)."""
    stream = sys.stderr
    if not stream.isatty():
        yield
        return
    done = threading.Event()
    start = time.monotonic()

    def redraw() -> None:
        while not done.wait(every_s):
            stream.write(f"\r{text} {time.monotonic() - start:.0f} s")
            stream.flush()

    ticker = threading.Thread(target=redraw, name="kernel-build-progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        stream.write("\r\033[K")
        stream.flush()


def build_root() -> Path:
    """Where torch's builder puts extensions: `TORCH_EXTENSIONS_DIR`, else its default root
    (`cpp_extension.get_default_build_root`, found without importing cpp_extension, which
    imports setuptools)."""
    default = torch._appdirs.user_cache_dir(appname="torch_extensions")
    return Path(os.path.realpath(os.environ.get("TORCH_EXTENSIONS_DIR") or default))


def build_directory(root: Path | None = None) -> Path:
    """The folder of this key's build: one per key, so builds of different keys never replace
    each other, and all builds of one key are the same build."""
    return (root or build_root()) / f"{NAME}-{build_key()[:12]}"


def build_key() -> str:
    """What a build depends on: every file of kernels/csrc (sources and headers) by name, the
    flags, torch (its version, commit and C++ ABI), Python (its version and ABI) and the
    machine type. torch's own check (a ninja run, after importing setuptools) costs a cold
    start more than loading the kernels."""
    digest = hashlib.sha256()
    for path in sorted(SOURCES[0].parent.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(" ".join([*flags(), *LDFLAGS]).encode())
    torch_build = (torch.__version__, torch.version.git_version, torch._C._GLIBCXX_USE_CXX11_ABI)
    python_build = (sys.version, sys.implementation.cache_tag, sys.abiflags, platform.machine())
    digest.update(repr((torch_build, python_build)).encode())
    return digest.hexdigest()


def cached_build(directory: Path) -> Path | None:
    """The library built for `build_key()` in `directory`, if `record_build` noted one and no
    build has replaced the file since."""
    try:
        stamp = json.loads((directory / STAMP).read_text())
        library = Path(stamp["library"])
        unchanged = stamp["file"] == file_identity(library)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return library if unchanged and stamp["key"] == build_key() else None


def record_build(directory: Path, library: Path) -> None:
    stamp = {"key": build_key(), "library": str(library), "file": file_identity(library)}
    # Written whole, then renamed: a server starting meanwhile reads no stamp or the whole one.
    partial = directory / f"{STAMP}.{os.getpid()}"
    partial.write_text(json.dumps(stamp))
    partial.replace(directory / STAMP)


def file_identity(path: Path) -> list[int]:
    """What changes when a build rewrites the file: its size and modification time."""
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]
