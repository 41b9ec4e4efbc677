"""The settings of prefill and decode apart: how many replicas prefill, how requests are
placed, whether running decodes migrate, and the KV transfer's link and size; `baton
simulate`'s flags are the fields."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.replicas.disaggregation import DISAGGREGATE_MODES
from baton.core.replicas.kv_transfer import KVShape, TransferCost
from baton.core.replicas.migration import MIGRATE_MODES
from baton.core.setting import setting

# Llama 3 8B in bf16 (32 layers, 8 KV heads of 128): the model the default step costs are of.
DEFAULT_KV_SHAPE = "32x8x128x2"


@dataclass(frozen=True, slots=True)
class DisaggregationSettings:
    prefill_replicas: int = setting(
        0,
        help="replicas that prefill prompts, of --replicas; the others decode (0: every "
        "replica prefills and decodes its own requests)",
    )
    disaggregate: str = setting(
        "auto",
        choices=DISAGGREGATE_MODES,
        help="with --prefill-replicas: never (every request on one replica, any replica), "
        "always (every prompt on a prefill replica, decoded on a decode replica) or auto "
        "(chosen per request from its TTFT and TPOT targets)",
    )
    migrate: str = setting(
        "never",
        choices=MIGRATE_MODES,
        help="auto: move a running decode from a replica about to miss its TPOT targets or "
        "to run out of KV blocks to one with room, its KV as a prefilled prompt's (any "
        "layout); never: a decode stays where it started",
    )
    kv_transfer_latency_ms: float = setting(
        0.5,
        help="fixed cost of moving one request's KV between replicas (set-up and hand-off), in "
        "ms; baton serve starts from it and fits the link to the transfers it measures",
    )
    kv_transfer_gbps: float = setting(
        50.0,
        help="bandwidth of the link a request's KV moves over, in GB/s (50: a 400 Gb/s "
        "InfiniBand NIC per GPU; about 25 for PCIe 4.0 x16, 400 for NVLink 4)",
    )
    kv_shape: str = setting(
        DEFAULT_KV_SHAPE,
        metavar="LxHxDxB",
        help="the modelled KV cache per token: layers x KV heads x head dim x dtype bytes "
        "(the default is Llama 3 8B in bf16, the default step costs' model)",
    )

    def __post_init__(self) -> None:
        if self.prefill_replicas < 0:
            raise ValueError(f"--prefill-replicas must be >= 0, got {self.prefill_replicas}")
        self.transfer()
        KVShape.parse(self.kv_shape)

    def transfer(self) -> TransferCost:
        return TransferCost(self.kv_transfer_latency_ms / 1000, self.kv_transfer_gbps * 1e9)

    @property
    def kv_bytes_per_token(self) -> int:
        return KVShape.parse(self.kv_shape).bytes_per_token
