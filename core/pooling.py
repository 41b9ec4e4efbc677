"""Embedding requests: how a prompt's final hidden states become one vector, in plain Python.

The executor hands back, per step, what each pooling request's chunk adds (core/batch.py
`ExecutorOutput.pooled`); the request accumulates it here and finishes with the L2-normalised
embedding once its prompt is computed.
"""

from __future__ import annotations

import enum
import math


class Pooling(str, enum.Enum):
    """`last`: the hidden state at the prompt's last position, what causal embedding models
    (Qwen3-Embedding, E5-Mistral) are trained to read. `mean`: the average over every position,
    which needs every position computed, so such a request never reads the prefix cache."""

    LAST = "last"
    MEAN = "mean"


class PooledState:
    """A request's running pool: the last chunk's final row, or the sum of every row so far."""

    __slots__ = ("pooling", "vector")

    def __init__(self, pooling: Pooling) -> None:
        self.pooling = pooling
        self.vector: list[float] | None = None

    def add(self, part: list[float]) -> None:
        """Take one step's part: the final row (last) or the chunk's sum of rows (mean)."""
        if self.pooling is Pooling.LAST or self.vector is None:
            self.vector = list(part)
        else:
            self.vector = [a + b for a, b in zip(self.vector, part, strict=True)]

    def reset(self) -> None:
        """Forget the parts: a preempted request computes its prompt again from the start."""
        self.vector = None

    def embedding(self) -> list[float]:
        """The pooled vector scaled to unit L2 norm (a mean's scale cancels in the division)."""
        assert self.vector is not None, "a request's embedding is read after its prompt ran"
        norm = math.sqrt(math.fsum(x * x for x in self.vector))
        # An all-zero state has no direction; it stays zero rather than becoming NaN.
        return [x / norm for x in self.vector] if norm > 0 else list(self.vector)
