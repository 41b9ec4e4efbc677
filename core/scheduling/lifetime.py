"""How long a request holds its place in the batch: the mean seconds from its first token to
its finish, learned online from the requests that finish. A full batch frees one place every
mean lifetime / batch size (renewal), which is how the `slo` planner and admission's TTFT
forecast predict the wait for a place.
"""

from __future__ import annotations

from baton.core.request import Request

# Weight of the newest finished request in the running mean.
LIFETIME_EMA_WEIGHT = 0.05


class LifetimeMean:
    """`observe(request)` learns from a finished request; `mean_s` is 0 until one has."""

    def __init__(self) -> None:
        self.mean_s = 0.0
        self.num_observations = 0

    def observe(self, request: Request) -> None:
        """Finish listener: one that never produced a token held a place for no decode."""
        if request.first_token_time is None or request.finish_time is None:
            return
        self.add(request.finish_time - request.first_token_time)

    def add(self, lifetime_s: float) -> None:
        if self.num_observations == 0:
            self.mean_s = lifetime_s
        else:
            self.mean_s += LIFETIME_EMA_WEIGHT * (lifetime_s - self.mean_s)
        self.num_observations += 1
