"""The lock a process holds while it builds the C++ CPU kernels into a build folder, so two
processes never build into one folder at once, and one that dies mid-build stalls no one.

An `flock` on a file in the folder, not a file whose existence is the lock (as torch's builder
uses): the kernel releases an flock when its owner exits, however it exits, so a build killed
midway leaves nothing to wait on, and no pid has to be trusted (pids are reused, and mean nothing
on another host sharing the folder). The file also names its owner, for the message a waiting
process logs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

LOCK_FILE = "build.lock"
# How often a waiting process tries the lock again, and says it is still waiting.
POLL_S = 0.2
REPORT_EVERY_S = 30.0


class BuildLockTimeout(Exception):
    """Another live process held the build lock for longer than the wait allowed."""


@contextlib.contextmanager
def build_lock(directory: Path, wait_s: float) -> Iterator[None]:
    """Hold `directory`'s build lock; wait up to `wait_s` for a live owner to finish first."""
    path = directory / LOCK_FILE
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(descriptor, path, wait_s)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(owner).encode(), 0)
        yield
    finally:
        # Closing releases the lock. The file stays: unlinking it would let a process that has
        # it open lock a file no one else can find.
        os.close(descriptor)


def _acquire(descriptor: int, path: Path, wait_s: float) -> None:
    start = time.monotonic()
    reported = None
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        waited_s = time.monotonic() - start
        if waited_s >= wait_s:
            raise BuildLockTimeout(
                f"{describe_owner(path)} has been building the kernels into {path.parent} for "
                f"longer than this process waited ({wait_s:.0f} s); once it finishes, a restart "
                "loads its build"
            )
        if reported is None or waited_s - reported >= REPORT_EVERY_S:
            logger.info(
                "waiting for %s, which is building the C++ CPU kernels into %s (%.0f s so far)",
                describe_owner(path),
                path.parent,
                waited_s,
            )
            reported = waited_s
        time.sleep(POLL_S)


def describe_owner(path: Path) -> str:
    """The lock's owner as its file names it: `process 123 on host`."""
    try:
        owner = json.loads(path.read_text())
        return f"process {owner['pid']} on {owner['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"  # it has the lock but has not written its name yet
