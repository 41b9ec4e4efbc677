"""The fault suite (issue 44): every attack of benchmarks/faults_attacks.py replayed against a
fresh Baton server while neighbour streams run, each reported as what the server answered, the
neighbours' p99 inter-token gap during the attack against before it, the server's resident
memory before and after, its CPU once the attacking client has left, and the seconds from
SIGTERM to its exit.

    PYTHONPATH=$PWD python benchmarks/faults.py                      # every attack, ~6 min
    PYTHONPATH=$PWD python benchmarks/faults.py --attacks deep_schema stats_polling
    ... --pythonpath /other/checkout     # the server imports baton from there

A refusal (a 400) is the attack held off: the suite records it and goes on. Issue 44's bar,
checked per attack: p99 gap within 2x of the baseline, memory back within 10%, exit within
--shutdown-timeout (and the server idle once the client left). The markdown table goes to
stderr, the JSON report to stdout; exits 1 where an attack missed the bar.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from faults_attacks import ATTACKS, Target

REPO = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Outcome:
    attack: str
    answers: str
    baseline_p99_gap_ms: float
    attack_p99_gap_ms: float
    rss_before_mib: float
    rss_after_mib: float
    cpu_after_client_left: float
    sigterm_to_exit_s: float
    load_1min: float

    def misses(self, shutdown_timeout_s: float) -> list[str]:
        """Which of issue 44's bars this attack missed."""
        missed = []
        if not self.attack_p99_gap_ms <= 2 * self.baseline_p99_gap_ms:
            missed.append("p99 gap")
        if not self.rss_after_mib <= 1.1 * self.rss_before_mib:
            missed.append("memory")
        if not self.cpu_after_client_left < 0.1:
            missed.append("work after the client left")
        if not self.sigterm_to_exit_s <= shutdown_timeout_s + 5:
            missed.append("shutdown")
        return missed


def checkpoint() -> Path:
    """The bench Llama with room for the scoring attack's 2,000-id prompts, written once."""
    from baton.tools.random_checkpoint import write_checkpoint

    cache = Path(os.environ.get("BATON_PEERS") or Path.home() / ".cache" / "baton-peers")
    path = cache / "models" / "llama-bench-4k"
    if not (path / "config.json").is_file():
        partial = path.with_name(path.name + ".partial")
        write_checkpoint(partial, "llama", "bench", max_position_embeddings=4096)
        partial.rename(path)
    return path


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User and system seconds of `pid` and its children (/proc/PID/stat's fields 14-17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / CLOCK_TICKS


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98]


