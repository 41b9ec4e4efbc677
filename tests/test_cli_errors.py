"""A command given something it cannot use ends with one line that says what to change and
exit status 2, never a traceback or a page of usage: a server that is not at `--base-url`, a
flag value out of its range. Run as a user runs them, in a subprocess."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server_harness import free_port


def baton(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "baton.app.cli", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], lines
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize("model", [[], ["--model", "tiny"]])
def test_bench_against_no_server_is_one_line(model):
    nobody = f"http://127.0.0.1:{free_port()}"
    result = baton("bench", "--base-url", nobody, "--num-prompts", "2", *model)
    assert_one_line_error(result, f"cannot reach a server at --base-url {nobody}", "ConnectError")
    assert result.stdout == ""


def test_bench_with_a_base_url_that_is_no_url_is_one_line():
    result = baton("bench", "--base-url", "localhost:8000", "--num-prompts", "1")
    assert_one_line_error(result, "--base-url localhost:8000", "protocol", "http://HOST:PORT")


@pytest.mark.parametrize("port", ["99999", "-1", "eighty"])
def test_a_port_out_of_range_is_refused_by_the_parser(port):
    # The parser refuses it, so the model is never loaded: the error comes at once.
    result = baton("serve", "--port", port)
    assert_one_line_error(result, "--port", "from 0 to 65535", repr(port))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["bench", "--goodput", "ttft:soon"], ["--goodput", "'ttft:soon'"]),
        (["bench", "--goodput", "tpot:-5"], ["MS a number > 0"]),
        (["simulate", "--load", "high"], ["--load", "'high'", "baton simulate --help"]),
        (["serve", "--device", "tpu"], ["--device", "'tpu'", "baton serve --help"]),
    ],
)
def test_bad_flag_values_are_one_line(args, words):
    assert_one_line_error(baton(*args), *words)
