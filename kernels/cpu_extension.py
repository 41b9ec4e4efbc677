"""Baton's C++ kernels for the CPU (kernels/csrc), built by torch's extension builder on first use.

The build needs g++ and ninja (scripts/setup installs them) and is cached by torch until the
source or flags change, for the CPU that built it (`-march=native`: one `TORCH_EXTENSIONS_DIR`
per kind of machine). Where it fails the CPU keeps the plain-torch path, and says why once.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).parent / "csrc" / "paged_decode_cpu.cpp"]
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

        cpp_extension.load(
            name="baton_cpu_kernels",
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
