"""Starting `baton serve --replicas N`: Ray (local, or the cluster at `--ray-address`), N
engine replica actors with their resources and restart budget, and the front end's
`ReplicatedEngine` over them, in the roles `--prefill-replicas` gives. Imported only with more
than one replica: Ray is optional."""

from __future__ import annotations

import socket

import ray

from baton.app.http.server import serve_front_end
from baton.app.replicas.ray_replica import EngineReplica
from baton.app.replicas.replica_settings import ReplicaModel, ReplicaSettings
from baton.app.replicas.replicated_engine import ReplicatedEngine
from baton.app.request_defaults import NO_REQUEST_DEFAULTS, RequestDefaults
from baton.app.settings import ServerSettings
from baton.core.replicas.disaggregation_settings import DisaggregationSettings
from baton.core.request_validator import RequestValidator
from baton.core.text.tokenizer import Tokenizer

# Calls a replica serves at once: its step stream, and submits and aborts beside it.
REPLICA_CONCURRENCY = 8


def start_replicas(
    spec: ReplicaModel,
    settings: ReplicaSettings,
    max_queued_requests: int,
    disaggregation: DisaggregationSettings | None = None,
    **ray_init: object,
) -> ReplicatedEngine:
    """Start the replicas and wait until each has built its engine; `ray_init` goes to
    `ray.init` when this process has not joined Ray yet (tests bound its CPUs)."""
    if not ray.is_initialized():
        ray.init(address=settings.ray_address, include_dashboard=False, **ray_init)
    actor_class = ray.remote(EngineReplica).options(
        num_cpus=settings.num_cpus,
        num_gpus=settings.num_gpus,
        max_restarts=settings.max_restarts,
        max_concurrency=REPLICA_CONCURRENCY,
    )
    actors = [actor_class.remote(index, spec) for index in range(settings.num_replicas)]
    infos = ray.get([actor.info.remote() for actor in actors])
    # Replicas of one model differ at most in cache size (sized from each one's memory): the
    # smallest cache's limits pass only what every replica can serve, wherever it is routed.
    limits = min((info.limits for info in infos), key=lambda limits: limits.num_kv_blocks)
    validator = RequestValidator(spec.config, limits)
    return ReplicatedEngine(
        actors,
        infos,
        spec.config,
        settings.router,
        max_queued_requests,
        validator,
        stall_timeout_s=settings.stall_timeout_s,
        disaggregation=disaggregation,
    )


def serve_replicas(
    spec: ReplicaModel,
    model_name: str,
    settings: ServerSettings,
    replicas: ReplicaSettings,
    sock: socket.socket | None = None,
    defaults: RequestDefaults = NO_REQUEST_DEFAULTS,
    disaggregation: DisaggregationSettings | None = None,
) -> None:
    """`baton serve --replicas N`: start the replicas, then the one front end; blocks."""
    engine = start_replicas(spec, replicas, settings.max_queued_requests, disaggregation)
    try:
        tokenizer = Tokenizer.from_pretrained(spec.model)
        serve_front_end(engine, tokenizer, model_name, settings, sock, defaults)
    finally:
        # The CLI ends without the interpreter's teardown, so Ray's exit hook would not run:
        # a local Ray this process started would outlive it.
        ray.shutdown()
