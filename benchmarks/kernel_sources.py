"""Baton's C++ CPU kernels as they were at a git revision, built beside the current ones, so a
benchmark can run before and after interleaved in one process (the machine is shared: load drifts
between two runs are often larger than the change measured).

    ops = baseline_ops("HEAD~1", "baton_cpu_before")
    ops.f32_linear(x, packed, None, out_features)

Each build compiles every source of the revision's kernels/csrc (one kernel may call code another
file holds: the float32 linear's gated tiles call layer_ops_cpu.cpp's gate) with the current
flags (`baton.kernels.cpu_extension.flags()`) and the revision's headers, its ops registered under
`namespace` instead of `baton_cpu`; builds are cached by the sources' hash.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import torch

from baton.kernels.cpu_extension import SOURCES, flags

CSRC = SOURCES[0].parent
ROOT = CSRC.parents[1]


def sources_at(revision: str) -> dict[str, str]:
    """Every file of kernels/csrc at git `revision`, by name."""
    archive = subprocess.run(
        ["git", "archive", revision, CSRC.relative_to(ROOT).as_posix()],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                files[Path(member.name).name] = tar.extractfile(member).read().decode()
    return files


def build_ops(files: dict[str, str], sources: list[str], namespace: str):
    """`sources` (names among `files`, the rest headers) built into one library whose ops are
    registered as `torch.ops.<namespace>`; returns that namespace."""
    from torch.utils import cpp_extension

    renamed = {
        name: text.replace("(baton_cpu,", f"({namespace},") if name in sources else text
        for name, text in files.items()
    }
    digest = hashlib.sha256()
    for name in sorted(renamed):
        digest.update(name.encode() + b"\0" + renamed[name].encode() + b"\0")
    key = digest.hexdigest()[:12]
    directory = Path(tempfile.gettempdir()) / f"baton-kernels-{namespace}-{key}"
    directory.mkdir(exist_ok=True)
    for name, text in renamed.items():
        (directory / name).write_text(text)
    cpp_extension.load(
        name=f"{namespace}_{key}",
        sources=[str(directory / name) for name in sources],
        build_directory=str(directory),
        extra_cflags=flags(),
        extra_ldflags=["-fopenmp"],
        is_python_module=False,
    )
    return getattr(torch.ops, namespace)


def baseline_ops(revision: str, namespace: str):
    """The kernels of kernels/csrc as they were at git `revision`, built under `namespace`."""
    files = sources_at(revision)
    return build_ops(files, sorted(name for name in files if name.endswith(".cpp")), namespace)
