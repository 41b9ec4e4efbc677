"""`baton serve`'s replica flags (`--replicas`, `--router`, `--ray-address`, each replica's
resources) and what each replica builds, apart from the Ray code that starts them: the CLI
parses them without importing Ray."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from baton.core.config import EngineConfig
from baton.core.replicas.router import DEFAULT_ROUTER, ROUTERS

if TYPE_CHECKING:
    from baton.core.engine import Engine


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """How `baton serve` builds its engine from its model flags: the single server's, or each
    replica's on its actor."""

    model: str
    config: EngineConfig
    device: str = "auto"
    dtype: str = "auto"
    load_format: str = "auto"
    # Seed the step-cost fit with a few synthetic steps first, as a single server does;
    # tests that need no informed first decisions skip it.
    profile_step_cost: bool = True

    def build_engine(self) -> Engine:
        from baton.app.llm import build_engine  # torch loads here, not with the CLI

        return build_engine(
            self.model,
            self.config,
            self.device,
            self.dtype,
            load_format=self.load_format,
            profile_step_cost=self.profile_step_cost,
        )


@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    """N engine replicas as Ray actors behind one front end; `ray_address` None starts a
    local Ray instance."""

    num_replicas: int = 1
    router: str = DEFAULT_ROUTER
    ray_address: str | None = None
    # Ray resources each replica's actor holds: CPU threads (its torch threads follow them),
    # and GPUs (one each on a GPU machine).
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    # How often Ray restarts a replica that died before giving up on it.
    max_restarts: int = 3

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.num_replicas}")
        if self.router not in ROUTERS:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.num_cpus <= 0 or self.num_gpus < 0 or self.max_restarts < 0:
            raise ValueError(
                "--replica-cpus must be > 0, --replica-gpus and --replica-max-restarts >= 0"
            )


def add_replica_args(parser: argparse.ArgumentParser) -> None:
    defaults = ReplicaSettings()
    parser.add_argument(
        "--replicas",
        type=int,
        default=defaults.num_replicas,
        help="engine replicas, as Ray actors behind this front end (needs baton[ray]); "
        "1 runs the engine in this process, without Ray",
    )
    parser.add_argument("--router", choices=ROUTERS, default=defaults.router)
    parser.add_argument(
        "--ray-address",
        default=None,
        help="an existing Ray cluster to start the replicas on (default: a local Ray)",
    )
    parser.add_argument("--replica-cpus", type=float, default=defaults.num_cpus)
    parser.add_argument("--replica-gpus", type=float, default=defaults.num_gpus)
    parser.add_argument("--replica-max-restarts", type=int, default=defaults.max_restarts)


def replica_settings_from(args: argparse.Namespace) -> ReplicaSettings:
    return ReplicaSettings(
        num_replicas=args.replicas,
        router=args.router,
        ray_address=args.ray_address,
        num_cpus=args.replica_cpus,
        num_gpus=args.replica_gpus,
        max_restarts=args.replica_max_restarts,
    )
