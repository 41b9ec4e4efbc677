"""`baton bench` against a running test server: JSON metrics, goodput, a PNG of the CDFs, a
rate sweep, the chat endpoint with per-class SLOs, trace replay at the trace's own times or at
a set rate, and failures counted rather than fatal."""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from baton.app.cli import main
from baton.app.commands.bench_client import sse_lines
from baton.core.simulation.trace import load_trace
from tests.server_harness import base_url, running_server, simulated_engine
from tests.test_trace import AZURE_TRACE, JSONL_TRACE

LATENCY_FIELDS = [
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "p90", "p99")
]


@pytest.fixture(scope="module")
def server(llama_checkpoint):
    with running_server(simulated_engine(llama_checkpoint)) as state:
        yield base_url(state)


def test_bench_reports_latency_throughput_and_goodput(server, tmp_path, capsys):
    result_json, png = tmp_path / "result.json", tmp_path / "cdf.png"
    code = main(
        [
            "bench",
            "--base-url",
            server,
            "--num-prompts",
            "20",
            "--request-rate",
            "100",
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--ignore-eos",
            "--goodput",
            "ttft:60000",
            "tpot:60000",
            "--result-json",
            str(result_json),
            "--plot",
            str(png),
            "--label",
            "smoke",
        ]
    )
    assert code == 0
    report = json.loads(result_json.read_text())
    assert report["label"] == "smoke" and report["request_rate"] == 100
    assert report["completed"] == 20 and report["failed"] == 0
    assert report["total_output_tokens"] == 20 * 8
    assert report["total_input_tokens"] >= 20 * 16
    for name in LATENCY_FIELDS:
        assert report[name] >= 0
    assert report["median_ttft_ms"] <= report["p99_ttft_ms"]
    assert report["goodput_rps"] == pytest.approx(report["request_throughput"])
    assert report["slo_attainment"] == 1.0
    assert report["output_throughput"] == pytest.approx(160 / report["duration_s"])
    image = png.read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    # Two panels a row, a page wide: the PNG's width (IHDR) is at most 1000 pixels.
    assert int.from_bytes(image[16:20], "big") <= 1000
    printed = capsys.readouterr().out.splitlines()
    assert printed and all(len(line) <= 80 for line in printed), printed


