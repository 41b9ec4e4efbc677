"""The host's memory as the operating system reports it: sizes as users write them, what is
available to size the CPU's KV cache from, and this process's resident set (and handing back
what the loader freed)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

MiB = 1024**2
GiB = 1024**3
# Decimal units are decimal and binary ones binary; a bare letter is binary, as Docker's
# `--memory 2g` and free(1) read it, since that is what people mean by it for RAM.
UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "m": MiB,
    "g": GiB,
    "t": 1024**4,
    "kib": 1024,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
# cgroup v2 files of the process's own group, where a container's memory limit shows.
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def parse_memory_size(text: str, flag: str) -> int:
    """Bytes in `text`: a byte count, or a number with a unit (`512MiB`, `2GiB`, `1.5G`)."""
    match = _SIZE.fullmatch(text)
    unit = match[2].lower() if match else None
    if match is None or unit not in UNITS:
        raise ValueError(
            f"{flag} must be a byte count or a size with a unit such as 512MiB, 2GiB or 4GB "
            f"(units: {', '.join(u for u in UNITS if u)}, case-insensitive), got {text!r}"
        )
    size = int(float(match[1]) * UNITS[unit])
    if size < 1:
        raise ValueError(f"{flag} must be more than zero bytes, got {text!r}")
    return size


def format_size(num_bytes: int) -> str:
    """`num_bytes` in the largest binary unit it fills: what a log line or an error shows."""
    if num_bytes < MiB:
        return f"{num_bytes / 1024:.0f} KiB"
    if num_bytes < GiB:
        return f"{num_bytes / MiB:.0f} MiB"
    return f"{num_bytes / GiB:.2f} GiB"


def available_memory_bytes() -> int | None:
    """Memory this process could still take: the kernel's MemAvailable, or less where a cgroup
    limit (a container's) leaves less; None where the system does not say."""
    available = _meminfo_available()
    limit = _cgroup_headroom()
    if available is None or limit is None:
        return available if limit is None else limit
    return min(available, limit)


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_headroom() -> int | None:
    """What the process's cgroup v2 limit leaves (limit - usage); None without a limit."""
    try:
        group = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1]
        directory = _CGROUP_ROOT / group.lstrip("/")
        limit = (directory / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return int(limit) - int((directory / "memory.current").read_text())
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class ResidentSet:
    """This process's resident set size now and its peak so far, in bytes (now is None where
    the system has no /proc)."""

    current: int | None
    peak: int

    def describe(self) -> str:
        now = format_size(self.current) if self.current is not None else "unknown"
        return f"RSS {now} (peak {format_size(self.peak)})"


def resident_set() -> ResidentSet:
    peak = _own_peak()
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return ResidentSet(None, peak)
    current = pages * os.sysconf("SC_PAGE_SIZE")
    # The kernel folds per-thread counters into the peak lazily: it can trail the present.
    return ResidentSet(current, max(peak, current))


def _own_peak() -> int:
    """This process image's peak RSS in bytes. Linux's ru_maxrss carries the parent's peak across
    fork and exec (a server started by a large process would report its parent's peak), so
    VmHWM, which belongs to this image alone, comes first."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024)


def release_freed_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's `malloc_trim`); whether it could.

    Loading frees each float weight once it is packed or quantized, but glibc keeps freed
    blocks of up to its (raised) mmap threshold inside the heap, resident, until trimmed.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:  # not glibc
        return False
    trim(0)
    return True
