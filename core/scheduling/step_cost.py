"""The step-cost model: how long a step takes, predicted from what it carries.

    seconds = base + prefill_tokens·a_p + decode_tokens·a_d + context_tokens·a_c
              + constrained_rows·a_g

(a constrained row is a position sampled under a grammar, whose mask the step fills).

Non-negative coefficients, fitted online: least squares over the measured steps, older ones
forgotten, constrained to be non-negative and pulled weakly toward an anchor (the warm-up
profile's fit), which decides the directions the recent steps say nothing about.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from baton.core.batch import Batch
from baton.core.step_stats import StepStats

NUM_FEATURES = 5
# How quickly old steps are forgotten: an effective memory of about 1 / (1 - λ) = 200 steps.
FORGETTING_FACTOR = 0.995
# Weight of the anchor, in steps' worth of evidence (a weak prior): it settles only the
# directions the traffic never varies (a chat-only load moves decodes and context together)
# and is outvoted by a single step in the others.
ANCHOR_WEIGHT = 1e-3
# Typical size of each feature (1, prefill tokens, decode tokens, context tokens, constrained
# rows).
FEATURE_SCALE = (1.0, 256.0, 64.0, 16384.0, 8.0)
# Weight of the newest error in the running mean of |error| / actual.
ERROR_EMA_WEIGHT = 0.05


@dataclass(slots=True, frozen=True)
class StepShape:
    """The composition of one step, as the cost model reads it."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_context_tokens: int = 0
    num_constrained_rows: int = 0

    def features(self) -> tuple[float, ...]:
        return (
            1.0,
            float(self.num_prefill_tokens),
            float(self.num_decode_tokens),
            float(self.num_context_tokens),
            float(self.num_constrained_rows),
        )

    @classmethod
    def of(cls, stats: StepStats) -> StepShape:
        # Verifying a draft token costs what computing a prompt token does: one more row.
        return cls(
            stats.num_prefill_tokens + stats.num_draft_tokens,
            stats.num_decode_tokens,
            stats.num_context_tokens,
            stats.num_constrained_rows,
        )

    @classmethod
    def of_batch(cls, batch: Batch) -> StepShape:
        """The shape of a batch about to run: its context is every sequence's length. Padding
        counts as work: a machine that pads computes it (a simulated one charges it)."""
        padding = batch.padding
        return cls(
            batch.num_prefill_tokens + batch.num_draft_tokens + padding.num_prefill_tokens,
            batch.num_decode_tokens + padding.num_decode_tokens,
            sum(seq.seq_len for seq in batch.sequences) + padding.num_context_tokens,
            batch.num_constrained_rows,
        )


