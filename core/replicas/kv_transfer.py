"""What moving a prefilled request's KV between replicas costs: its size, from the model's KV
shape, and its time, a fixed latency plus the bytes over the link's bandwidth. The router counts
it when it weighs sending a request through a prefill replica; the simulator charges it, a
server fits it to the transfers it measures. And the served transfers' records and totals, as
traces, `/v1/stats` and `/metrics` show them."""

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


# How quickly a served link forgets old transfers: an effective memory of about 50 of them.
TRANSFER_FORGETTING = 0.98
# The prior link's weight, in transfers' worth of evidence: it settles alone only what the
# transfers measured never vary (all of one size leave latency and bandwidth apart unknown).
TRANSFER_PRIOR_WEIGHT = 1e-2
# Bytes per unit of the fit's size feature, so both coefficients are of similar scale.
MEGABYTE = 1e6


class TransferFit:
    """A served link's cost fitted to its measured transfers: seconds = latency + bytes /
    bandwidth by least squares, older transfers forgotten, pulled weakly toward `prior` (the
    `--kv-transfer-*` flags' link), as the step-cost model is fitted to steps."""

    def __init__(self, prior: TransferCost) -> None:
        self.prior = prior
        self.current = prior
        self.num_observations = 0
        self._anchor = (prior.latency_s, MEGABYTE / prior.bandwidth_bytes_s)
        # The weighted normal equations' sums over the features (1, megabytes).
        self._xx = [[0.0, 0.0], [0.0, 0.0]]
        self._xy = [0.0, 0.0]

    def observe(self, num_bytes: int, seconds: float) -> TransferCost:
        """Learn from one transfer; returns the link as fitted now."""
        size = num_bytes / MEGABYTE
        features = (1.0, size)
        for i in range(2):
            self._xy[i] = TRANSFER_FORGETTING * self._xy[i] + features[i] * seconds
            for j in range(2):
                self._xx[i][j] = TRANSFER_FORGETTING * self._xx[i][j] + features[i] * features[j]
        self.num_observations += 1
        w = TRANSFER_PRIOR_WEIGHT
        (a, b), (c, d) = self._xx
        a, d = a + w, d + w
        y0, y1 = self._xy[0] + w * self._anchor[0], self._xy[1] + w * self._anchor[1]
        determinant = a * d - b * c
        latency = (d * y0 - b * y1) / determinant
        per_megabyte = (a * y1 - c * y0) / determinant
        if per_megabyte <= 0:
            # Sizes that said nothing of the bandwidth: keep the prior's, fit the latency.
            per_megabyte = self._anchor[1]
            latency = (y0 - b * per_megabyte) / a
        self.current = TransferCost(max(0.0, latency), MEGABYTE / per_megabyte)
        return self.current


@dataclass(frozen=True, slots=True)
class TransferTotals:
    """KV transfers (those a replica received, or all), failed ones included in `count`;
    `seconds` from the front end's asking for the read to the decode replica's write;
    `migrations` of them moved running decodes (core/replicas/migration.py)."""

    count: int = 0
    failed: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    migrations: int = 0

    def plus(
        self, num_bytes: int, seconds: float, failed: bool, migration: bool = False
    ) -> TransferTotals:
        return TransferTotals(
            self.count + 1,
            self.failed + failed,
            self.num_bytes + num_bytes,
            self.seconds + seconds,
            self.migrations + migration,
        )

    @property
    def mean_ms(self) -> float:
        return self.seconds / self.count * 1000 if self.count else 0.0


@dataclass(frozen=True, slots=True)
class KVHandOff:
    """One request's move: prefilled on `prefill_replica`, decoded on `decode_replica`, its KV
    of `num_bytes` moved between `started` and `finished` (the front end's monotonic clock,
    which the replicas on its machine share); `error` says why it failed, if it did. With
    `migration`, a running decode moved from the first replica to the second."""

    request_id: str
    prefill_replica: int
    decode_replica: int
    num_bytes: int
    started: float
    finished: float
    error: str | None = None
    migration: bool = False

    @property
    def seconds(self) -> float:
        return self.finished - self.started
