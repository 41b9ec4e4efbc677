"""The `baton` command line: `baton generate` runs the engine offline on a checkpoint."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
import time
from pathlib import Path

from baton.app.api.tool_parsers import PARSERS
from baton.app.commands.bench import add_bench_parser
from baton.app.commands.simulate import add_simulate_parser
from baton.app.replicas.replica_settings import (
    ReplicaModel,
    add_replica_args,
    replica_settings_from,
)
from baton.app.settings import EVENT_LOOPS, METRICS_STYLES, ServerSettings
from baton.core.config import KV_CACHE_DTYPES, MODEL_IMPLS, POLICIES, QUANTIZATIONS, EngineConfig
from baton.core.kv_cache.host_memory import parse_memory_size
from baton.core.sampling_params import InvalidRequestError, SamplingParams

# The checkpoint tools/train_demo.py trained, shipped inside the package (docs/demo_model.md), so
# `baton serve` answers with no arguments.
DEMO_MODEL = Path(__file__).resolve().parent / "demo_model"
DEMO_MODEL_NAME = "baton-demo"


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every subcommand that builds an engine (names fixed by DESIGN.md)."""
    defaults = EngineConfig()
    parser.add_argument(
        "--model",
        default=str(DEMO_MODEL),
        help="Hugging Face checkpoint folder (default: the built-in demo model)",
    )
    parser.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="dummy: random weights from config.json alone (--model may be a config file)",
    )
    parser.add_argument(
        "--model-impl",
        choices=MODEL_IMPLS,
        default=defaults.model_impl,
        help="auto: Baton's native model where it has one, else transformers' modeling code over "
        "Baton's paged cache; native or transformers forces one",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=defaults.quantization,
        help="int8: weight-only int8 with per-channel scales, quantized at load from the float "
        "checkpoint (native model on the CPU only)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=defaults.kv_cache_dtype,
        help="auto: the KV cache in the model's dtype; float16: keys and values stored in "
        "float16, half the memory and half the bytes each decode step reads (CPU only; outputs "
        "may differ slightly from float32's)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto"
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument(
        "--kv-cache-memory",
        default=None,
        metavar="SIZE",
        help="size the KV cache from this budget: bytes, or with a unit (512MiB, 2GiB); default "
        "on the CPU: --max-num-seqs sequences of --max-model-len, at most 2 GiB and a quarter "
        "of available memory; on CUDA: --gpu-memory-utilization; --num-kv-blocks wins",
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=defaults.gpu_memory_utilization
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_prefix_caching,
    )
    parser.add_argument("--scheduling-policy", choices=POLICIES, default=defaults.scheduling_policy)
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=defaults.max_wait_ms,
        help="starvation bound, under every policy but static: no request waits longer for its "
        "first token (one about to pass it preempts the running request that loses least)",
    )
    parser.add_argument(
        "--max-preemptions",
        type=int,
        default=defaults.max_preemptions,
        help="a request preempted this many times is never preempted again",
    )
    parser.add_argument(
        "--slo-admission-factor",
        type=float,
        default=defaults.slo_admission_factor,
        help="with --scheduling-policy slo, no request with a TTFT target starts later than "
        "this factor times its target: one predicted to is refused at arrival (429), one that "
        "has waited that long is refused then (0: off)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="no CUDA graphs: run decode steps eagerly too (for debugging and comparison)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_bytes=(
            parse_memory_size(args.kv_cache_memory, "--kv-cache-memory")
            if args.kv_cache_memory is not None
            else None
        ),
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        max_wait_ms=args.max_wait_ms,
        max_preemptions=args.max_preemptions,
        slo_admission_factor=args.slo_admission_factor,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        model_impl=args.model_impl,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    defaults = SamplingParams()
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--min-p", type=float, default=defaults.min_p)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--sampling-seed", type=int, default=None, help="per-request seed")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")


def sampling_params_from(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.sampling_seed,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )


def generate(args: argparse.Namespace) -> int:
    from baton.app.llm import LLM

    params = sampling_params_from(args)
    llm = LLM(
        args.model,
        device=args.device,
        dtype=args.dtype,
        load_format=args.load_format,
        config=engine_config_from(args),
    )
    prompts = (
        [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in args.prompt]
        if args.chat
        else args.prompt
    )
    stream = len(prompts) == 1

    def show(output):
        if stream:
            sys.stdout.write(output.new_text)
            sys.stdout.flush()

    start = time.perf_counter()
    results = llm.generate(prompts, params, on_output=show)
    elapsed = time.perf_counter() - start
    for result in results:
        if not stream:
            print(f"--- {result.request_id}\n{result.text}")
        if result.error:
            print(f"\nerror: {result.error}", file=sys.stderr)
    num_tokens = sum(len(r.token_ids) for r in results)
    print(
        f"\n[{num_tokens} tokens in {elapsed:.2f} s, {num_tokens / elapsed:.1f} tokens/s, "
        f"finish: {', '.join(str(r.finish_reason.value) for r in results)}]",
        file=sys.stderr,
    )
    return 0


