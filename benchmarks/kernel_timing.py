"""Timing helpers shared by the GPU benchmarks: a timed callable and the card's copy bandwidth.

On CUDA, times come from events around `iters` back-to-back calls after `warmup` calls, so launch
gaps count but Python setup does not; on the CPU, from the wall clock.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable

import torch


def cpu_times_ms(
    fn: Callable[[], object],
    iters: int,
    warmup: int = 3,
    before: Callable[[], object] | None = None,
) -> list[float]:
    """Milliseconds of each of `iters` calls of `fn` on the CPU (after `warmup` unmeasured),
    fastest first; `before`, where given, runs untimed ahead of every call (to evict caches,
    say)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return sorted(samples)


def time_ms(
    fn: Callable[[], object],
    device: torch.device,
    iters: int,
    warmup: int = 3,
    graph: bool = False,
) -> float:
    """Median milliseconds per call of `fn` over `iters` calls (after `warmup` unmeasured).

    `graph` (CUDA only): capture `fn` once in a CUDA graph and time its replays, so a kernel
    shorter than its Python launch is timed on the device rather than on the launch path."""
    if device.type != "cuda":
        return statistics.median(cpu_times_ms(fn, iters, warmup))
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize(device)
    if graph:
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            fn()
        fn = captured.replay
        fn()
        torch.cuda.synchronize(device)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events)


def copy_bandwidth_gbs(device: torch.device, size_mib: int = 1024, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s, counting the bytes read and the bytes written.

    The buffer is far larger than any cache, so this is the memory bandwidth kernels can hope
    for, which is what "fraction of bandwidth" figures divide by.
    """
    src = torch.empty(size_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, iters)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def write_report(path: str, device: torch.device, bandwidth_gbs: float, args, rows: list) -> None:
    """The rows as JSON with what produced them: device, host, measured copy bandwidth, flags."""
    meta = dict(device=describe(device), host=platform.node(), copy_gb_per_s=bandwidth_gbs)
    with open(path, "w") as f:
        json.dump({"meta": meta, "args": vars(args), "rows": rows}, f, indent=1)
