"""The C++ CPU kernels' builds: one folder per key (sources, flags, torch, Python), a recorded
build loads straight away, one process builds a folder at a time and a dead one's lock is taken
over at once, and a failed build says the compiler's error (baton.kernels.cpu_extension)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import baton.kernels.cpu_extension
from baton.app.cli import main
from baton.kernels.build_lock import BuildLockTimeout, build_lock
from baton.kernels.cpu_extension import (
    BUILD_LOG,
    MARCH_ENV,
    NAME,
    STAMP,
    build_directory,
    build_key,
    cached_build,
    cpu_kernels_available,
    first_error,
    flags,
    load_or_build,
    progress_line,
    record_build,
)


def test_a_recorded_build_is_found_only_for_the_same_sources_flags_torch_and_file(
    tmp_path,
) -> None:
    library = tmp_path / "baton_cpu_kernels_v2.so"
    library.write_bytes(b"")
    assert cached_build(tmp_path) is None

    record_build(tmp_path, library)
    assert cached_build(tmp_path) == library

    stamp = json.loads((tmp_path / STAMP).read_text())
    (tmp_path / STAMP).write_text(json.dumps({**stamp, "key": "an older source"}))
    assert cached_build(tmp_path) is None
    (tmp_path / STAMP).write_text(json.dumps(stamp))
    assert cached_build(tmp_path) == library
    # Rebuilt by another checkout (or torch's builder) since: not the build recorded.
    library.write_bytes(b"another build")
    assert cached_build(tmp_path) is None
    library.unlink()
    assert cached_build(tmp_path) is None


def test_the_build_key_covers_the_headers_beside_the_sources(tmp_path, monkeypatch) -> None:
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernel.cpp").write_text('#include "shared.h"\n')
    (csrc / "shared.h").write_text("// one schedule\n")
    monkeypatch.setattr(baton.kernels.cpu_extension, "SOURCES", [csrc / "kernel.cpp"])
    before = build_key()

    (csrc / "shared.h").write_text("// another schedule\n")

    assert build_key() != before


def test_the_build_key_and_flags_follow_the_named_instruction_set(monkeypatch) -> None:
    monkeypatch.delenv(MARCH_ENV, raising=False)
    native = build_key()
    assert "-march=native" in flags()

    monkeypatch.setenv(MARCH_ENV, "x86-64-v3")

    assert "-march=x86-64-v3" in flags() and "-march=native" not in flags()
    assert build_key() != native  # a build for one level is never loaded for another


def test_a_cached_build_loads_without_torchs_extension_builder() -> None:
    # scripts/setup installs the compiler: a failed build is a failure here, not a skip.
    assert cpu_kernels_available()  # builds, or loads a build, and records it
    code = (
        "import sys\n"
        "import torch\n"
        "from baton.kernels.cpu_extension import cpu_kernels_available\n"
        "assert cpu_kernels_available() and hasattr(torch.ops.baton_cpu, 'paged_attention')\n"
        "print('torch.utils.cpp_extension' in sys.modules, 'setuptools' in sys.modules)\n"
    )
    root = Path(__file__).parent.parent
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_each_key_builds_into_a_folder_of_its_own_under_torchs_extensions_root(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv(MARCH_ENV, raising=False)
    native = build_directory()
    assert native == tmp_path / f"{NAME}-{build_key()[:12]}"
    assert not native.exists()  # named, not made: `baton kernels status` builds nothing

    monkeypatch.setenv(MARCH_ENV, "x86-64-v3")
    assert build_directory().parent == tmp_path and build_directory() != native
    monkeypatch.delenv(MARCH_ENV)
    assert build_directory() == native  # the same inputs, whoever asks: the same build

    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "2.99.0")
        assert build_directory() != native
    with monkeypatch.context() as patch:
        patch.setattr(sys, "version", "3.99.0 (another build)")
        assert build_directory() != native


def hold_lock_in_a_child(directory: Path) -> subprocess.Popen:
    """A process that takes `directory`'s build lock (and leaves torch's own lock file, as a
    build in progress does) and keeps both until it is killed."""
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from baton.kernels.build_lock import build_lock
        with build_lock(Path({str(directory)!r}), wait_s=0):
            (Path({str(directory)!r}) / "lock").touch()
            print("locked", flush=True)
            time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "locked\n"
    return child


def test_a_live_builder_is_waited_for_and_a_killed_ones_lock_taken_over_at_once(tmp_path):
    child = hold_lock_in_a_child(tmp_path)
    try:
        with (
            pytest.raises(BuildLockTimeout, match=f"process {child.pid} on "),
            build_lock(tmp_path, wait_s=0.5),
        ):
            pass
    finally:
        child.kill()
        child.wait()

    start = time.monotonic()
    with build_lock(tmp_path, wait_s=30):
        assert time.monotonic() - start < 1.0
        owner = json.loads((tmp_path / "build.lock").read_text())
        assert owner["pid"] != child.pid


def tiny_sources(tmp_path: Path, monkeypatch, text: str) -> Path:
    """`text` as the kernels' only source, in a folder of its own: a build in seconds."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "probe.cpp").write_text(text)
    monkeypatch.setattr(baton.kernels.cpu_extension, "SOURCES", [csrc / "probe.cpp"])
    return tmp_path / "build"


