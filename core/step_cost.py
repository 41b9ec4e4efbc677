"""The step-cost model: how long a step takes, predicted from what it carries.

    seconds = base + prefill_tokens·a_p + decode_tokens·a_d + context_tokens·a_c

Non-negative coefficients, fitted online by recursive least squares with forgetting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from core.batch import Batch
from core.step_stats import StepStats

NUM_FEATURES = 4
# How quickly old steps are forgotten: an effective memory of about 1 / (1 - λ) = 200 steps.
FORGETTING_FACTOR = 0.995
# Initial covariance: a weak prior, so the first measurements dominate the default guess.
PRIOR_VARIANCE = 1e3
# Typical size of each feature (1, prefill tokens, decode tokens, context tokens).
FEATURE_SCALE = (1.0, 256.0, 64.0, 16384.0)
# Weight of the newest error in the running mean of |error| / actual.
ERROR_EMA_WEIGHT = 0.05


@dataclass(slots=True, frozen=True)
class StepShape:
    """The composition of one step, as the cost model reads it."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_context_tokens: int = 0

    def features(self) -> tuple[float, ...]:
        return (
            1.0,
            float(self.num_prefill_tokens),
            float(self.num_decode_tokens),
            float(self.num_context_tokens),
        )

    @classmethod
    def of(cls, stats: StepStats) -> StepShape:
        return cls(
            stats.num_prefill_tokens,
            stats.num_decode_tokens,
            stats.num_context_tokens,
        )

    @classmethod
    def of_batch(cls, batch: Batch) -> StepShape:
        """The shape of a batch about to run: its context is every sequence's length."""
        return cls(
            batch.num_prefill_tokens,
            batch.num_decode_tokens,
            sum(seq.seq_len for seq in batch.sequences),
        )


@dataclass(slots=True)
class CostCoefficients:
    """Seconds per unit of each feature; the default is a rough guess for a small model."""

    base_s: float = 0.005
    per_prefill_token_s: float = 1e-4
    per_decode_token_s: float = 2e-4
    per_context_token_s: float = 1e-7

    def as_tuple(self) -> tuple[float, ...]:
        return (
            self.base_s,
            self.per_prefill_token_s,
            self.per_decode_token_s,
            self.per_context_token_s,
        )

    @classmethod
    def parse(cls, text: str) -> CostCoefficients:
        """`base=0.01,prefill=1e-4,decode=5e-4,context=2e-7` (any subset)."""
        names = {
            "base": "base_s",
            "prefill": "per_prefill_token_s",
            "decode": "per_decode_token_s",
            "context": "per_context_token_s",
        }
        values = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            if key not in names or not value:
                raise ValueError(
                    f"bad cost coefficient {item!r}; write NAME=SECONDS with NAME one of "
                    f"{', '.join(names)}"
                )
            number = float(value)
            if number < 0 or not math.isfinite(number):
                raise ValueError(f"cost coefficient {key} must be a finite number >= 0")
            values[names[key]] = number
        return cls(**values)

    def predict(self, shape: StepShape) -> float:
        return sum(c * x for c, x in zip(self.as_tuple(), shape.features(), strict=True))

    def predict_step(self, num_prefill: int, num_decode: int, num_context: int) -> float:
        return (
            self.base_s
            + self.per_prefill_token_s * num_prefill
            + self.per_decode_token_s * num_decode
            + self.per_context_token_s * num_context
        )

    def prefill_token_s(self) -> float:
        """Marginal seconds of one more prefill token (it is also read as context)."""
        return self.per_prefill_token_s + self.per_context_token_s


class StepCost(Protocol):
    """What a forecast needs of a cost model: a frozen fit (`CostCoefficients`, as published
    in the engine's stats) or the live one (`StepCostModel`, on the step thread)."""

    def predict_step(self, num_prefill: int, num_decode: int, num_context: int) -> float: ...

    def prefill_token_s(self) -> float: ...


class StepCostModel:
    """Predicts step durations and refits itself to every measured step (a step listener).

    `last_error_ratio` is |predicted − measured| / measured for the newest step and
    `mean_abs_error_ratio` a running mean of it: the metrics report them so the model's
    accuracy is visible. Observing runs in the step thread; reading these floats from another
    thread is safe (each is replaced whole).
    """

    def __init__(self, initial: CostCoefficients | None = None) -> None:
        self.coefficients = list((initial or CostCoefficients()).as_tuple())
        # The fit runs on features scaled to about unit size: raw ones span six orders of
        # magnitude (one step vs a hundred thousand context tokens), which would leave the
        # covariance ill-conditioned.
        self._theta = [c * s for c, s in zip(self.coefficients, FEATURE_SCALE, strict=True)]
        self._covariance = [
            [PRIOR_VARIANCE if i == j else 0.0 for j in range(NUM_FEATURES)]
            for i in range(NUM_FEATURES)
        ]
        self.num_observations = 0
        self.last_error_ratio: float | None = None
        self.mean_abs_error_ratio: float | None = None

    @property
    def current(self) -> CostCoefficients:
        return CostCoefficients(*self.coefficients)

    def predict(self, shape: StepShape) -> float:
        return sum(c * x for c, x in zip(self.coefficients, shape.features(), strict=True))

    def predict_step(self, num_prefill: int, num_decode: int, num_context: int) -> float:
        c = self.coefficients
        return c[0] + c[1] * num_prefill + c[2] * num_decode + c[3] * num_context

    def prefill_token_s(self) -> float:
        """Marginal seconds of one more prefill token (it is also read as context)."""
        return self.coefficients[1] + self.coefficients[3]

    def observe(self, stats: StepStats) -> None:
        """Step listener: learn from one measured step."""
        self.update(StepShape.of(stats), stats.duration_s)

    def update(self, shape: StepShape, seconds: float) -> None:
        predicted = self.predict(shape)
        if seconds > 0:
            ratio = abs(predicted - seconds) / seconds
            self.last_error_ratio = ratio
            mean = self.mean_abs_error_ratio
            self.mean_abs_error_ratio = (
                ratio if mean is None else mean + ERROR_EMA_WEIGHT * (ratio - mean)
            )
        self._fit(shape.features(), seconds)
        self.num_observations += 1

    def _fit(self, features: Sequence[float], seconds: float) -> None:
        # Recursive least squares: gain k = P·x / (λ + xᵀ·P·x); θ += k·error; P = (P − k·xᵀP)/λ.
        x = [f / s for f, s in zip(features, FEATURE_SCALE, strict=True)]
        n = NUM_FEATURES
        theta = self._theta
        error = seconds - sum(theta[i] * x[i] for i in range(n))
        p = self._covariance
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        gain = [value / (FORGETTING_FACTOR + sum(x[i] * px[i] for i in range(n))) for value in px]
        for i in range(n):
            theta[i] += gain[i] * error
            # The estimate itself stays unconstrained (clipping it would break the recursion);
            # predictions use it clipped at zero, as a negative cost has no meaning.
            self.coefficients[i] = max(0.0, theta[i] / FEATURE_SCALE[i])
        # Steps of one unchanging shape carry no news about the other directions; dividing by λ
        # would inflate their variance without bound (wind-up), so forgetting stops at the prior.
        trace = sum(p[i][i] for i in range(n))
        forget = FORGETTING_FACTOR if trace < PRIOR_VARIANCE * n else 1.0
        for i in range(n):
            for j in range(n):
                p[i][j] = (p[i][j] - gain[i] * px[j]) / forget
