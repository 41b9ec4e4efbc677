"""The process's last resort at shutdown: once `--shutdown-timeout` has passed since the signal,
`baton serve` ends whatever still runs (a thread stuck in a tokenization, a compile or a
forward, which the exit would otherwise wait for), and takes the processes it started with it
(a local Ray's agents, which outlive it otherwise), with one log line."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger("baton.server")

# The GIL switch interval once the timeout is up (Python's default is 5 ms).
EXIT_SWITCH_INTERVAL_S = 1e-5


class ExitDeadline:
    """A thread, started with the server, that waits for the signal and then the timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._signalled = threading.Event()
        threading.Thread(target=self._run, name="baton-exit-deadline", daemon=True).start()

    def signalled(self) -> None:
        """Start the count; safe from a signal handler (it only sets an event)."""
        self._signalled.set()

    def _run(self) -> None:
        # On its own thread from the start, so it ends the process even when the event loop
        # itself is held.
        self._signalled.wait()
        time.sleep(self.timeout_s)
        # From here the process only has to end. A thread spinning in Python (a template in an
        # endless loop) keeps the GIL for a whole switch interval each time this thread gives
        # it up around a system call, and the /proc walk below makes hundreds of them; the
        # shortest interval hands it back at once.
        sys.setswitchinterval(EXIT_SWITCH_INTERVAL_S)
        running = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
        children = descendants(os.getpid())
        logger.warning(
            "shutdown: --shutdown-timeout (%g s) is up; exiting without waiting for the "
            "threads still running (%s), ending %d child processes",
            self.timeout_s,
            ", ".join(running),
            len(children),
        )
        logging.shutdown()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(0)


def descendants(pid: int) -> list[int]:
    """The processes below `pid`, read from /proc (none where there is no /proc)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            # The parent's id is the second field after the command name's closing bracket.
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found.extend(below)
        pending.extend(below)
    return found
