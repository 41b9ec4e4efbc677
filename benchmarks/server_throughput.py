"""Server overhead: tokens/s delivered to many concurrent SSE or WebSocket streams when the
executor returns tokens instantly, so only the HTTP layer, the bridge and the scheduler cost.

    python benchmarks/server_throughput.py --transport sse --streams 256 --seconds 15
    python benchmarks/server_throughput.py --transport ws --streams 256 --seconds 15
    python benchmarks/server_throughput.py --observability off   # no metrics, no tracing

`--observability on` (the default) keeps the metrics the server always records and also traces
every request, exporting the spans over OTLP/HTTP to a sink this process runs; `off` records
neither, which is what the overhead figure in docs/benchmarks.md compares against.

The server runs in a child process (its own GIL and event loop, as in production); this process
is the client: raw asyncio HTTP for SSE (so the client is not the bottleneck) and `websockets`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import websockets

PROMPT = "The for statement is used to iterate over the elements of a sequence"


def serve(args: argparse.Namespace) -> None:
    """Child process: a Baton server over the simulated, zero-cost executor."""
    from baton.app.http.server import serve_engine
    from baton.app.llm import build_simulated_engine
    from baton.app.settings import ServerSettings
    from baton.core.config import EngineConfig
    from baton.core.text.tokenizer import Tokenizer

    sys.setswitchinterval(args.switch_interval_ms / 1000)
    config = EngineConfig(
        max_num_seqs=args.streams, max_num_batched_tokens=65536, num_kv_blocks=65536
    )
    engine = build_simulated_engine(Tokenizer.from_pretrained(args.checkpoint), config)
    observed = args.observability == "on"
    settings = ServerSettings(
        port=args.port,
        max_queued_requests=4096,
        record_metrics=observed,
        otlp_traces_endpoint=args.otlp_sink if observed else None,
    )
    logging.getLogger("baton.requests").setLevel(logging.WARNING)  # measure, not print
    serve_engine(engine, "sim", settings)


class Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that accepts every export and keeps nothing."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


async def sse_client(port: int, body: bytes, deadline: float, gaps: list[float]) -> int:
    """Stream completions back to back until the deadline; returns tokens received."""
    tokens = 0
    while time.perf_counter() < deadline:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            # The Host a loopback server answers (baton.app.http.security's Host check).
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n"
            b"\r\n%s" % (len(body), body)
        )
        last = None
        async for line in reader:
            if line.startswith(b"data: {"):
                event = orjson.loads(line[6:])
                if event.get("usage"):
                    tokens += event["usage"]["completion_tokens"]
                elif event.get("choices"):
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
        writer.close()
    return tokens


async def ws_client(port: int, frame: dict, deadline: float, gaps: list[float]) -> int:
    tokens = 0
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ws", max_size=None) as socket:
        n = 0
        while time.perf_counter() < deadline:
            n += 1
            await socket.send(orjson.dumps({**frame, "id": f"r{n}"}).decode())
            last = None
            while True:
                message = orjson.loads(await socket.recv())
                if message["type"] == "token":
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                elif message["type"] == "done":
                    tokens += message["usage"]["completion_tokens"]
                    break
                else:
                    raise RuntimeError(message)
    return tokens


async def drive(args: argparse.Namespace) -> dict:
    params = {"max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0}
    gaps: list[float] = []
    start = time.perf_counter()
    deadline = start + args.seconds
    if args.transport == "sse":
        body = orjson.dumps(
            {
                "model": "sim",
                "prompt": PROMPT,
                "stream": True,
                "stream_options": {"include_usage": True},
                **params,
            }
        )
        clients = [sse_client(args.port, body, deadline, gaps) for _ in range(args.streams)]
    else:
        frame = {"type": "generate", "prompt": PROMPT, **params}
        clients = [ws_client(args.port, frame, deadline, gaps) for _ in range(args.streams)]
    tokens = sum(await asyncio.gather(*clients))
    elapsed = time.perf_counter() - start
    gaps.sort()
    return {
        "tokens": tokens,
        "tokens_per_s": round(tokens / elapsed),
        "itl_p50_ms": round(statistics.median(gaps) * 1e3, 2),
        "itl_p99_ms": round(gaps[int(len(gaps) * 0.99)] * 1e3, 2),
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["sse", "ws"], default="ws")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--switch-interval-ms", type=float, default=5.0)
    parser.add_argument("--checkpoint", help="tokenizer source (default: a random tiny one)")
    parser.add_argument("--observability", choices=["on", "off"], default="on")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--otlp-sink", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
        return
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as scratch:
        if args.checkpoint is None:
            from baton.tools.random_checkpoint import write_checkpoint

            args.checkpoint = str(write_checkpoint(Path(scratch) / "tiny", "llama", "tiny"))
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--serve",
                "--port",
                str(args.port),
                "--streams",
                str(args.streams),
                "--checkpoint",
                args.checkpoint,
                "--switch-interval-ms",
                str(args.switch_interval_ms),
                "--observability",
                args.observability,
                "--otlp-sink",
                f"http://127.0.0.1:{sink.server_address[1]}",
            ]
        )
        try:
            for _ in range(600):
                try:
                    if httpx.get(f"http://127.0.0.1:{args.port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            cpu_before = cpu_seconds(child.pid)
            result = asyncio.run(drive(args))
            server_cpu = cpu_seconds(child.pid) - cpu_before
        finally:
            child.terminate()
            child.wait(timeout=60)
    result.update(
        transport=args.transport,
        streams=args.streams,
        observability=args.observability,
        switch_interval_ms=args.switch_interval_ms,
        server_cpu_us_per_token=round(server_cpu / max(result["tokens"], 1) * 1e6, 1),
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
