"""The built wheel is a working Baton: installed into a fresh virtualenv, its `baton` command
serves the chat UI at `/` from the installed package (package data), not from a source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
import zipfile
from pathlib import Path

import httpx
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


@pytest.mark.slow
def test_the_installed_wheel_serves_the_chat_ui(tmp_path, llama_checkpoint):
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    # One import package: nothing but `baton` and its dist-info at the top of site-packages.
    assert {name.split("/")[0] for name in names} == {"baton", "baton-0.1.0.dist-info"}
    assert {
        "baton/static/index.html",
        "baton/static/js/chat.js",
        "baton/app/demo_model/config.json",
        "baton/kernels/csrc/f32_linear_cpu.cpp",
    } <= names
    # Nothing from the source tree: no PYTHONPATH, run from elsewhere; the C++ kernels build
    # (if at all) in a folder of the test's own, so the shared build cache is left alone.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "torch_extensions")
    python = venv_with_wheel(tmp_path / "venv", wheel, env)
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
        [python, "-c", both], capture_output=True, text=True, check=True, cwd=project, env=env
    ).stdout.split()
    assert found[:4] == ["user:app", "user:core", "user:gpu", "user:kernels"]
    assert found[4].startswith(str(tmp_path / "venv")), found
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    baton = tmp_path / "venv" / "bin" / "baton"
    command = [baton, "serve", "--model", str(llama_checkpoint), "--port", str(port)]
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the installed baton did not come up"
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert page.status_code == 200
        assert "<title>" in page.text and "js/chat.js" in page.text
        version = subprocess.run([baton, "--version"], capture_output=True, text=True, env=env)
        assert version.stdout.startswith("baton 0.")
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
