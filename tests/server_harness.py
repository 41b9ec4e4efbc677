"""Run a real Baton server (uvicorn on the event loop its settings name, loopback, free port)
inside the test process, on its own thread, so tests can drive it with httpx, the openai client
and websockets and still reach into the engine (fault injection, KV usage)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import uvloop

from baton.app.engine.async_engine import AsyncEngine
from baton.app.http.graceful_shutdown import BatonServer
from baton.app.http.server import bind_socket, create_app, uvicorn_config
from baton.app.llm import build_engine, build_simulated_engine
from baton.app.request_defaults import NO_REQUEST_DEFAULTS, RequestDefaults
from baton.app.settings import ServerSettings
from baton.app.state import ServerState
from baton.core.batch import ExecutorOutput
from baton.core.config import EngineConfig
from baton.core.engine import Engine
from baton.core.simulation.simulated_executor import SimulatedExecutor
from baton.core.text.tokenizer import Tokenizer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_engine(checkpoint: Path, **config) -> Engine:
    """The real CPU engine on a checkpoint; `config` are EngineConfig fields."""
    return build_engine(checkpoint, EngineConfig(**config), device="cpu")


def simulated_engine(
    tokenizer_dir: Path, executor=None, max_model_len: int = 4096, **config
) -> Engine:
    """An engine whose executor returns tokens instantly: only server and scheduler cost."""
    tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
    return build_simulated_engine(
        tokenizer, EngineConfig(**config), executor, max_model_len=max_model_len
    )


def paced_executor(num_kv_blocks: int, vocab_size: int, step_s: float) -> SimulatedExecutor:
    """Instant tokens after `step_s` of real time per step, so a request can be caught in
    prefill or decode."""
    return SimulatedExecutor(
        num_kv_blocks, 16, vocab_size, on_batch=lambda _batch: time.sleep(step_s)
    )


# Prompts starting with this token id make a ControlledExecutor raise: an injected fault.
FAULTY_TOKEN = 99


class ControlledExecutor(SimulatedExecutor):
    """Instant tokens; steps wait while `running` is cleared (so requests stay queued), and a
    batch holding a prompt that starts with FAULTY_TOKEN raises."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.running = threading.Event()
        self.running.set()
        # Sizes of the batches that raised, so tests can tell whom a fault shared a step with.
        self.faulted_batch_sizes: list[int] = []

    def execute(self, batch):
        self.running.wait(timeout=10)
        if any(seq.all_token_ids[0] == FAULTY_TOKEN for seq in batch.sequences):
            self.faulted_batch_sizes.append(len(batch))
            raise RuntimeError("injected fault")
        return super().execute(batch)


class ScriptedExecutor(SimulatedExecutor):
    """Instant tokens: every request answers `answer` (token ids, which a test may change
    between requests), then EOS. `prompts` keeps the prompt ids each request was given."""

    def __init__(self, vocab_size: int, eos_token_id: int, answer: Sequence[int] = ()) -> None:
        super().__init__(256, 16, vocab_size, eos_token_id=eos_token_id)
        self.answer = list(answer)
        self.prompts: dict[str, list[int]] = {}

    def execute(self, batch):
        sampled = []
        for seq in batch.sequences:
            self.prompts.setdefault(seq.request_id, seq.all_token_ids[: seq.num_prompt_tokens])
            if seq.sample:
                position = seq.num_output_tokens
                done = position >= len(self.answer)
                sampled.append(self.eos_token_id if done else self.answer[position])
        return ExecutorOutput(sampled)


@contextlib.contextmanager
def running_server(
    engine: Engine,
    model_name: str = "tiny",
    span_exporter=None,
    defaults: RequestDefaults = NO_REQUEST_DEFAULTS,
    **settings,
) -> Iterator[ServerState]:
    """Serve `engine` on a free loopback port; yields the state (`state.settings.port`).
    A `span_exporter` receives every request's spans as they end; `defaults` fill what requests
    leave out, as --generation-config and --chat-template make them."""
    # A free port unless the test names one (to start a server again where one was).
    server_settings = ServerSettings(**{"port": free_port(), **settings})
    async_engine = AsyncEngine(engine, server_settings.max_queued_requests)
    with running_front_end(
        async_engine, engine.tokenizer, model_name, span_exporter, server_settings, defaults
    ) as state:
        yield state


@contextlib.contextmanager
def running_front_end(
    engine,
    tokenizer: Tokenizer,
    model_name: str,
    span_exporter,
    settings: ServerSettings,
    defaults: RequestDefaults = NO_REQUEST_DEFAULTS,
) -> Iterator[ServerState]:
    """Serve the front end over `engine` (an `AsyncEngine`, or replicas behind its interface)
    with `settings`; yields the state."""
    state = ServerState(
        engine=engine,
        tokenizer=defaults.tokenizer_for(tokenizer),
        model_name=model_name,
        settings=settings,
        sampling_defaults=defaults.sampling,
    )
    app = create_app(state, span_exporter=span_exporter)
    server = BatonServer(uvicorn_config(app, settings), state)
    # Tests read the server's connections (their unsent bytes) through the state.
    state.server = server
    run = uvloop.run if settings.event_loop == "uvloop" else asyncio.run
    # On a socket bound as `baton serve` binds it, so connections are the ones it accepts.
    serving = server.serve(sockets=[bind_socket(settings)])
    thread = threading.Thread(target=run, args=(serving,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def served_replicas(checkpoint: Path, engine: dict, apart) -> Iterator[tuple[str, object, object]]:
    """Two replicas of `checkpoint` (EngineConfig fields `engine`, roles and moves as the
    `DisaggregationSettings` `apart` says) on a local Ray, a 3 s stall timeout, behind a front end
    on loopback; yields (url, the replicated engine, its span exporter)."""
    # Imported here: a test module without replicas needs neither Ray nor its extras.
    import ray
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from baton.app.replicas.replica_server import start_replicas
    from baton.app.replicas.replica_settings import ReplicaModel, ReplicaSettings

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        spec = ReplicaModel(
            str(checkpoint), EngineConfig(**engine), device="cpu", profile_step_cost=False
        )
        replicas = ReplicaSettings(num_replicas=2, max_restarts=3, stall_timeout_s=3.0)
        replicated = start_replicas(spec, replicas, 64, apart)
        spans = InMemorySpanExporter()
        tokenizer = Tokenizer.from_pretrained(checkpoint)
        with running_front_end(
            replicated, tokenizer, "tiny", spans, ServerSettings(port=free_port())
        ) as state:
            yield base_url(state), replicated, spans
    finally:
        ray.shutdown()


def base_url(state: ServerState) -> str:
    return f"http://127.0.0.1:{state.settings.port}"


def wait_until_healthy(
    process: subprocess.Popen, port: int, log: Path, timeout_s: float = 300.0
) -> None:
    """Until a `baton serve` child answers /health with 200; its log if it exits first. The
    default is generous: the first run on a machine builds the C++ CPU kernels."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "baton serve did not come up"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
