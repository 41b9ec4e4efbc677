"""`baton generate` end to end in a subprocess, and its errors."""

from __future__ import annotations

import subprocess
import sys


def baton(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120
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