def add_server_args(parser: argparse.ArgumentParser) -> None:
    defaults = ServerSettings()
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require this bearer key (repeatable; or set BATON_API_KEY)",
    )
    parser.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated origins allowed for CORS and WebSocket upgrades",
    )
    parser.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated Host names to answer (*.example.org for subdomains, * for any); "
        "on a loopback --host, loopback names are always answered and nothing else by default",
    )
    parser.add_argument("--max-queued-requests", type=int, default=defaults.max_queued_requests)
    parser.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout_s)
    parser.add_argument(
        "--max-header-bytes",
        type=int,
        default=defaults.max_header_bytes,
        help="answer 431 to a request whose target and header fields are larger",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=defaults.header_timeout_s,
        help="seconds a request's headers may take to arrive (408 and close after)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=defaults.body_timeout_s,
        help="seconds a request's body may take to arrive once its headers have (408 and close "
        "after); streamed responses are not limited",
    )
    parser.add_argument("--ttft-slo-ms", type=float, default=None)
    parser.add_argument("--tpot-slo-ms", type=float, default=None)
    parser.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        help="export request traces over OTLP/HTTP to this URL (e.g. http://localhost:4318)",
    )
    parser.add_argument(
        "--trace-console", action="store_true", help="print request traces to stdout (debugging)"
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=sorted(PARSERS),
        default=None,
        help="the format the model writes tool calls in, for tool_choice 'auto' (default: "
        "read off the chat template: <tool_call> is hermes, [TOOL_CALLS] mistral, "
        "<|python_tag|> llama3_json)",
    )
    parser.add_argument(
        "--metrics-style",
        choices=METRICS_STYLES,
        default=defaults.metrics_style,
        help="names on /metrics: baton: (Baton's), vllm: (vLLM's names and labels, so vLLM's "
        "Grafana dashboards work unchanged; series vLLM lacks keep baton:), or both",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=defaults.event_loop,
        help="the event loop serving HTTP and WebSockets: asyncio's own (default: it lets the "
        "step thread run while a token is written to a socket) or uvloop",
    )


def server_settings_from(args: argparse.Namespace) -> ServerSettings:
    api_keys = list(args.api_key or [])
    if not api_keys and os.environ.get("BATON_API_KEY"):
        api_keys = [os.environ["BATON_API_KEY"]]
    return ServerSettings(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        api_keys=api_keys,
        allowed_origins=[o.strip() for o in args.allowed_origins.split(",") if o.strip()],
        allowed_hosts=[h.strip() for h in args.allowed_hosts.split(",") if h.strip()],
        max_queued_requests=args.max_queued_requests,
        shutdown_timeout_s=args.shutdown_timeout,
        max_header_bytes=args.max_header_bytes,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        ttft_slo_ms=args.ttft_slo_ms,
        tpot_slo_ms=args.tpot_slo_ms,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        trace_console=args.trace_console,
        tool_call_parser=args.tool_call_parser,
        metrics_style=args.metrics_style,
        event_loop=args.event_loop,
    )


def served_model_name(model: str) -> str:
    """The name /v1/models reports when --served-model-name is not given."""
    path = Path(model).resolve()
    return DEMO_MODEL_NAME if path == DEMO_MODEL else path.name


def serving_model(args: argparse.Namespace) -> ReplicaModel:
    """The engine `baton serve` with these flags builds (alone, or on each replica)."""
    return ReplicaModel(
        args.model, engine_config_from(args), args.device, args.dtype, args.load_format
    )


def serve(args: argparse.Namespace) -> int:
    from baton.app.http.server import bind_socket, configure_logging, log_startup, serve_engine

    settings = server_settings_from(args)
    replicas = replica_settings_from(args)
    name = settings.served_model_name or served_model_name(args.model)
    configure_logging()
    sock = bind_socket(settings)
    if replicas.num_replicas > 1:
        from baton.app.replicas.replica_server import serve_replicas  # Ray loads only with replicas

        serve_replicas(serving_model(args), name, settings, replicas, sock)
        exit_without_teardown(0)
    start = time.perf_counter()
    engine = serving_model(args).build_engine()
    log_startup(engine, args.model, time.perf_counter() - start)
    serve_engine(engine, name, settings, sock)
    exit_without_teardown(0)
    return 0


def exit_without_teardown(code: int) -> None:
    """End a server that has shut down cleanly (streams drained, spans flushed) without the
    interpreter's teardown, which has nothing left to do for it: freeing torch's objects would
    take seconds past --shutdown-timeout, and the objects the step thread's frozen GC
    generation keeps (baton.core.step_loop) would make triton, which torch imports where it is
    installed, print nanobind's "leaked instances" report."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def baton_version() -> str:
    """The installed distribution's version; a source tree that was never installed has none."""
    try:
        return importlib.metadata.version("baton")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Baton LLM inference server")
    parser.add_argument("--version", action="version", version=f"baton {baton_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate offline from a checkpoint, no server")
    add_engine_args(gen)
    add_sampling_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="prompt (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")
    gen.set_defaults(handler=generate)
    srv = commands.add_parser("serve", help="serve the OpenAI API, WebSockets and the chat UI")
    add_engine_args(srv)
    add_server_args(srv)
    add_replica_args(srv)
    srv.set_defaults(handler=serve)
    add_simulate_parser(commands)
    add_bench_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (InvalidRequestError, ValueError, FileNotFoundError) as error:
        print(f"baton: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
