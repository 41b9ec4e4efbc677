"""Trace replay: the shipped JSONL and Azure CSV traces read into workload requests (class
targets filled in where a row names a known class), malformed rows refused with their line and
field, and `baton simulate --workload-file` replaying a trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.app.cli import main
from baton.core.simulation.trace import TraceError, load_trace
from baton.core.simulation.workloads import CHAT, RAG

DATA = Path(__file__).parent / "data"
JSONL_TRACE = DATA / "trace_small.jsonl"
AZURE_TRACE = DATA / "azure_small.csv"


def test_jsonl_rows_keep_their_order_lengths_and_own_targets():
    requests = load_trace(JSONL_TRACE)
    rows = [json.loads(line) for line in JSONL_TRACE.read_text().splitlines()]
    assert len(requests) == len(rows) == 48
    first, own_targets = requests[0], requests[3]
    assert (first.arrival_s, first.prompt_len, first.output_len) == (0.094, 1569, 104)
    assert first.max_tokens == first.output_len
    assert first.request_class.name == "rag"
    # A row naming a known class and no targets takes the class's.
    assert (first.request_class.ttft_ms, first.request_class.tpot_ms) == (RAG.ttft_ms, 150)
    assert (own_targets.request_class.ttft_ms, own_targets.request_class.tpot_ms) == (300, 40)
    assert own_targets.request_class.priority == 0
    batch = [r for r in requests if r.request_class.name == "batch"]
    assert len(batch) == 4
    assert all(r.request_class.ttft_ms is None and r.request_class.tpot_ms is None for r in batch)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals)


def test_azure_csv_arrivals_count_from_the_first_row():
    requests = load_trace(AZURE_TRACE)
    assert len(requests) == 40
    # 2023-11-16 18:15:46.7302850, then 18:15:47.0225880.
    assert requests[0].arrival_s == 0.0
    assert requests[1].arrival_s == pytest.approx(0.2923030, abs=1e-6)
    assert (requests[0].prompt_len, requests[0].output_len) == (437, 238)
    assert {r.request_class.name for r in requests} == {"trace"}
    assert all(r.request_class.ttft_ms is None for r in requests)


def test_time_scale_length_scale_and_first_rows():
    full = load_trace(AZURE_TRACE)
    fast = load_trace(AZURE_TRACE, time_scale=0.5, length_scale=0.1, limit=5)
    assert len(fast) == 5
    for original, scaled in zip(full, fast, strict=False):
        assert scaled.arrival_s == pytest.approx(original.arrival_s * 0.5)
        assert scaled.prompt_len == max(1, round(original.prompt_len * 0.1))
        assert scaled.output_len == max(1, round(original.output_len * 0.1))


def test_a_row_without_targets_or_a_known_class_has_none(tmp_path):
    path = tmp_path / "trace.jsonl"
    rows = [
        {"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5},
        {"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 5, "class": "interactive"},
        {"arrival_s": 2, "prompt_tokens": 10, "output_tokens": 5, "class": "interactive",
         "tpot_ms": 80, "priority": 4},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    plain, chat, own = (r.request_class for r in load_trace(path))
    assert (plain.name, plain.ttft_ms, plain.tpot_ms, plain.priority) == ("trace", None, None, 0)
    assert (chat.ttft_ms, chat.tpot_ms, chat.priority) == (CHAT.ttft_ms, CHAT.tpot_ms, 0)
    assert (own.ttft_ms, own.tpot_ms, own.priority) == (CHAT.ttft_ms, 80, 4)


GOOD = '{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 5}'


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ('{"arrival_s": 1, "prompt_tokens": 10}', "line 2: missing field output_tokens"),
        ('{"arrival_s": -1, "prompt_tokens": 10, "output_tokens": 5}', "line 2: field arrival_s"),
        ('{"arrival_s": 1, "prompt_tokens": 0, "output_tokens": 5}', "line 2: field prompt_tokens"),
        ('{"arrival_s": 1, "prompt_tokens": 2.5, "output_tokens": 5}', "field prompt_tokens"),
        ('{"arrival_s": 1, "prompt_tokens": 10, "output_tokens": "5"}', "field output_tokens"),
        ('{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 5, "ttft": 9}', "unknown field"),
        ('{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 5, "ttft_ms": 0}', "field ttft_ms"),
        ('{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 5, "priority": "hi"}', "priority"),
        ('{"arrival_s": 1, "prompt_tokens": 1, "output_tokens": 5, "class": 3}', "field class"),
        ('{"arrival_s": 1, "prompt_tokens": 10,', "line 2: not a JSON object"),
        ("[1, 2, 3]", "line 2: not a JSON object"),
    ],
)
def test_a_malformed_jsonl_row_is_refused_with_its_line_and_field(tmp_path, bad_row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n{bad_row}\n{GOOD}\n")
    with pytest.raises(TraceError, match=message) as caught:
        load_trace(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("yesterday,10,5", "line 3: field TIMESTAMP must be a date and time"),
        ("2023-11-16 18:15:47.1,ten,5", "line 3: field ContextTokens must be an integer >= 1"),
        ("2023-11-16 18:15:47.1,10,0", "line 3: field GeneratedTokens must be an integer >= 1"),
        ("2023-11-16 18:15:47.1,10", "line 3: expected 3 columns"),
    ],
)
def test_a_malformed_azure_row_is_refused_with_its_line_and_field(tmp_path, bad_row, message):
    path = tmp_path / "bad.csv"
    path.write_text(
        f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n{bad_row}\n"
    )
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def test_a_file_in_neither_format_or_empty_is_refused(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("time,prompt,output\n1,2,3\n")
    with pytest.raises(TraceError, match="header lacks TIMESTAMP, ContextTokens, GeneratedTokens"):
        load_trace(other)
    empty = tmp_path / "empty.csv"
    empty.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(TraceError, match="no rows"):
        load_trace(empty)
    with pytest.raises(ValueError, match="--time-scale"):
        load_trace(AZURE_TRACE, time_scale=0)


def test_simulate_replays_a_trace_per_policy_and_class(capsys):
    code = main(
        [
            "simulate",
            "--workload-file",
            str(JSONL_TRACE),
            "--time-scale",
            "0.5",
            "--policy",
            "fcfs,slo",
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report) == ["fcfs", "slo"]
    for row in report.values():
        assert row["num_requests"] == 48
        assert row["rate_rps"] == pytest.approx(47 / (0.5 * (3.549 - 0.094)))
        assert set(row["classes"]) == {"batch", "interactive", "rag"}
        for figures in (row, *row["classes"].values()):
            assert figures["ttft_max_ms"] >= figures["ttft_p99_ms"] > 0
            assert figures["max_preemptions_per_request"] == 0
            assert 0 <= figures["slo_attainment"] <= 1
        assert row["warning"] is None and row["queue"]["growing"] is False


def test_simulate_from_an_azure_trace_prints_its_table(capsys):
    assert main(["simulate", "--workload-file", str(AZURE_TRACE), "--policy", "sjf"]) == 0
    out = capsys.readouterr().out
    assert "trace " in out and "40 requests" in out and "TTFT max" in out


def test_simulate_refuses_a_rate_with_a_trace_and_names_a_bad_row(tmp_path, capsys):
    assert main(["simulate", "--workload-file", str(AZURE_TRACE), "--rate", "4"]) == 2
    assert "--time-scale" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{GOOD}\n{GOOD}\n" + GOOD.replace("10", "-3") + "\n")
    assert main(["simulate", "--workload-file", str(bad)]) == 2
    assert "line 3: field prompt_tokens" in capsys.readouterr().err
