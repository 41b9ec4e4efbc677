"""How often draft tokens are accepted: per request (what the planner reads, with the engine's
rate as its prior) and in total (vLLM's spec_decode counters, /v1/stats)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Draft tokens' worth of evidence the prior counts for in a request's own rate.
PRIOR_WEIGHT = 4.0
# The engine's rate before any draft has been verified.
INITIAL_RATE = 0.5
# Each step a request decodes without drafts, its evidence fades toward the prior: a request
# that stopped speculating after misses tries again later (its text may have turned repetitive).
FADE = 0.9


@dataclass(slots=True)
class DraftRecord:
    """One request's verified drafts: exact counts for its span, faded ones for its rate."""

    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    _drafted: float = 0.0
    _accepted: float = 0.0

    def rate(self, prior: float) -> float:
        """The chance its next draft token is accepted, its evidence beside the prior's."""
        return (self._accepted + PRIOR_WEIGHT * prior) / (self._drafted + PRIOR_WEIGHT)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        self._drafted += num_drafted
        self._accepted += num_accepted

    def fade(self) -> None:
        self._drafted *= FADE
        self._accepted *= FADE


@dataclass(slots=True, frozen=True)
class SpecDecodeStats:
    """Totals since start, as vLLM counts them: drafts (sequences that carried draft tokens in
    a step), draft tokens, accepted ones, and accepted ones by position in their draft."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        if not self.num_draft_tokens:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a speculating sequence gained per step: its accepted drafts and the one
        sampled after them."""
        if not self.num_drafts:
            return None
        return 1 + self.num_accepted_tokens / self.num_drafts


@dataclass(slots=True)
class SpecDecodeCounters:
    """The engine's running totals; `snapshot` is what it publishes. The prior is kept apart
    for greedy and sampled requests: a sampled row accepts a right guess only with the
    target's probability of it, so their rates differ by far more than requests' do."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    # (draft tokens, accepted) of greedy requests, then of sampled ones.
    _by_greedy: dict[bool, list[int]] = field(default_factory=lambda: {True: [0, 0], False: [0, 0]})

    def prior_rate(self, greedy: bool) -> float:
        """The engine's acceptance rate so far for greedy (or sampled) requests, starting from
        INITIAL_RATE."""
        drafted, accepted = self._by_greedy[greedy]
        return (accepted + PRIOR_WEIGHT * INITIAL_RATE) / (drafted + PRIOR_WEIGHT)

    def record(self, num_drafted: int, num_accepted: int, greedy: bool) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        evidence = self._by_greedy[greedy]
        evidence[0] += num_drafted
        evidence[1] += num_accepted
        per_position = self.accepted_per_position
        if len(per_position) < num_drafted:
            per_position.extend([0] * (num_drafted - len(per_position)))
        for position in range(num_accepted):
            per_position[position] += 1

    def snapshot(self) -> SpecDecodeStats:
        return SpecDecodeStats(
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            tuple(self.accepted_per_position),
        )
