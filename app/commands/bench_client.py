"""`baton bench`'s client: stream each request to an OpenAI-compatible server over SSE at its
offset from the start and time it (TTFT, inter-token latencies, end to end), counting failures
rather than stopping at the first."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from baton.app.commands.bench_settings import BenchSettings
from baton.core.metrics.latency import tpot_ms

SSE_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(slots=True)
class BenchRequest:
    prompt: str | list[int]
    max_tokens: int
    ttft_ms: float | None = None  # per-class targets (--slo-classes)
    tpot_ms: float | None = None
    priority: int = 0
    arrival_s: float | None = None  # a trace's own arrival time


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""
    ttft_target_ms: float | None = None
    tpot_target_ms: float | None = None

    @property
    def tpot_ms(self) -> float:
        return tpot_ms(self.ttft_s, self.e2el_s, self.output_tokens)


async def benchmark(
    bench: BenchSettings,
    requests: list[BenchRequest],
    offsets: list[float],
    on_done: Callable[[], object] = lambda: None,
) -> tuple[list[RequestResult], float]:
    """Send `requests` at `offsets` seconds from the start; `on_done` after each one ends."""
    import httpx  # the client's only dependency beyond the standard library

    headers = {"Authorization": f"Bearer {bench.load.api_key}"} if bench.load.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(bench.timeout, connect=30.0)
    async with httpx.AsyncClient(
        base_url=bench.base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        model = await served_model(client, bench)
        limit = asyncio.Semaphore(bench.max_concurrency or len(requests))
        started = time.perf_counter()

        async def issue(request: BenchRequest, offset: float) -> RequestResult:
            await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
            async with limit:
                result = await send(client, bench, model, request)
            on_done()
            return result

        results = await asyncio.gather(
            *(issue(r, o) for r, o in zip(requests, offsets, strict=True))
        )
        return list(results), time.perf_counter() - started


class BaseURLError(ValueError):
    """--base-url leads to no server to benchmark: nothing listens there, the address or scheme
    is wrong, or it names no model."""


async def served_model(client, bench: BenchSettings) -> str:
    """--model, else the first model the server lists. The server is asked either way, before
    the run: a wrong --base-url is then one line at once, not every request's failure."""
    import httpx

    try:
        response = await client.get("/v1/models")
    except (httpx.HTTPError, httpx.InvalidURL) as error:
        raise BaseURLError(
            f"cannot reach a server at --base-url {bench.base_url} "
            f"({type(error).__name__}: {error}); start one there or point --base-url at it "
            "(http://HOST:PORT)"
        ) from None
    if bench.model:
        return bench.model
    if response.status_code != 200:
        raise BaseURLError(
            f"{bench.base_url}/v1/models answered HTTP {response.status_code}, so the model to "
            "ask for is unknown; name it with --model (or send --api-key if the server needs one)"
        )
    try:
        return response.json()["data"][0]["id"]
    except (ValueError, LookupError, TypeError):
        raise BaseURLError(
            f"{bench.base_url}/v1/models lists no model; name it with --model"
        ) from None


async def send(client, bench: BenchSettings, model: str, request: BenchRequest) -> RequestResult:
    body: dict = {
        "model": model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if bench.endpoint == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        path = "/v1/completions"
        body["prompt"] = request.prompt
    if bench.ignore_eos:
        body["ignore_eos"] = True
    if bench.send_slo and (request.ttft_ms is not None or request.tpot_ms is not None):
        body["slo"] = {"ttft_ms": request.ttft_ms, "tpot_ms": request.tpot_ms}
        body["priority"] = request.priority
    result = RequestResult(False, ttft_target_ms=request.ttft_ms, tpot_target_ms=request.tpot_ms)
    start = time.perf_counter()
    last = start
    chunks = 0
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in sse_lines(response):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                if not _has_text(chunk):
                    continue
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft_s = now - start
                else:
                    result.itl_s.append(now - last)
                last = now
                chunks += 1
    except Exception as error:  # a benchmark counts failures, it does not stop at the first
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.e2el_s = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.ok = chunks > 0
    if not result.ok:
        result.error = "the stream carried no text"
    return result


async def sse_lines(response) -> AsyncIterator[str]:
    """The lines of an SSE body, ended by CR, LF or CRLF alone, as the SSE format has it: httpx's
    `aiter_lines` also ends a line at U+2028 and the other Unicode separators, which a model
    may emit inside a JSON string (the chunk would then not parse)."""
    pending = ""
    async for text in response.aiter_text():
        *lines, pending = SSE_LINE_END.split(pending + text)
        for line in lines:
            yield line
    if pending:
        yield pending


def _has_text(chunk: dict) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content"):
            return True
    return False
