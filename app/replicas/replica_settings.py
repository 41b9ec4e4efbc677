"""`baton serve`'s replica flags (`--replicas`, `--router`, `--ray-address`, each replica's
resources, liveness) and what each replica builds, apart from the Ray code that starts them: the
CLI parses them without importing Ray."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from baton.core.config import EngineConfig
from baton.core.replicas.router import DEFAULT_ROUTER, ROUTERS
from baton.core.setting import setting

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

    num_replicas: int = setting(
        1,
        name="--replicas",
        help="engine replicas behind the router: in baton serve, Ray actors behind this front "
        "end (needs baton[ray]; 1 runs the engine in this process, without Ray); in baton "
        "simulate, simulated engines, and --load is of their combined saturation",
    )
    router: str = setting(
        DEFAULT_ROUTER,
        choices=ROUTERS,
        help="how the front end picks a request's replica: slo (lowest predicted TTFT), "
        "least-loaded (fewest tokens waiting and running), prefix (likeliest to hold the "
        "prompt's first blocks) or round-robin",
    )
    ray_address: str | None = setting(
        None,
        help="an existing Ray cluster to start the replicas on",
        default_text="a local Ray",
    )
    ray_all_interfaces: bool = setting(
        False,
        help="let the local Ray that --replicas starts listen on every interface, as Ray does "
        "on its own (so other machines can join it); without it Ray's processes listen on "
        "loopback only",
    )
    # Ray resources each replica's actor holds: CPU threads (its torch threads follow them),
    # and GPUs (one each on a GPU machine).
    num_cpus: float = setting(
        1.0, name="--replica-cpus", help="CPU threads each replica's actor holds"
    )
    num_gpus: float = setting(0.0, name="--replica-gpus", help="GPUs each replica's actor holds")
    max_restarts: int = setting(
        3,
        name="--replica-max-restarts",
        help="how often Ray restarts a replica that died before giving up on it",
    )
    stall_timeout_s: float = setting(
        60.0,
        name="--replica-stall-timeout",
        help="seconds a replica with requests in hand may send no step before it counts as "
        "hung: its requests are retried elsewhere (none sent yet) or ended with an error, and "
        "it is restarted",
    )

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.num_replicas}")
        if self.router not in ROUTERS:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.num_cpus <= 0 or self.num_gpus < 0 or self.max_restarts < 0:
            raise ValueError(
                "--replica-cpus must be > 0, --replica-gpus and --replica-max-restarts >= 0"
            )
        if not 0 < self.stall_timeout_s < math.inf:
            raise ValueError(
                "--replica-stall-timeout must be a positive number of seconds, "
                f"got {self.stall_timeout_s}"
            )

    def confine_ray(self) -> None:
        """Keep the local Ray this process will start on loopback, unless the flags say
        otherwise; call it before Ray is imported, which reads the setting then. Ray's switch
        for a one-machine Ray is named after the platforms where it is the default."""
        if self.ray_address is None and not self.ray_all_interfaces:
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
