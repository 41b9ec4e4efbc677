"""Soak test: thousands of mixed requests against a `baton serve` child (SSE and whole
responses, WebSocket sessions and cancels, clients that hang up, bad and extreme inputs), then
5xx, 4xx by input, RSS growth, open fds, and whether the running/waiting gauges drain to 0.

    python benchmarks/soak.py --requests 5000 --concurrency 16 --json soak.json
    python benchmarks/soak.py --duration 3600 -- --max-queued-requests 64

Flags after `--` go to `baton serve` as they are. Exits 1 on any 5xx (an error event inside a
200 stream counts as one), any valid request that did not finish, gauges left above 0, or an
ERROR entry in the server's log (a 5xx answered to a client already gone shows only there).
A bad input answered 2xx is reported as a finding; an extreme but well-typed value may get 2xx
or 4xx, never 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from soak_clients import GAUGES, HUNG_UP, Run, Tally, expected, outcome_class, worker
from soak_inputs import bad_frames, bad_inputs, edge_inputs

# Where an entry of the server's log starts: Baton's logging format, or uvicorn's own.
LOG_ENTRY = re.compile(r"^(\d{4}-\d\d-\d\d [\d:,]+ |[A-Z]+: +)")
TRACE_LINES = ("Traceback", "During handling", "The above exception")
REQUEST_ID = re.compile(r"-\d+(-\d+)*")  # ws-925-2 → ws-N, so entries group by cause


@dataclass(slots=True)
class Sample:
    elapsed_s: float
    requests: int
    rss_kb: int
    fds: int
    threads: int


def read_process(pid: int, elapsed_s: float, requests: int) -> Sample:
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss_kb = int(status["VmRSS"].split()[0])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return Sample(elapsed_s, requests, rss_kb, fds, int(status["Threads"]))


async def sample_every(
    interval_s: float, pid: int, tally: Tally, started: float, samples: list[Sample]
) -> None:
    while True:
        await asyncio.sleep(interval_s)
        sample = read_process(pid, time.monotonic() - started, tally.total)
        samples.append(sample)
        print(
            f"{sample.elapsed_s:7.0f} s  {sample.requests:6d} requests  "
            f"RSS {sample.rss_kb / 1024:7.1f} MB  {sample.fds:4d} fds  {sample.threads:3d} threads",
            file=sys.stderr,
        )


async def settled_gauges(base_url: str, timeout_s: float) -> tuple[dict[str, float], float]:
    """The gauges once both read 0, or as they stand after `timeout_s`; and the wait."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=10, trust_env=False) as client:
        while True:
            text = (await client.get("/metrics")).text
            gauges = {}
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in GAUGES:
                    gauges[name] = float(value)
            waited = time.monotonic() - started
            if not any(gauges.values()) or waited > timeout_s:
                return gauges, waited
            await asyncio.sleep(0.5)


async def soak(args: argparse.Namespace, pid: int) -> dict[str, Any]:
    base_url = f"http://127.0.0.1:{args.port}"
    tally = Tally()
    samples = [read_process(pid, 0.0, 0)]
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    async with httpx.AsyncClient(
        base_url=base_url, timeout=args.timeout, limits=limits, trust_env=False
    ) as client:
        max_model_len = (await client.get("/v1/models")).json()["data"][0]["max_model_len"]
        started = time.monotonic()
        run = Run(
            args,
            client,
            tally,
            bad_inputs(max_model_len),
            edge_inputs(max_model_len),
            bad_frames(),
            started + (args.duration or 0),
        )
        sampler = asyncio.ensure_future(
            sample_every(args.sample_interval, pid, tally, started, samples)
        )
        try:
            await asyncio.gather(
                *(worker(run, random.Random(args.seed * 1000 + i)) for i in range(args.concurrency))
            )
        finally:
            sampler.cancel()
        elapsed = time.monotonic() - started
    samples.append(read_process(pid, elapsed, tally.total))
    gauges, settle_s = await settled_gauges(base_url, args.settle)
    await asyncio.sleep(1.0)  # the server closes its side of the sockets just let go
    end = read_process(pid, time.monotonic() - started, tally.total)
    return summarize(args, tally, samples, end, gauges, settle_s, elapsed)


