"""`baton generate` and `baton serve` end to end in a subprocess: output, startup lines, errors,
and a clean exit."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from baton.app.http.server import log_startup
from baton.app.model_settings import DEMO_MODEL
from tests.server_harness import free_port, simulated_engine, wait_until_healthy

REPO = Path(__file__).resolve().parent.parent


def baton(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "baton.app.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_generate_streams_text_and_reports_tokens(llama_checkpoint):
    result = baton(
        "generate",
        "--model",
        str(llama_checkpoint),
        "--prompt",
        "The for statement",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "--ignore-eos",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert "[12 tokens in" in result.stderr and "finish: length" in result.stderr
    assert result.stdout.strip(), "the generated text is printed"


def test_generate_several_prompts_through_the_chat_template(llama_checkpoint):
    result = baton(
        "generate",
        "--model",
        str(llama_checkpoint),
        "--chat",
        "--prompt",
        "hi",
        "--prompt",
        "hello",
        "--max-tokens",
        "4",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("--- offline-") == 2


def test_generate_errors_say_what_to_change(tmp_path, llama_checkpoint):
    missing = baton("generate", "--model", str(tmp_path), "--prompt", "x")
    assert missing.returncode == 2 and "no config.json" in missing.stderr
    bad = baton(
        "generate",
        "--model",
        str(llama_checkpoint),
        "--prompt",
        "x",
        "--top-p",
        "1.5",
    )
    assert bad.returncode == 2 and "top_p must be in (0, 1]" in bad.stderr


def test_kv_cache_memory_errors_say_what_to_change(llama_checkpoint):
    common = ["generate", "--model", str(llama_checkpoint), "--prompt", "x", "--device", "cpu"]
    unreadable = baton(*common, "--kv-cache-memory", "lots")
    assert unreadable.returncode == 2
    assert "--kv-cache-memory must be a byte count or a size with a unit such as 512MiB" in (
        unreadable.stderr
    )
    too_small = baton(*common, "--max-model-len", "128", "--kv-cache-memory", "40KiB")
    assert too_small.returncode == 2
    assert "less than one sequence of --max-model-len 128 needs (64 KiB in float32)" in (
        too_small.stderr
    )


def test_startup_line_reports_the_resident_set_and_its_peak(caplog):
    engine = simulated_engine(DEMO_MODEL, num_kv_blocks=32)

    with caplog.at_level("INFO", logger="baton.server"):
        log_startup(engine, "demo", 0.5)

    # The test process's own sizes, which earlier tests may have taken past a GiB.
    line = re.search(r"RSS ([\d.]+) (MiB|GiB) \(peak ([\d.]+) (MiB|GiB)\)$", caplog.text.strip())
    assert line, caplog.text
    now_mib = float(line[1]) * (1024 if line[2] == "GiB" else 1)
    peak_mib = float(line[3]) * (1024 if line[4] == "GiB" else 1)
    assert 0 < now_mib <= peak_mib


def test_version_names_the_installed_distribution_and_the_checkouts_commit():
    result = baton("--version")
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()

    assert result.returncode == 0
    assert re.fullmatch(rf"baton \d+\.\d+\.\d+\S* \(commit {head}(, modified)?\)\n", result.stdout)


def test_a_busy_port_fails_fast_without_loading_the_model(llama_checkpoint):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = baton("serve", "--model", str(llama_checkpoint), "--port", str(port))
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "pick another --port" in result.stderr
    assert "loaded" not in result.stderr and "KV cache" not in result.stderr


def test_a_bad_chat_template_or_generation_config_fails_fast_in_one_line(
    llama_checkpoint, tmp_path
):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if %}")
    (tmp_path / "generation_config.json").write_text('{"temperature": -1}')
    cases = [
        (["--chat-template", str(tmp_path / "nope.jinja")], "--chat-template: no file"),
        (["--chat-template", str(broken)], f"the chat template {broken} is not valid Jinja"),
        (
            ["--generation-config", str(tmp_path)],
            f"{tmp_path / 'generation_config.json'}: temperature is unusable",
        ),
    ]
    for flags, fragment in cases:
        result = baton("serve", "--model", str(llama_checkpoint), "--port", "0", *flags)
        assert result.returncode == 2
        assert result.stderr.startswith(f"baton: error: {fragment}"), result.stderr
        assert result.stderr.count("\n") == 1


@pytest.mark.slow
def test_serve_logs_what_it_loaded_and_exits_cleanly_on_sigint(llama_checkpoint, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "baton.app.cli", "serve", "--model", str(llama_checkpoint)]
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--device", "cpu", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_healthy(process, port, log)
        body = {"prompt": "hi", "max_tokens": 3}
        assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body).status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    loaded = re.search(
        r"loaded the folder \S+ \(LlamaForCausalLM on the native path\) in [\d.]+ s: device cpu, "
        r"dtype float32, quantization none, "
        r"KV cache (\d+) blocks x 16 tokens = (\d+) tokens, max model len \d+, "
        r"RSS (\d+) MiB \(peak (\d+) MiB\)",
        text,
    )
    assert loaded, text
    assert int(loaded[1]) * 16 == int(loaded[2])
    # torch alone holds well over 50 MiB; the peak is never below the resident set.
    assert 50 <= int(loaded[3]) <= int(loaded[4])
    assert re.search(r"stopped: RSS \d+ MiB \(peak \d+ MiB\)", text), text
    # No third-party report at exit (nanobind's "leaked instances", multiprocessing's
    # resource_tracker "leaked semaphore"), no traceback.
    for marker in ("leaked", "resource_tracker", "Traceback"):
        assert marker not in text, text
