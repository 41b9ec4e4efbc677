"""The output-length predictor: how many tokens a request will generate, learned online from
the requests that finished, as the mean fraction of `max_tokens` used per bucket of
(log2 prompt length, log2 `max_tokens`), shrunk toward the global mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.request import FinishReason, Request

# Samples a bucket needs before its own mean outweighs the global one.
SHRINKAGE = 4.0
# Weight of the newest error in the running mean of |error| / actual.
ERROR_EMA_WEIGHT = 0.05


@dataclass(slots=True)
class _Mean:
    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1


class LengthPredictor:
    """`predict(request)` → expected output tokens; `observe(request)` learns from a finished one.

    Accuracy: `mean_abs_error_ratio` is the running mean of |predicted − actual| / actual over
    finished requests, predicted as they arrived (before the predictor saw them).
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple[int, int], _Mean] = {}
        self._global = _Mean()
        self.num_observations = 0
        self.mean_abs_error_ratio: float | None = None

    def predict(self, request: Request) -> float:
        max_tokens = request.sampling_params.max_tokens or 1
        return self.predict_length(request.num_prompt_tokens, max_tokens)

    def predict_length(self, num_prompt_tokens: int, max_tokens: int) -> float:
        bucket = self._buckets.get(_bucket(num_prompt_tokens, max_tokens))
        prior = self._global.total / self._global.count if self._global.count else 1.0
        if bucket is None or not bucket.count:
            fraction = prior
        else:
            fraction = (bucket.total + SHRINKAGE * prior) / (bucket.count + SHRINKAGE)
        return max(1.0, fraction * max_tokens)

    def observe(self, request: Request) -> None:
        """Finish listener: learn from one request that ended on its own."""
        if request.finish_reason not in (FinishReason.STOP, FinishReason.LENGTH):
            return
        max_tokens = request.sampling_params.max_tokens or 1
        actual = request.num_output_tokens
        if actual < 1:
            return
        predicted = self.predict_length(request.num_prompt_tokens, max_tokens)
        ratio = abs(predicted - actual) / actual
        mean = self.mean_abs_error_ratio
        self.mean_abs_error_ratio = (
            ratio if mean is None else mean + ERROR_EMA_WEIGHT * (ratio - mean)
        )
        fraction = min(1.0, actual / max_tokens)
        self._buckets.setdefault(_bucket(request.num_prompt_tokens, max_tokens), _Mean()).add(
            fraction
        )
        self._global.add(fraction)
        self.num_observations += 1


def _bucket(num_prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
    return max(1, num_prompt_tokens).bit_length(), max(1, max_tokens).bit_length()
