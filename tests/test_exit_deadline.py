"""The exit deadline ends the process at --shutdown-timeout from the signal, with its children,
even while threads spin in Python and contend for the GIL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

# Two threads spinning in Python, as a chat template stuck in a loop does, and a child process;
# the deadline starts at once. The script prints the child's pid and then waits for ever.
SPINNING_PROCESS = textwrap.dedent(
    """
    import subprocess, sys, threading
    from baton.app.http.exit_deadline import ExitDeadline

    def spin():
        while True:
            for _ in range(100000):
                pass

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(child.pid, flush=True)
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
    ExitDeadline(float(sys.argv[1])).signalled()
    threading.Event().wait()
    """
)
TIMEOUT_S = 1.0
# What the exit itself may take on a busy machine; the /proc walk at Python's default switch
# interval takes several seconds with two spinning threads.
EXIT_ALLOWANCE_S = 1.5


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # A killed child that nobody has reaped yet is a zombie ("Z"), not alive.
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_deadline_ends_a_process_whose_threads_spin_and_its_children():
    process = subprocess.Popen(
        [sys.executable, "-c", SPINNING_PROCESS, str(TIMEOUT_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = int(process.stdout.readline())
        started = time.monotonic()
        process.wait(TIMEOUT_S + 30)
        took = time.monotonic() - started
    finally:
        process.kill()
    stderr = process.stderr.read()
    assert process.returncode == 0, stderr
    assert took < TIMEOUT_S + EXIT_ALLOWANCE_S, stderr
    assert "--shutdown-timeout (1 s) is up" in stderr
    assert "ending 1 child processes" in stderr
    assert not alive(child)