class Neighbours:
    """`streams` SSE streams one request after another, noting each gap between two chunks of a
    response as (start, end)."""

    def __init__(self, target: Target, streams: int) -> None:
        self.target = target
        self.gaps: list[tuple[float, float]] = []
        self.last: dict[int, float] = {}  # per stream, its last chunk within a response
        self.tasks = [asyncio.create_task(self.stream(i)) for i in range(streams)]

    async def stream(self, index: int) -> None:
        body = {
            "model": self.target.model,
            "prompt": "The neighbour says",
            "max_tokens": 48,
            "ignore_eos": True,
            "stream": True,
        }
        async with httpx.AsyncClient(base_url=self.target.base_url, timeout=None) as client:
            while True:
                async with client.stream("POST", "/v1/completions", json=body) as reply:
                    async for line in reply.aiter_lines():
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        now = time.monotonic()
                        if index in self.last:
                            self.gaps.append((self.last[index], now))
                        self.last[index] = now
                self.last.pop(index, None)

    async def flowing(self, gaps: int, timeout_s: float) -> None:
        """Wait until the streams have made `gaps` gaps (past their first tokens)."""
        end = time.monotonic() + timeout_s
        while len(self.gaps) < gaps and time.monotonic() < end:
            await asyncio.sleep(0.1)

    def p99_gap_ms(self, start: float, end: float) -> float:
        """The p99 of the gaps that overlap [start, end): a stall across the window counts."""
        return 1e3 * p99([b - a for a, b in self.gaps if a < end and b > start])

    async def stop(self) -> None:
        """Stop the streams; a gap still open counts up to now."""
        now = time.monotonic()
        self.gaps.extend((last, now) for last in self.last.values())
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def start_server(args: argparse.Namespace, model: Path, log: Path) -> subprocess.Popen:
    command = [
        *(sys.executable, "-m", "baton.app.cli", "serve", "--model", str(model)),
        *("--host", "127.0.0.1", "--port", str(args.port), "--device", "cpu"),
        *("--shutdown-timeout", str(args.shutdown_timeout)),
        *shlex.split(args.baton_args),
    ]
    path = args.pythonpath or os.environ.get("PYTHONPATH", "")
    env = os.environ | {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


async def ready(target: Target, server: subprocess.Popen, timeout_s: float) -> None:
    """Wait until the server answers a short completion."""
    end = time.monotonic() + timeout_s
    body = {"model": target.model, "prompt": "warm up", "max_tokens": 4}
    async with httpx.AsyncClient(base_url=target.base_url) as client:
        while time.monotonic() < end and server.poll() is None:
            try:
                if (await client.post("/v1/completions", json=body, timeout=30)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError(f"the server gave no answer within {timeout_s:.0f} s")


def stop(server: subprocess.Popen, cap_s: float) -> float:
    """SIGTERM, then the seconds until the server exits (killed at `cap_s`: inf)."""
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=cap_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        return float("inf")
    return time.monotonic() - start


async def replay(name: str, args: argparse.Namespace, model: Path) -> Outcome:
    """One attack against a fresh server, neighbours streaming throughout."""
    target = Target("127.0.0.1", args.port, str(model.name), args.vocab_size)
    server = start_server(args, model, args.log_dir / f"faults-{name}.log")
    try:
        await ready(target, server, args.start_timeout)
        rss_before = resident_mib(server.pid)
        neighbours = Neighbours(target, args.neighbour_streams)
        await neighbours.flowing(2 * args.neighbour_streams, args.start_timeout)
        baseline_start = time.monotonic()
        await asyncio.sleep(args.baseline_s)
        await neighbours.flowing(len(neighbours.gaps) + 20, args.baseline_s)
        attack_start = time.monotonic()
        try:
            answers = await asyncio.wait_for(
                ATTACKS[name](target, args.attack_s), args.attack_s + 30
            )
        except Exception as error:  # an attack the server breaks off is recorded, not fatal
            answers = f"{type(error).__name__}: {error}"[:120]
        # The neighbours are measured over the attack's time at least, however soon it ends.
        await asyncio.sleep(max(0.0, attack_start + args.attack_s - time.monotonic()))
        attack_end = time.monotonic()
        await neighbours.stop()
        await asyncio.sleep(1.0)
        cpu_start = cpu_seconds(server.pid)
        await asyncio.sleep(args.cpu_s)
        cpu = (cpu_seconds(server.pid) - cpu_start) / args.cpu_s
        rss_after = resident_mib(server.pid)
    finally:
        exit_s = stop(server, args.shutdown_timeout + 60)
    return Outcome(
        attack=name,
        answers=answers,
        baseline_p99_gap_ms=neighbours.p99_gap_ms(baseline_start, attack_start),
        attack_p99_gap_ms=neighbours.p99_gap_ms(attack_start, attack_end),
        rss_before_mib=rss_before,
        rss_after_mib=rss_after,
        cpu_after_client_left=cpu,
        sigterm_to_exit_s=exit_s,
        load_1min=os.getloadavg()[0],
    )


def markdown(outcomes: list[Outcome], shutdown_timeout_s: float) -> str:
    lines = [
        "| attack | answers | neighbours' p99 gap ms, before / during | RSS MiB, before / after "
        "| server CPU after the client left (cores) | SIGTERM to exit s | load | missed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.attack} | {o.answers} | {o.baseline_p99_gap_ms:.0f} / "
            f"{o.attack_p99_gap_ms:.0f} | {o.rss_before_mib:.0f} / {o.rss_after_mib:.0f} "
            f"| {o.cpu_after_client_left:.2f} | {o.sigterm_to_exit_s:.1f} | {o.load_1min:.1f} "
            f"| {', '.join(o.misses(shutdown_timeout_s)) or 'none'} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", nargs="+", choices=sorted(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the bench Llama")
    parser.add_argument("--pythonpath", default="", help="the server's PYTHONPATH (default: ours)")
    parser.add_argument("--baton-args", default="", help="more serve flags")
    parser.add_argument("--port", type=int, default=8183)
    parser.add_argument("--neighbour-streams", type=int, default=2)
    parser.add_argument("--baseline-s", type=float, default=4.0)
    parser.add_argument("--attack-s", type=float, default=8.0)
    parser.add_argument("--cpu-s", type=float, default=3.0, help="CPU measured over this")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    return parser.parse_args(argv)


async def replay_all(args: argparse.Namespace) -> list[Outcome]:
    model = args.checkpoint or checkpoint()
    args.vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    outcomes = []
    for name in args.attacks:
        outcomes.append(await replay(name, args, model))
        print(markdown(outcomes[-1:], args.shutdown_timeout).splitlines()[-1], file=sys.stderr)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    outcomes = asyncio.run(replay_all(args))
    report = {
        "command": shlex.join(sys.argv),
        "started": started,
        "loadavg_after": Path("/proc/loadavg").read_text().strip(),
        "outcomes": [asdict(o) | {"missed": o.misses(args.shutdown_timeout)} for o in outcomes],
    }
    text = json.dumps(report, indent=2, default=str)
    print(text)
    print(markdown(outcomes, args.shutdown_timeout), file=sys.stderr)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if any(o.misses(args.shutdown_timeout) for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