def test_a_build_killed_midway_leaves_nothing_that_stalls_the_next(tmp_path, monkeypatch):
    directory = tiny_sources(tmp_path, monkeypatch, "int baton_probe() { return 1; }\n")
    directory.mkdir()
    child = hold_lock_in_a_child(directory)
    child.kill()
    child.wait()
    assert (directory / "lock").exists()  # torch's builder would wait on this forever

    start = time.monotonic()
    build = load_or_build(directory, wait_s=30)

    assert build.state == "built", build.reason
    assert 0 < build.seconds <= time.monotonic() - start
    assert build.describe() == f"C++ CPU kernels: built in {build.seconds:.0f} s into {directory}"
    loaded = load_or_build(directory, wait_s=0)
    assert (loaded.state, loaded.key) == ("loaded", build.key)
    assert loaded.describe() == f"C++ CPU kernels: loaded from {directory}"


def test_a_failed_build_says_the_compilers_first_error_and_where_the_log_is(
    tmp_path, monkeypatch
) -> None:
    source = "int baton_probe() { return undeclared_name; }\nint also_broken( {\n"
    directory = tiny_sources(tmp_path, monkeypatch, source)

    build = load_or_build(directory, wait_s=0)

    assert build.state == "unavailable"
    assert "probe.cpp:1:" in build.reason and "error:" in build.reason
    assert "undeclared_name" in build.reason
    assert build.reason.endswith(f"(the whole log: {directory / BUILD_LOG})")
    assert "also_broken" in (directory / BUILD_LOG).read_text()
    assert build.describe().startswith("C++ CPU kernels: unavailable (")


def test_a_missing_compiler_is_named_not_guessed(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CXX", "/nowhere/g++")
    build = load_or_build(tmp_path, wait_s=0)
    assert build.state == "unavailable"
    assert build.reason.startswith("/nowhere/g++ not found on PATH; install g++ and ninja")


def test_the_first_error_is_the_compilers_not_the_linkers_summary() -> None:
    output = (
        "Error building extension 'baton_cpu_kernels': [1/3] c++ -c a.cpp -o a.o\n"
        "FAILED: a.o\n"
        "a.cpp: In function 'int f()':\n"
        "a.cpp:3:12: error: 'x' was not declared in this scope\n"
        "a.cpp:9:1: error: expected '}' at end of input\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    assert first_error(output) == "a.cpp:3:12: error: 'x' was not declared in this scope"
    linked = "b.o: in function `g':\nb.cpp:(.text+0x5): undefined reference to `h'\n"
    linked += "collect2: error: ld returned 1 exit status\n"
    assert first_error(linked) == "b.cpp:(.text+0x5): undefined reference to `h'"
    assert first_error("/bin/sh: 1: c++: not found\n") == "/bin/sh: 1: c++: not found"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_build_on_a_terminal_shows_its_seconds_on_one_line_then_erases_it(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with progress_line("compiling:", every_s=0.01):
        time.sleep(0.1)
    shown = terminal.getvalue()
    assert shown.startswith("\rcompiling: 0 s\rcompiling: 0 s") and "\n" not in shown
    assert shown.endswith("\r\033[K")
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a log file: nothing drawn
    with progress_line("compiling:", every_s=0.01):
        time.sleep(0.05)
    assert sys.stderr.getvalue() == ""


def test_kernels_status_names_the_build_of_each_level_and_builds_nothing(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv(MARCH_ENV, "")  # unset, and unset again after --march sets it

    assert main(["kernels", "status"]) == 1
    native = capsys.readouterr().out
    assert main(["kernels", "status", "--march", "x86-64-v3"]) == 1
    level = capsys.readouterr().out

    assert f"folder: {tmp_path / NAME}-" in native and "march:  native\n" in native
    assert "state:  not built (baton kernels build builds it)" in native
    assert "march:  x86-64-v3\n" in level
    assert native.splitlines()[:2] != level.splitlines()[:2]  # another folder, another key
    assert list(tmp_path.iterdir()) == []


def test_kernels_build_says_where_the_build_is_and_whether_it_was_made_now(capsys) -> None:
    assert main(["kernels", "build"]) == 0
    out = capsys.readouterr().out
    assert f"folder: {build_directory()}\n" in out and f"key:    {build_key()}\n" in out
    assert "state:  found" in out or "state:  built now, in " in out