def test_bench_sweeps_rates_on_the_chat_endpoint_with_class_slos(server, tmp_path):
    result_json, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    code = main(
        [
            "bench",
            "--base-url",
            server,
            "--endpoint",
            "chat",
            "--dataset",
            "synthetic-chat",
            "--workload",
            "mixed",
            "--length-scale",
            "0.02",
            "--slo-classes",
            "--send-slo",
            "--ignore-eos",
            "--num-prompts",
            "12",
            "--request-rate",
            "50,inf",
            "--max-concurrency",
            "4",
            "--result-json",
            str(result_json),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    runs = json.loads(result_json.read_text())["runs"]
    assert [run["request_rate"] for run in runs] == [50, float("inf")]
    assert all(run["completed"] == 12 for run in runs)
    assert png.stat().st_size > 0


def test_bench_replays_a_trace_at_its_own_arrival_times_with_its_targets(server, tmp_path):
    result_json = tmp_path / "trace.json"
    code = main(
        [
            "bench",
            "--base-url",
            server,
            "--dataset",
            "trace",
            "--trace-file",
            str(JSONL_TRACE),
            "--time-scale",
            "0.05",
            "--length-scale",
            "0.02",
            "--slo-classes",
            "--slo-scale",
            "100",
            "--send-slo",
            "--ignore-eos",
            "--result-json",
            str(result_json),
        ]
    )
    assert code == 0
    report = json.loads(result_json.read_text())
    replayed = load_trace(JSONL_TRACE, time_scale=0.05, length_scale=0.02)
    assert report["arrivals"] == "trace"
    assert report["completed"] == len(replayed) == 48 and report["failed"] == 0
    assert report["total_output_tokens"] == sum(r.output_len for r in replayed)
    span = replayed[-1].arrival_s - replayed[0].arrival_s
    assert report["request_rate"] == pytest.approx(47 / span)
    # The last request is sent at the trace's last arrival, not before.
    assert report["duration_s"] >= span
    assert 0 <= report["slo_attainment"] <= 1


def test_bench_replays_an_azure_trace_at_a_set_rate_and_refuses_a_missing_file(
    server, tmp_path, capsys
):
    result_json = tmp_path / "azure.json"
    code = main(
        [
            "bench",
            "--base-url",
            server,
            "--dataset",
            "trace",
            "--trace-file",
            str(AZURE_TRACE),
            "--num-prompts",
            "6",
            "--length-scale",
            "0.02",
            "--request-rate",
            "200",
            "--ignore-eos",
            "--result-json",
            str(result_json),
        ]
    )
    assert code == 0
    report = json.loads(result_json.read_text())
    assert report["arrivals"] == "request-rate" and report["request_rate"] == 200
    assert report["completed"] == 6
    expected = sum(r.output_len for r in load_trace(AZURE_TRACE, length_scale=0.02, limit=6))
    assert report["total_output_tokens"] == expected
    assert main(["bench", "--dataset", "trace"]) == 2
    assert "--trace-file" in capsys.readouterr().err
    missing = str(tmp_path / "missing.jsonl")
    assert main(["bench", "--dataset", "trace", "--trace-file", missing]) == 2


def test_bench_counts_refused_requests_as_failures(server, tmp_path, capsys):
    result_json = tmp_path / "bad.json"
    code = main(
        [
            "bench",
            "--base-url",
            server,
            "--model",
            "no-such-model",
            "--num-prompts",
            "3",
            "--result-json",
            str(result_json),
        ]
    )
    assert code == 1
    report = json.loads(result_json.read_text())
    assert report["completed"] == 0 and report["failed"] == 3
    assert "HTTP 404" in report["errors"][0]


def test_bench_token_prompts_give_the_server_the_traces_exact_lengths(server, tmp_path):
    result_json = tmp_path / "tokens.json"
    flags = ["--dataset", "trace", "--trace-file", str(JSONL_TRACE), "--num-prompts", "6"]
    flags += ["--time-scale", "0.01", "--length-scale", "0.05", "--ignore-eos", "--token-prompts"]
    assert main(["bench", "--base-url", server, *flags, "--result-json", str(result_json)]) == 0
    report = json.loads(result_json.read_text())
    replayed = load_trace(JSONL_TRACE, length_scale=0.05, limit=6)
    assert report["completed"] == 6
    assert report["total_input_tokens"] == sum(r.prompt_len for r in replayed)
    assert main(["bench", "--token-prompts", "--endpoint", "chat"]) == 2


def test_sse_lines_end_at_cr_and_lf_only_not_at_unicode_separators():
    class Body:
        async def aiter_text(self):
            for text in (
                'data: {"text": "a\u2028b"}\r',
                '\ndata: {"text": "c\u0085"}\n',
                "\ndata: [DO",
                "NE]",
            ):
                yield text

    async def lines() -> list[str]:
        return [line async for line in sse_lines(Body())]

    found = asyncio.run(lines())
    data = [line for line in found if line]
    assert data == ['data: {"text": "a\u2028b"}', 'data: {"text": "c\u0085"}', "data: [DONE]"]
    assert json.loads(data[0][5:]) == {"text": "a\u2028b"}


def test_bench_rejects_bad_flags(capsys):
    assert main(["bench", "--request-rate", "fast"]) == 2
    assert main(["bench", "--goodput", "latency:5"]) == 2


class Terminal(io.StringIO):
    """stderr as a terminal would be: what is written there is kept for the test to read."""

    def isatty(self) -> bool:
        return True


BENCH_QUICK = ["bench", "--num-prompts", "4", "--request-rate", "50", "--output-len", "3"]


def test_bench_draws_a_progress_bar_on_a_terminal_only(server, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main([*BENCH_QUICK, "--base-url", server]) == 0
    assert "rate 50/s" in terminal.getvalue() and "/4 [" in terminal.getvalue()
    monkeypatch.undo()
    assert main([*BENCH_QUICK, "--base-url", server]) == 0
    assert capsys.readouterr().err == "", "no bar when stderr is not a terminal"


def test_bench_json_prints_the_report_alone_and_no_bar(server, monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main([*BENCH_QUICK, "--base-url", server, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["completed"] == 4
    assert terminal.getvalue() == ""
