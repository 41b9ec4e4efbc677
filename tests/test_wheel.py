"""The built wheel is the whole product: installed into a fresh virtualenv, its `baton` command
serves the chat UI at `/` from the installed package (package data), not from a source tree, and
decodes with Baton's C++ CPU kernels as fast as the checkout does."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server_harness import free_port

REPO = Path(__file__).resolve().parent.parent


# What a checkout holds beyond its sources: never part of a build.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".models",
    "test-artifacts", "out",
)  # fmt: skip


def build_wheel(tmp_path: Path) -> Path:
    """The wheel, built from a copy of the tree: an in-tree build leaves build/ and egg-info
    behind, and a stale build/ would leak deleted modules into later wheels."""
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCES)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    out = tmp_path / "dist"
    subprocess.run([*command, "--wheel-dir", str(out), str(source)], check=True, timeout=300)
    (wheel,) = out.glob("baton-*.whl")
    return wheel


def venv_with_wheel(path: Path, wheel: Path, env: dict[str, str]) -> Path:
    """A fresh virtualenv holding only the wheel, which then sees this interpreter's packages
    (torch and the rest) through a path file. The path file comes after the install: pip
    would otherwise find the development install there and call Baton already installed."""
    venv.create(path, with_pip=False)
    python = path / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q"]
    subprocess.run([*install, str(wheel)], check=True, timeout=300, env=env)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    baton: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    """The wheel, built from a copy of the tree and installed into a fresh virtualenv."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp_path)
    # Nothing from the source tree: no PYTHONPATH. The kernels' builds are the checkout's: a
    # build's folder is named by its key, so the wheel loads the checkout's build exactly when
    # its kernels' sources, flags, torch and Python are the same.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    python = venv_with_wheel(tmp_path / "venv", wheel, env)
    return Installed(wheel, python, python.parent / "baton", env)


@dataclass(frozen=True)
class Served:
    url: str
    pid: int


@contextlib.contextmanager
def running(command: list, log: Path, env: dict[str, str]) -> Iterator[Served]:
    """`baton serve ... --port PORT` run from a folder of its own, until it answers."""
    port = free_port()
    with log.open("w") as out:
        server = subprocess.Popen(
            [*command, "--port", str(port)], cwd=log.parent, env=env, stdout=out, stderr=out
        )
        try:
            # Long enough for a first build of the kernels on a busy machine.
            deadline = time.monotonic() + 600
            while True:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"no answer from {command}:\n{log.read_text()}"
                try:
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
                    break
                except httpx.HTTPError:
                    time.sleep(0.3)
            yield Served(f"http://127.0.0.1:{port}", server.pid)
        finally:
            server.terminate()
            server.wait(timeout=60)


