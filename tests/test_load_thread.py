"""`baton.app.llm.build_engine` loads on a thread of its own, so the caller keeps no OpenMP thread
pool
from the loader's parallel ops: with one beside the step thread's, libgomp manages more threads
than CPUs and cuts every barrier's spin short (the docstring of `build_engine` says more)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import baton.app.llm
from baton.app.llm import build_engine
from baton.core.checkpoint.checkpoint_check import CheckpointFormatError
from baton.core.config import EngineConfig

REPO = Path(__file__).resolve().parents[1]

# Threads that are neither Python's nor Baton's kernel pool (OpenMP workers, BLAS servers), before
# and after a load. The loader thread's pool ends a moment after the thread, so the count is
# polled for a while.
NATIVE_THREADS_AFTER_LOAD = """
import os, sys, threading, time
import torch
from baton.app.llm import build_engine
from baton.core.config import EngineConfig

def thread_name(task):
    # A thread may exit between the listing and the read; it no longer counts.
    try:
        with open(f"/proc/self/task/{task}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None

def native_threads():
    # Baton's own kernel workers (named baton-share) live for the process by design.
    names = [thread_name(t) for t in os.listdir("/proc/self/task")]
    alive = [n for n in names if n is not None]
    return len(alive) - alive.count("baton-share") - threading.active_count()

before = native_threads()
build_engine(sys.argv[1], EngineConfig(), "cpu")
deadline = time.monotonic() + 10
while native_threads() > before and time.monotonic() < deadline:
    time.sleep(0.05)
print(native_threads() - before)
"""


def test_loading_leaves_no_openmp_pool_on_the_callers_thread(llama_checkpoint):
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "2",  # a pool of one worker beside the caller, whatever the machine
        "TOKENIZERS_PARALLELISM": "false",  # no Rust thread pool to count
    }
    result = subprocess.run(
        [sys.executable, "-c", NATIVE_THREADS_AFTER_LOAD, str(llama_checkpoint)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "0", result.stdout


def test_a_failed_load_raises_its_own_error_in_the_caller(tmp_path):
    with pytest.raises(CheckpointFormatError, match="missing"):
        build_engine(tmp_path / "missing", EngineConfig(), "cpu")


def test_the_heap_is_trimmed_after_the_warm_up_profile(llama_checkpoint, monkeypatch):
    # The profile's steps free their activations last; a trim before it would leave them
    # resident for the server's whole life.
    calls = []
    profile = baton.app.llm.profile_executor
    monkeypatch.setattr(
        baton.app.llm,
        "profile_executor",
        lambda *a, **k: (calls.append("profile"), profile(*a, **k)),
    )
    monkeypatch.setattr(baton.app.llm, "release_freed_heap", lambda: calls.append("trim") or True)
    config = EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, num_kv_blocks=64)
    build_engine(llama_checkpoint, config, "cpu", profile_step_cost=True)
    assert calls == ["profile", "trim"]
