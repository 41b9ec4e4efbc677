"""`benchmarks/speculative.py` without servers: Baton's command line holds its thread count, and
the report names the best of llama.cpp's lookup modes against Baton with prompt lookup, and the
timed requests reuse the client made for the server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import speculative  # noqa: E402


def measured(side: str, quoting_tok_s: float, quoting_cpu_ms: float) -> dict:
    return {
        "side": side,
        "round": 0,
        "load_1min": 1.0,
        "tok_s": {"quoting": quoting_tok_s, "sampled": 100.0},
        "cpu_ms_per_token": {"quoting": quoting_cpu_ms, "sampled": 5.0},
        "acceptance": {"quoting": 0.5, "sampled": None},
    }


def test_baton_runs_on_the_threads_llama_cpp_gets():
    args = speculative.parse_args(["--threads", "1", "--model", "ckpt"])
    command = speculative.server_command(speculative.Side("baton"), args, None, 512)
    assert command[command.index("--cpu-threads") + 1] == "1"


def test_report_names_the_best_llama_cpp_lookup_by_tok_s_and_by_cpu():
    names = ["baton", "baton+ngram", "llama.cpp+ngram-mod", "llama.cpp+ngram-cache"]
    runs = [
        measured("baton", 100.0, 5.0),
        measured("baton+ngram", 300.0, 2.0),
        measured("llama.cpp+ngram-mod", 150.0, 3.0),  # slower, but the least CPU a token
        measured("llama.cpp+ngram-cache", 200.0, 4.0),
    ]
    _, table = speculative.report(runs, names)
    assert "(llama.cpp+ngram-cache), quoting tok/s: 1.50×" in table
    assert "(llama.cpp+ngram-mod), quoting CPU per token: 1.50×" in table


def test_the_warm_up_and_the_timed_request_go_through_the_servers_one_client():
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body["max_tokens"])
        return httpx.Response(200, json={"usage": {"completion_tokens": body["max_tokens"]}})

    args = speculative.parse_args(["--model", "ckpt", "--output-len", "16"])
    with httpx.Client(base_url="http://server", transport=httpx.MockTransport(answer)) as client:
        answer_, _ = speculative.one_stream(client, "m", os.getpid(), [1, 2, 3], 0.0, args)
    assert sent == [1, 16]
    assert answer_.tokens == 16
