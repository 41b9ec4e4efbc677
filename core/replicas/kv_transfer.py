"""What moving a prefilled request's KV between replicas costs: its size, from the model's KV
shape, and its time, a fixed latency plus the bytes over the link's bandwidth. The router counts
it when it weighs sending a request through a prefill replica; the simulator charges it. And the
served transfers' totals, as `/v1/stats` and `/metrics` show them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVShape:
    """The KV cache one token holds: keys and values for every layer's KV heads."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * self.dtype_bytes

    @classmethod
    def parse(cls, text: str) -> KVShape:
        """`LAYERSxKV_HEADSxHEAD_DIMxDTYPE_BYTES`, e.g. `32x8x128x2` (Llama 3 8B in bf16)."""
        parts = text.lower().split("x")
        if len(parts) != 4 or not all(part.strip().isdigit() for part in parts):
            raise ValueError(
                f"bad KV shape {text!r}; write LAYERSxKV_HEADSxHEAD_DIMxDTYPE_BYTES, "
                "e.g. 32x8x128x2"
            )
        values = [int(part) for part in parts]
        if min(values) < 1:
            raise ValueError(f"every part of the KV shape must be >= 1, got {text!r}")
        return cls(*values)


@dataclass(frozen=True, slots=True)
class TransferCost:
    """A link between replicas: `latency_s` per transfer (setting it up, the hand-off's round
    trip) and `bandwidth_bytes_s`."""

    latency_s: float
    bandwidth_bytes_s: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or not self.bandwidth_bytes_s > 0:
            raise ValueError(
                "the KV transfer's latency must be >= 0 and its bandwidth > 0, got "
                f"{self.latency_s * 1000:g} ms and {self.bandwidth_bytes_s / 1e9:g} GB/s"
            )

    def seconds(self, num_bytes: int) -> float:
        return self.latency_s + num_bytes / self.bandwidth_bytes_s


@dataclass(frozen=True, slots=True)
class TransferTotals:
    """KV transfers (those a replica received, or all), failed ones included in `count`;
    `seconds` from the front end's asking for the read to the decode replica's write."""

    count: int = 0
    failed: int = 0
    num_bytes: int = 0
    seconds: float = 0.0

    def plus(self, num_bytes: int, seconds: float, failed: bool) -> TransferTotals:
        return TransferTotals(
            self.count + 1, self.failed + failed, self.num_bytes + num_bytes, self.seconds + seconds
        )

    @property
    def mean_ms(self) -> float:
        return self.seconds / self.count * 1000 if self.count else 0.0


@dataclass(frozen=True, slots=True)
class KVHandOff:
    """One request's move: prefilled on `prefill_replica`, decoded on `decode_replica`, its KV
    of `num_bytes` moved between `started` and `finished` (the front end's monotonic clock,
    which the replicas on its machine share); `error` says why it failed, if it did."""

    request_id: str
    prefill_replica: int
    decode_replica: int
    num_bytes: int
    started: float
    finished: float
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.finished - self.started
