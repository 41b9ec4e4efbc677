"""CI smoke run of the locust load test: `baton serve` on a tiny random checkpoint, locust
headless with both user types, then the CSV and the server's gauges are checked."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_harness import free_port

REPO = Path(__file__).resolve().parent.parent
# Rows that stand for requests (E2E) and per-request metrics; SLO rows are judged separately.
REQUEST_ROWS = ("E2E", "TTFT", "ITL", "TPOT", "output tokens")


@pytest.fixture
def baton_url(make_checkpoint, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    command = [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(make_checkpoint("llama"))),
        *("--device", "cpu", "--num-kv-blocks", "512", "--max-model-len", "1024"),
        *("--port", str(port)),
    ]
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def wait_healthy(url: str, server: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"baton serve exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError("baton serve did not become healthy")


def run_locust(url: str, csv_prefix: Path) -> subprocess.CompletedProcess:
    command = [
        *(sys.executable, "-m", "locust", "-f", str(REPO / "loadtest" / "locustfile.py")),
        *("--headless", "--only-summary", "-u", "4", "-r", "4", "-t", "15s", "--host", url),
        *("--csv", str(csv_prefix), "--max-tokens", "12", "--prompt-tokens", "48"),
        *("--ignore-eos", "--logprobs", "--prefix", "shared", "--prefix-tokens", "32"),
        *("--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--ws-concurrency", "3"),
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=50)


def stats_rows(csv_prefix: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(f"{csv_prefix}_stats.csv", newline="") as file:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(file)}


def gauge(metrics_text: str, name: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


@pytest.mark.slow
def test_locust_smoke_run_records_every_request_without_failures(
    baton_url: str, tmp_path: Path
) -> None:
    prefix = tmp_path / "smoke"
    result = run_locust(baton_url, prefix)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = stats_rows(prefix)
    for transport in ("SSE", "WS"):
        completed = int(rows[(transport, "E2E")]["Request Count"])
        assert completed > 0
        for name in (*REQUEST_ROWS, "SLO ttft", "SLO tpot"):
            row = rows[(transport, name)]
            # Every completed request has each metric once; a token count that disagrees with
            # the server's usage would have been a failure on "output tokens".
            assert int(row["Request Count"]) == completed, (transport, name)
            assert int(row["Failure Count"]) == 0, (transport, name)
        assert float(rows[(transport, "output tokens")]["Average Response Time"]) == 12
    metrics = httpx.get(f"{baton_url}/metrics").text
    assert gauge(metrics, "baton:num_requests_running") == 0
    assert gauge(metrics, "baton:num_requests_waiting") == 0
