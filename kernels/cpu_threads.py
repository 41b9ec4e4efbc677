"""How many threads a CPU step computes on (`--cpu-threads`): torch's thread pool is set to it,
and Baton's C++ kernels, which run on a pool of their own (kernels/csrc/share_pool.h), take
torch's count."""

from __future__ import annotations

import os

# OpenMP's wait policy, read once, when torch loads its OpenMP library.
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def available_cores() -> int:
    """The cores this process may run on: its affinity mask, which `taskset` and container CPU
    sets narrow, where the machine's core count would not."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform (macOS)
        return os.cpu_count() or 1


def set_cpu_threads(requested: int | None) -> int:
    """Set torch's thread count to `requested`, else to the available cores; the count set."""
    import torch  # here, so that prefer_passive_waits runs before torch loads

    threads = requested or available_cores()
    # Setting the count starts an OpenMP pool on the calling thread even when nothing changes,
    # and a pool beside the step thread's makes libgomp cut every barrier's spin short.
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def prefer_passive_waits() -> None:
    """OpenMP threads that sleep once their loop ends rather than spin on for a while: a spinning
    thread holds a core that the step's other threads, or another process, could use. Only
    before torch loads, and only where the user has not chosen a policy."""
    os.environ.setdefault(WAIT_POLICY_ENV, "PASSIVE")
