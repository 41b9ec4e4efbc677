"""`baton simulate`'s report on a terminal: every line within 80 columns, whatever the runs are
called, with the figures in two tables (throughput and SLOs, latency in ms)."""

from __future__ import annotations

import json
import math

import pytest

from baton.app.cli import main
from baton.core.simulation.records import QueueTrend

QUICK = ["simulate", "--rate", "4", "--num-requests", "30"]


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--policy", "priority,fcfs", "--replicas", "3", "--router", "least-loaded,round-robin"],
    ],
)
def test_the_report_fits_80_columns(capsys, flags):
    assert main([*QUICK, *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "throughput and SLOs" in lines and "latency (ms)" in lines


def test_each_run_has_a_row_in_both_tables_with_the_json_reports_figures(capsys):
    assert main([*QUICK, "--policy", "fcfs,sjf", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main([*QUICK, "--policy", "fcfs,sjf"]) == 0
    lines = capsys.readouterr().out.splitlines()
    throughput = lines.index("throughput and SLOs")
    latency = lines.index("latency (ms)")
    for policy, row in report.items():
        rates, times = [
            next(line.split() for line in part if line.startswith(policy + " "))
            for part in (lines[throughput:latency], lines[latency:])
        ]
        assert rates[1:3] == [f"{row['throughput_rps']:.2f}", f"{row['goodput_rps']:.2f}"]
        assert times[1] == f"{row['ttft_p50_ms']:.0f}"


def test_a_queue_that_nothing_left_is_warned_about_in_words():
    warning = QueueTrend(2, 40, math.inf).warning()
    assert warning is not None and "none started while more arrived" in warning
    assert "inf" not in warning