def rss_trend(samples: list[Sample], warmup_share: float) -> dict[str, Any]:
    """RSS after warm-up and its least-squares growth per 1,000 requests from there on."""
    after = [s for s in samples if s.requests >= warmup_share * samples[-1].requests]
    last_half = [s for s in samples if s.requests >= samples[-1].requests / 2]
    return {
        "mb_start": round(samples[0].rss_kb / 1024, 1),
        "mb_after_warmup": round(after[0].rss_kb / 1024, 1),
        "mb_end": round(samples[-1].rss_kb / 1024, 1),
        "mb_max": round(max(s.rss_kb for s in samples) / 1024, 1),
        "growth_kb_per_1000_requests": growth_per_1000(after),
        "fit_samples": len(after),
        # A warm-up curve flattens here; a leak keeps its slope.
        "growth_kb_per_1000_requests_last_half": growth_per_1000(last_half),
    }


def growth_per_1000(samples: list[Sample]) -> int | None:
    if len({s.requests for s in samples}) < 2:
        return None
    slope, _ = statistics.linear_regression(
        [s.requests for s in samples], [s.rss_kb for s in samples]
    )
    return round(slope * 1000)


def summarize(
    args: argparse.Namespace,
    tally: Tally,
    samples: list[Sample],
    end: Sample,
    gauges: dict[str, float],
    settle_s: float,
    elapsed: float,
) -> dict[str, Any]:
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    accepted: dict[str, int] = {}
    num_failed = 0  # every unexpected outcome but a bad input served, which is a finding
    for kind, outcomes in sorted(tally.outcomes.items()):
        family = kind.split("/")[0]
        for outcome, n in outcomes.items():
            by_kind[family][outcome_class(outcome)] += n
            if family in ("bad", "ws_bad") and outcome.startswith("2"):
                accepted[kind] = accepted.get(kind, 0) + n
            elif not expected(kind, outcome):
                num_failed += n
    num_5xx = sum(classes["5xx"] for classes in by_kind.values())
    return {
        "requests": tally.total,
        "elapsed_s": round(elapsed, 1),
        "requests_per_s": round(tally.total / elapsed, 2),
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "by_kind": {family: dict(classes) for family, classes in sorted(by_kind.items())},
        "outcomes": {kind: dict(outcomes) for kind, outcomes in sorted(tally.outcomes.items())},
        "num_5xx": num_5xx,
        "num_failed": num_failed,
        "bad_inputs_accepted": accepted,
        "rss": rss_trend(samples, args.warmup_share),
        "fds": {"start": samples[0].fds, "end": end.fds, "max": max(s.fds for s in samples)},
        "threads": {"start": samples[0].threads, "end": end.threads},
        "gauges_after": gauges,
        "settle_s": round(settle_s, 1),
        "findings": tally.findings,
        "gauges_zero": len(gauges) == len(GAUGES) and not any(gauges.values()),
        "samples": [
            [round(s.elapsed_s, 1), s.requests, s.rss_kb, s.fds, s.threads] for s in samples
        ],
    }