@pytest.mark.slow
def test_the_installed_wheel_serves_the_chat_ui(tmp_path, installed, llama_checkpoint):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    # One import package: nothing but `baton` and its dist-info at the top of site-packages.
    assert {name.split("/")[0] for name in names} == {"baton", "baton-0.1.0.dist-info"}
    assert {
        "baton/static/index.html",
        "baton/static/js/chat.js",
        "baton/app/demo_model/config.json",
    } <= names
    # Every file the kernels' build reads, headers included: without one the build fails and
    # the CPU serves on the plain-torch path, many times slower.
    csrc = {f"baton/kernels/csrc/{path.name}" for path in (REPO / "kernels" / "csrc").iterdir()}
    assert csrc <= names, csrc - names
    # A user's project with packages of the card's folder names, run from its own folder: both
    # its packages and Baton's import.
    project = tmp_path / "project"
    for name in ("app", "core", "gpu", "kernels"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(f"OWNER = 'user:{name}'\n")
    both = (
        "import app, core, gpu, kernels, baton.app.cli, baton.core.engine\n"
        "print(app.OWNER, core.OWNER, gpu.OWNER, kernels.OWNER, baton.app.cli.__file__)"
    )
    found = subprocess.run(
        [installed.python, "-c", both],
        capture_output=True,
        text=True,
        check=True,
        cwd=project,
        env=installed.env,
    ).stdout.split()
    assert found[:4] == ["user:app", "user:core", "user:gpu", "user:kernels"]
    assert found[4].startswith(str(installed.python.parent.parent)), found
    command = [installed.baton, "serve", "--model", str(llama_checkpoint)]
    with running(command, tmp_path / "serve.log", installed.env) as served:
        url = served.url
        page = httpx.get(f"{url}/", timeout=10)
        assert page.status_code == 200
        assert "<title>" in page.text and "js/chat.js" in page.text
    version = subprocess.run(
        [installed.baton, "--version"], capture_output=True, text=True, env=installed.env
    )
    assert version.stdout.startswith("baton 0.")


# The decode both servers time: the demo model, greedy, a fixed length.
DECODE = {"prompt": "Once upon a time", "max_tokens": 128, "temperature": 0.0, "ignore_eos": True}
ROUNDS = 9


def kernels_line(log: Path) -> str:
    """What the server log says of the C++ CPU kernels: `loaded from FOLDER`, `built in N s
    into FOLDER` or `unavailable (REASON)...`."""
    (line,) = [line for line in log.read_text().splitlines() if "C++ CPU kernels: " in line]
    return line.split("C++ CPU kernels: ", 1)[1]


def decode_cpu_s(served: Served) -> float:
    """CPU seconds the server spent on one DECODE: unlike its wall time, what other processes
    on a busy machine take of the cores does not count."""
    server = psutil.Process(served.pid)
    before = sum(server.cpu_times()[:2])
    answer = httpx.post(f"{served.url}/v1/completions", json=DECODE, timeout=120).json()
    assert answer["usage"]["completion_tokens"] == DECODE["max_tokens"], answer
    return sum(server.cpu_times()[:2]) - before


@pytest.mark.slow
def test_the_installed_wheel_decodes_with_the_cpp_kernels_as_fast_as_the_checkout(
    tmp_path, installed
):
    # Both serve the demo model (package data in the wheel), side by side, each with a small KV
    # cache and one thread, and each decode is timed by the server's CPU seconds: threads that
    # lose their core on a busy machine would time the other load, not the code. Where the
    # kernels are not built yet, the wheel's server builds them.
    flags = ["serve", "--num-kv-blocks", "64", "--cpu-threads", "1"]
    sides = {
        "wheel": ([installed.baton, *flags], installed.env),
        "checkout": ([sys.executable, "-m", "baton.app.cli", *flags], dict(os.environ)),
    }
    logs = {side: tmp_path / side / "serve.log" for side in sides}
    with contextlib.ExitStack() as stack:
        servers = {}
        for side, (command, env) in sides.items():
            logs[side].parent.mkdir()
            env = env | {"OMP_NUM_THREADS": "1"}
            servers[side] = stack.enter_context(running(command, logs[side], env))
        kernels = {side: kernels_line(log) for side, log in logs.items()}
        for side, line in kernels.items():
            assert line.startswith(("loaded from ", "built in ")), f"{side}: {line}"
        # One key, one build: the same folder, whichever of the two built it.
        assert kernels["wheel"].split()[-1] == kernels["checkout"].split()[-1], kernels
        for served in servers.values():
            decode_cpu_s(served)  # warm-up: first-request costs are not decode speed
        # Interleaved, in alternating order, each round's two decodes compared: the machine is
        # shared, and its load drifts more between rounds than within one.
        ratios, times = [], []
        for round_ in range(ROUNDS):
            order = ["wheel", "checkout"][:: -1 if round_ % 2 else 1]
            measured = {side: decode_cpu_s(servers[side]) for side in order}
            ratios.append(measured["wheel"] / measured["checkout"])
            times.append(measured)
    assert statistics.median(ratios) <= 1.5, times
