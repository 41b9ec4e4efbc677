"""The `baton` command line: its subcommands and their flags, each made from a settings
dataclass's fields (baton.app.flags); `baton serve` starts the server."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from baton.app.commands.bench import add_bench_parser
from baton.app.commands.generate import GenerateSettings, generate
from baton.app.commands.kernels import add_kernels_parser
from baton.app.commands.simulate import add_simulate_parser
from baton.app.flags import FlagGroup
from baton.app.model_settings import ModelSettings
from baton.app.model_source import ModelSource, resolve_model
from baton.app.replicas.replica_settings import ReplicaModel, ReplicaSettings
from baton.app.request_defaults import read_request_defaults
from baton.app.settings import ServerSettings
from baton.core.config import EngineConfig
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.sampling_params import InvalidRequestError, SamplingParams
from baton.kernels.cpu_threads import prefer_passive_waits

MODEL = FlagGroup(ModelSettings, "model")
ENGINE = FlagGroup(EngineConfig, "engine")
SERVER = FlagGroup(ServerSettings, "server")
REPLICAS = FlagGroup(ReplicaSettings, "replicas")
# The modelled KV shape is the simulator's: a server moves its model's own KV.
DISAGGREGATION = FlagGroup(
    DisaggregationSettings,
    "prefill and decode apart",
    only=(
        "prefill_replicas",
        "disaggregate",
        "migrate",
        "kv_transfer_latency_ms",
        "kv_transfer_gbps",
    ),
)
GENERATE = FlagGroup(GenerateSettings, "prompts")
# Every request field that is a flag; a bare `baton generate` shows a few sentences, more
# tokens than a request's default.
SAMPLING = FlagGroup(SamplingParams, "sampling", defaults={"max_tokens": 64})


def engine_config_from(args: argparse.Namespace) -> EngineConfig:
    return ENGINE.build(args)


def server_settings_from(args: argparse.Namespace) -> ServerSettings:
    settings = SERVER.build(args)
    if not settings.api_keys and os.environ.get("BATON_API_KEY"):
        settings = dataclasses.replace(settings, api_keys=[os.environ["BATON_API_KEY"]])
    return settings


def serving_model(args: argparse.Namespace, source: ModelSource) -> ReplicaModel:
    """The engine `baton serve` with these flags builds (alone, or on each replica)."""
    model = MODEL.build(args)
    return ReplicaModel(
        str(source.folder), engine_config_from(args), model.device, model.dtype, model.load_format
    )


def serve(args: argparse.Namespace) -> int:
    from baton.app.http.server import bind_socket, configure_logging, log_startup, serve_engine

    settings = server_settings_from(args)
    replicas = REPLICAS.build(args)
    disaggregation = DISAGGREGATION.build(args)
    if disaggregation.prefill_replicas and disaggregation.prefill_replicas >= replicas.num_replicas:
        raise ValueError(
            f"--prefill-replicas {disaggregation.prefill_replicas} leaves no decode replica of "
            f"--replicas {replicas.num_replicas}; give fewer prefill replicas or more replicas"
        )
    configure_logging()  # before resolving: converting a GGUF file logs what it does
    sock = bind_socket(settings)
    # After the port is taken, so a busy port fails before a download too.
    source = resolve_model(MODEL.build(args))
    spec = serving_model(args, source)
    name = settings.served_model_name or source.name
    defaults = read_request_defaults(
        source.folder, settings.generation_config, settings.chat_template
    )
    if replicas.num_replicas > 1:
        replicas.confine_ray()
        from baton.app.replicas.replica_server import serve_replicas  # Ray loads only with replicas

        serve_replicas(spec, name, settings, replicas, sock, defaults, disaggregation)
        exit_without_teardown(0)
    start = time.perf_counter()
    engine = spec.build_engine()
    log_startup(engine, source.origin, time.perf_counter() - start)
    serve_engine(engine, name, settings, sock, defaults)
    exit_without_teardown(0)
    return 0


def run_generate(args: argparse.Namespace) -> int:
    return generate(
        MODEL.build(args), ENGINE.build(args), GENERATE.build(args), SAMPLING.build(args)
    )


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
    """The installed distribution's version and, for a git checkout (an editable install), the
    commit it runs, so a report names the code and not only the version it was cut from."""
    try:
        version = importlib.metadata.version("baton")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    commit = checkout_commit(Path(__file__).resolve().parents[1])
    return f"{version} ({commit})" if commit else version


def checkout_commit(root: Path) -> str | None:
    """`commit abc1234`, with `, modified` when tracked files differ from it, where `root` is a
    git checkout with git at hand; None for a wheel's install."""
    if not (root / ".git").exists():
        return None
    try:
        git = ["git", "-C", str(root)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], **GIT_RUN).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], **GIT_RUN)
    except (OSError, subprocess.SubprocessError):
        return None
    if not head:
        return None
    return f"commit {head}" + (", modified" if dirty.stdout.strip() else "")


# git's answer or nothing: a version string is never worth a hang or a traceback.
GIT_RUN = {"capture_output": True, "text": True, "timeout": 5, "check": False}


class VersionAction(argparse.Action):
    """`--version`, asked of git only when it is given, not on every command's start."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"baton {baton_version()}")
        parser.exit()


def add_model_positional(parser: argparse.ArgumentParser) -> None:
    """`baton serve ORG/NAME`, as `vllm serve` takes it: --model's value given without the
    flag (parse_args moves it there)."""
    parser.add_argument(
        "model_positional",
        nargs="?",
        metavar="MODEL",
        help="the model, as --model takes it: a checkpoint folder or a hub id (ORG/NAME)",
    )


def take_positional_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Move a positional MODEL into --model's place; both given and different is an error."""
    given = getattr(args, "model_positional", None)
    if given is None:
        return
    if args.model not in (given, ModelSettings().model):
        parser.error(f"the model is given twice, as MODEL ({given}) and --model ({args.model})")
    args.model = given


class Parser(argparse.ArgumentParser):
    """argparse, with a bad flag or value reported in one line: argparse's own error comes
    after the whole usage, dozens of lines for `baton serve` that bury the one that matters.
    Subcommands' parsers are of this class too (add_subparsers makes its parent's kind)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="baton", description="Baton LLM inference server")
    parser.add_argument("--version", action=VersionAction, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate offline from a checkpoint, no server")
    add_model_positional(gen)
    for group in (MODEL, ENGINE, SAMPLING, GENERATE):
        group.add_to(gen)
    gen.set_defaults(handler=run_generate)
    srv = commands.add_parser("serve", help="serve the OpenAI API, WebSockets and the chat UI")
    add_model_positional(srv)
    for group in (MODEL, ENGINE, SERVER, REPLICAS, DISAGGREGATION):
        group.add_to(srv)
    srv.set_defaults(handler=serve)
    add_simulate_parser(commands)
    add_bench_parser(commands)
    add_kernels_parser(commands)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    take_positional_model(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    prefer_passive_waits()
    args = parse_args(argv)
    try:
        return args.handler(args)
    except (InvalidRequestError, ValueError, FileNotFoundError) as error:
        print(f"baton: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