@dataclass(slots=True)
class CostCoefficients:
    """Seconds per unit of each feature; the default is a rough guess for a small model, with
    no cost for a constrained row until steps that carry them are measured."""

    base_s: float = 0.005
    per_prefill_token_s: float = 1e-4
    per_decode_token_s: float = 2e-4
    per_context_token_s: float = 1e-7
    per_constrained_row_s: float = 0.0

    def as_tuple(self) -> tuple[float, ...]:
        return (
            self.base_s,
            self.per_prefill_token_s,
            self.per_decode_token_s,
            self.per_context_token_s,
            self.per_constrained_row_s,
        )

    @classmethod
    def parse(cls, text: str) -> CostCoefficients:
        """`base=0.01,prefill=1e-4,decode=5e-4,context=2e-7,grammar=1e-4` (any subset)."""
        names = {
            "base": "base_s",
            "prefill": "per_prefill_token_s",
            "decode": "per_decode_token_s",
            "context": "per_context_token_s",
            "grammar": "per_constrained_row_s",
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

    def predict_step(
        self, num_prefill: int, num_decode: int, num_context: int, num_constrained: int = 0
    ) -> float:
        return (
            self.base_s
            + self.per_prefill_token_s * num_prefill
            + self.per_decode_token_s * num_decode
            + self.per_context_token_s * num_context
            + self.per_constrained_row_s * num_constrained
        )

    def prefill_token_s(self) -> float:
        """Marginal seconds of one more prefill token (it is also read as context)."""
        return self.per_prefill_token_s + self.per_context_token_s


class StepCost(Protocol):
    """What a forecast needs of a cost model: a frozen fit (`CostCoefficients`, as published
    in the engine's stats) or the live one (`StepCostModel`, on the step thread)."""

    def predict_step(
        self, num_prefill: int, num_decode: int, num_context: int, num_constrained: int = 0
    ) -> float: ...

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
        # normal equations ill-conditioned.
        self._anchor = [c * s for c, s in zip(self.coefficients, FEATURE_SCALE, strict=True)]
        # Σ λ^age·x·xᵀ and Σ λ^age·x·seconds over the measured steps (scaled features).
        self._gram = [[0.0] * NUM_FEATURES for _ in range(NUM_FEATURES)]
        self._moment = [0.0] * NUM_FEATURES
        # The last fit's non-zero coefficients: the next fit tries them first.
        self._support: tuple[int, ...] = tuple(range(NUM_FEATURES))
        self.num_observations = 0
        self.last_error_ratio: float | None = None
        self.mean_abs_error_ratio: float | None = None

    def anchor(self) -> None:
        """The current fit becomes what the directions later steps do not vary return to
        (called after the warm-up profile, whose shapes span every feature)."""
        self._anchor = [c * s for c, s in zip(self.coefficients, FEATURE_SCALE, strict=True)]

    @property
    def current(self) -> CostCoefficients:
        return CostCoefficients(*self.coefficients)

    def predict(self, shape: StepShape) -> float:
        return sum(c * x for c, x in zip(self.coefficients, shape.features(), strict=True))

    def predict_step(
        self, num_prefill: int, num_decode: int, num_context: int, num_constrained: int = 0
    ) -> float:
        c = self.coefficients
        decode_s = c[2] * num_decode + c[4] * num_constrained
        return c[0] + c[1] * num_prefill + decode_s + c[3] * num_context

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
        x = [f / s for f, s in zip(features, FEATURE_SCALE, strict=True)]
        n = NUM_FEATURES
        for i in range(n):
            self._moment[i] = FORGETTING_FACTOR * self._moment[i] + x[i] * seconds
            row = self._gram[i]
            for j in range(n):
                row[j] = FORGETTING_FACTOR * row[j] + x[i] * x[j]
        theta = anchored_nnls(self._gram, self._moment, self._anchor, ANCHOR_WEIGHT, self._support)
        self._support = tuple(i for i, t in enumerate(theta) if t != 0.0)
        self.coefficients = [t / s for t, s in zip(theta, FEATURE_SCALE, strict=True)]


def anchored_nnls(
    gram: list[list[float]],
    moment: list[float],
    anchor: list[float],
    weight: float,
    hint: tuple[int, ...] = (),
) -> list[float]:
    """argmin over θ ≥ 0 of θᵀ(G + wI)θ − 2θᵀ(m + w·anchor): least squares on the forgotten
    steps plus a pull toward the anchor. The objective is strictly convex, so the optimum is
    the unconstrained solution on its support (set of non-zero coefficients) that meets the
    KKT conditions. The support `hint` (the last fit's: it rarely changes between steps) is
    tried first, then the full one; failing both, with five unknowns every support is tried
    and the best feasible one kept."""
    n = len(moment)
    matrix = [[gram[i][j] + (weight if i == j else 0.0) for j in range(n)] for i in range(n)]
    target = [moment[i] + weight * anchor[i] for i in range(n)]
    # The hint is usually the full support already: each is tried once.
    for support in dict.fromkeys((hint, tuple(range(n)))):
        theta = _optimum_on(matrix, target, support)
        if theta is not None:
            return theta
    best, best_value = [0.0] * n, 0.0
    for size in range(1, n):
        for support in itertools.combinations(range(n), size):
            theta = _solution_on(matrix, target, support)
            if theta is None:
                continue
            # At the optimum on its support the objective is −θᵀ·target.
            value = -sum(theta[i] * target[i] for i in range(n))
            if value < best_value:
                best, best_value = theta, value
    return best


def _solution_on(
    matrix: list[list[float]], target: list[float], support: tuple[int, ...]
) -> list[float] | None:
    """θ solving the problem on `support`, zeros elsewhere, if it is feasible (θ ≥ 0)."""
    solved = _solve(
        [[matrix[i][j] for j in support] for i in support], [target[i] for i in support]
    )
    if solved is None or min(solved) < 0:
        return None
    theta = [0.0] * len(target)
    for i, value in zip(support, solved, strict=True):
        theta[i] = value
    return theta


def _optimum_on(
    matrix: list[list[float]], target: list[float], support: tuple[int, ...]
) -> list[float] | None:
    """`_solution_on(support)` if it is the optimum: the gradient Mθ − t is ≥ 0 off the
    support (no zero coefficient wants to grow)."""
    if not support:
        return None
    theta = _solution_on(matrix, target, support)
    if theta is None:
        return None
    n = len(target)
    for i in range(n):
        if i not in support and sum(matrix[i][j] * theta[j] for j in range(n)) < target[i]:
            return None
    return theta


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None for a singular system."""
    n = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(rows[r][column]))
        if abs(rows[pivot][column]) < 1e-12:
            return None
        rows[column], rows[pivot] = rows[pivot], rows[column]
        for r in range(column + 1, n):
            factor = rows[r][column] / rows[column][column]
            for c in range(column, n + 1):
                rows[r][c] -= factor * rows[column][c]
    solution = [0.0] * n
    for r in range(n - 1, -1, -1):
        total = rows[r][n] - sum(rows[r][c] * solution[c] for c in range(r + 1, n))
        solution[r] = total / rows[r][r]
    return solution