def print_report(report: dict[str, Any]) -> None:
    print(
        f"{report['requests']} requests in {report['elapsed_s']} s "
        f"({report['requests_per_s']} req/s), concurrency {report['concurrency']}, "
        f"max_tokens {report['max_tokens']}"
    )
    columns = ("2xx", "4xx", "5xx", HUNG_UP)
    print(f"{'kind':16}{'sent':>7}" + "".join(f"{c:>9}" for c in columns) + "  other")
    for family, classes in report["by_kind"].items():
        other = {c: n for c, n in classes.items() if c not in columns}
        cells = "".join(f"{classes.get(c, 0):9d}" for c in columns)
        print(f"{family:16}{sum(classes.values()):7d}{cells}  {other or ''}")
    print("4xx by input (bad inputs must get 4xx; extreme values 2xx or 4xx):")
    for kind, outcomes in report["outcomes"].items():
        if "/" in kind:
            print(f"  {kind:44}" + ", ".join(f"{o}×{n}" for o, n in sorted(outcomes.items())))
    rss, fds, threads = report["rss"], report["fds"], report["threads"]
    print(
        f"RSS: start {rss['mb_start']} MB, after warm-up {rss['mb_after_warmup']} MB, end "
        f"{rss['mb_end']} MB, max {rss['mb_max']} MB; growth after warm-up "
        f"{rss['growth_kb_per_1000_requests']} kB per 1,000 requests ({rss['fit_samples']} "
        f"samples), over the last half {rss['growth_kb_per_1000_requests_last_half']} kB"
    )
    print(
        f"open fds: start {fds['start']}, end {fds['end']}, max {fds['max']}; threads: "
        f"start {threads['start']}, end {threads['end']}"
    )
    print(f"gauges {report['settle_s']} s after the load: {report['gauges_after']}")
    server = report["server"]
    print(
        f"server: exit status {server['exit_status_after_sigterm']} after SIGTERM, "
        f"{sum(server['log_errors'].values())} ERROR entries in {server['log']}"
    )
    for entry, n in server["log_errors"].items():
        print(f"  {n}× {entry}")
    for finding in report["findings"]:
        print(
            f"finding: {finding['kind']} → {finding['outcome']}: {finding['detail']!r} "
            f"(input {finding['input'][:120]!r})"
        )
    print(
        f"{'PASS' if report['passed'] else 'FAIL'}: {report['num_5xx']} 5xx, "
        f"{report['num_failed']} unexpected outcomes, gauges at 0: {report['gauges_zero']}, "
        f"server ERROR entries: {sum(server['log_errors'].values())}, bad inputs served: "
        f"{report['bad_inputs_accepted'] or 'none'}"
    )


def start_server(port: int, serve_args: list[str], log: Any) -> subprocess.Popen:
    # The venv's own `baton` script, so the child runs the code of this checkout.
    command = [str(Path(sys.executable).with_name("baton")), "serve", "--port", str(port)]
    child = subprocess.Popen([*command, *serve_args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise SystemExit(f"baton serve exited with status {child.returncode}; see {log.name}")
        try:
            url = f"http://127.0.0.1:{port}/health"
            if httpx.get(url, timeout=5, trust_env=False).status_code == 200:
                return child
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    child.kill()
    raise SystemExit(f"baton serve did not answer /health within 300 s; see {log.name}")


def stop_server(child: subprocess.Popen) -> int:
    child.terminate()
    try:
        return child.wait(timeout=120)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def log_errors(path: Path) -> Counter[str]:
    """ERROR entries of the server's log, counted by first line and the exception they end in."""
    errors: Counter[str] = Counter()
    entry: list[str] = []
    for line in [*path.read_text(errors="replace").splitlines(), "END: "]:
        if not LOG_ENTRY.match(line):
            entry.append(line)
            continue
        if entry and any(level in entry[0] for level in ("ERROR", "CRITICAL")):
            ends = [e for e in entry[1:] if e[:1].isalnum() and not e.startswith(TRACE_LINES)]
            first = REQUEST_ID.sub("-N", LOG_ENTRY.sub("", entry[0]))
            errors[f"{first} | {ends[-1] if ends else ''}"[:300]] += 1
        entry = [line]
    return errors


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument(
        "--duration", type=float, default=None, help="run this many seconds instead of --requests"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="clients at once")
    parser.add_argument("--max-tokens", type=int, default=16, help="largest max_tokens sent")
    parser.add_argument("--port", type=int, default=8131)
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="seconds")
    parser.add_argument(
        "--warmup-share", type=float, default=0.1, help="share of requests before the RSS fit"
    )
    parser.add_argument("--settle", type=float, default=30.0, help="seconds for gauges to reach 0")
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-log", default=None, help="keep the server's output here")
    return parser.parse_args(argv)


def main() -> int:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, serve_args = parse_args(argv[:split]), argv[split + 1 :]
    log_path = Path(args.server_log or Path(tempfile.gettempdir()) / f"baton-soak-{args.port}.log")
    with log_path.open("wb") as log:
        child = start_server(args.port, serve_args, log)
        try:
            report = asyncio.run(soak(args, child.pid))
        finally:
            exit_status = stop_server(child)
    errors = log_errors(log_path)
    report["server"] = {
        "args": serve_args,
        "exit_status_after_sigterm": exit_status,
        "log": str(log_path),
        "log_errors": dict(errors),
    }
    report["passed"] = (
        report["num_5xx"] == 0
        and report["num_failed"] == 0
        and report["gauges_zero"]
        and not errors
    )
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
