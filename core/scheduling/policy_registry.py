"""The scheduling policies by name: how the one `--scheduling-policy` names is built (its
choices are baton.core.config.POLICIES, which a test checks against these)."""

from __future__ import annotations

from baton.core.config import POLICIES
from baton.core.scheduling.policy import (
    FCFSPolicy,
    HRRNPolicy,
    LTRPolicy,
    PolicyContext,
    PriorityPolicy,
    SchedulingPolicy,
    SJFPolicy,
    StaticPolicy,
)
from baton.core.scheduling.slo_policy import SLOPolicy

POLICY_CLASSES: dict[str, type[SchedulingPolicy]] = {
    policy.name: policy
    for policy in (
        SLOPolicy,
        FCFSPolicy,
        PriorityPolicy,
        SJFPolicy,
        HRRNPolicy,
        LTRPolicy,
        StaticPolicy,
    )
}


def make_policy(name: str, context: PolicyContext | None = None) -> SchedulingPolicy:
    if name not in POLICY_CLASSES:
        raise ValueError(f"unknown scheduling policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICY_CLASSES[name](context)
