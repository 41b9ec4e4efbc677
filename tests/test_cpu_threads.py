"""The CPU step's threads: `--cpu-threads` (default: the cores this process may use) sets torch's
count, which Baton's kernels follow; and a kernel's parallel loop ends when its work is done,
without waiting for a thread that another process keeps off its core."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.gpu.executor import TorchExecutor
from baton.kernels.cpu_extension import cpu_kernels_available
from baton.kernels.cpu_threads import set_cpu_threads

# In a child, so that the threads' scheduling and the neighbour never reach the test process:
# every thread but the caller is moved to the neighbour's core at the lowest priority
# (SCHED_IDLE), where it runs only in the gaps the busy loop leaves; then a decode-sized
# float32 linear, split over two threads, is called CALLS times. The caller's core is its own;
# the busy loop ends with its parent, however that ends.
STARVED_THREADS = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    import torch
    from baton.kernels.cpu_extension import cpu_kernels_available
    from baton.kernels.f32_linear import f32_linear, pack_weight

    assert cpu_kernels_available()
    torch.set_num_threads(2)
    x, weight = torch.randn(1, 512), pack_weight(torch.randn(4096, 512))
    expected = f32_linear(x, weight, None, 4096)
    caller = threading.get_native_id()
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    loop = (
        f"import os\\nos.sched_setaffinity(0, {{{last}}})\\nparent = os.getppid()\\n"
        "while os.getppid() == parent:\\n    pass"
    )
    busy = subprocess.Popen([sys.executable, "-c", loop])
    try:
        os.sched_setaffinity(caller, {first})
        for tid in map(int, os.listdir("/proc/self/task")):
            if tid != caller:
                os.sched_setaffinity(tid, {last})
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        start = time.perf_counter()
        for _ in range(int(sys.argv[1])):
            assert torch.equal(f32_linear(x, weight, None, 4096), expected)
        print(time.perf_counter() - start)
    finally:
        busy.kill()
    """
)
CALLS = 50
# The calls take milliseconds when the caller can do every share itself; waiting at each loop's
# end for the starved thread's turn takes seconds a call.
BOUND_S = 10.0


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two cores to starve one thread of its core",
)
def test_a_kernel_loop_does_not_wait_for_a_thread_kept_off_its_core(tmp_path: Path) -> None:
    assert cpu_kernels_available()
    script = tmp_path / "starved_threads.py"
    script.write_text(STARVED_THREADS)

    done = subprocess.run(
        [sys.executable, str(script), str(CALLS)],
        capture_output=True,
        text=True,
        timeout=120 + BOUND_S,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )

    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < BOUND_S


def test_cpu_threads_default_to_the_cores_this_process_may_use() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(len(os.sched_getaffinity(0)) + 3)

        assert set_cpu_threads(None) == len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)


def test_the_cpu_step_computes_on_the_threads_cpu_threads_sets(make_checkpoint) -> None:
    config = ModelConfig.from_pretrained(make_checkpoint("llama"))
    before = torch.get_num_threads()
    try:
        TorchExecutor(config, EngineConfig(num_kv_blocks=8, cpu_threads=1), device="cpu")

        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cpu_threads_below_one_is_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--cpu-threads must be >= 1, got 0"):
        EngineConfig(cpu_threads=0)


# The wait policy libgomp read as torch loaded, from inside the child that built an LLM.
WAIT_POLICY_AFTER_LLM = textwrap.dedent(
    """
    import os, sys
    from baton.app.llm import LLM
    LLM(sys.argv[1], num_kv_blocks=8)
    print(os.environ.get("OMP_WAIT_POLICY"))
    """
)


@pytest.mark.parametrize(("chosen", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_offline_llm_prefers_passive_waits_unless_the_user_chose(
    make_checkpoint, chosen: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if chosen is not None:
        env["OMP_WAIT_POLICY"] = chosen
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    result = subprocess.run(
        [sys.executable, "-c", WAIT_POLICY_AFTER_LLM, str(make_checkpoint("llama"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == expected
