"""Scheduling policies: the scheduler asks them only "in what order?", "how much prefill this
step?" and "whom to preempt?"; budgets, blocks and preemption mechanics stay in the scheduler."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Sequence

from core.request import Request

UNLIMITED = sys.maxsize


class SchedulingPolicy(ABC):
    name: str

    @abstractmethod
    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        """Waiting (and preempted) requests in the order they should be admitted."""

    @abstractmethod
    def prefill_budget(self, running: Sequence[Request], token_budget: int, now: float) -> int:
        """Prefill tokens this step may carry, given the token budget left after decodes."""

    @abstractmethod
    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        """The running request to preempt when KV blocks run out."""


class FCFSPolicy(SchedulingPolicy):
    """First come, first served: admit in arrival order, preempt the latest arrival."""

    name = "fcfs"

    def order_waiting(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=_arrival)

    def prefill_budget(self, running: Sequence[Request], token_budget: int, now: float) -> int:
        return token_budget

    def choose_victim(self, candidates: Sequence[Request], now: float) -> Request:
        return max(candidates, key=_arrival)


class StaticPolicy(FCFSPolicy):
    """Classic static batching, the baseline: a batch forms only when the previous one has
    drained, its prompts are prefilled whole, and nothing joins it while it runs."""

    name = "static"

    def prefill_budget(self, running: Sequence[Request], token_budget: int, now: float) -> int:
        return 0 if running else UNLIMITED


def _arrival(request: Request) -> tuple[float, str]:
    return request.arrival_time, request.request_id


def make_policy(name: str) -> SchedulingPolicy:
    policies: dict[str, type[SchedulingPolicy]] = {"fcfs": FCFSPolicy, "static": StaticPolicy}
    if name not in policies:
        raise ValueError(f"unknown scheduling policy {name!r}; choose one of {sorted(policies)}")
    return policies[name]()
