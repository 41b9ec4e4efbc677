"""Where a request's draft tokens come from: the proposer `--speculative-method` names."""

from __future__ import annotations

from typing import Protocol

from baton.core.config import EngineConfig
from baton.core.speculative.draft_proposer import DraftModelProposer
from baton.core.speculative.ngram_proposer import NgramProposer


class Proposer(Protocol):
    """Guesses at the tokens that follow a sequence, which the executor then verifies."""

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` draft tokens to follow `token_ids`; [] for none."""
        ...


def make_proposer(config: EngineConfig) -> Proposer:
    """The proposer of a speculating config (`config.speculates`)."""
    if config.speculative_method == "draft":
        return DraftModelProposer()
    return NgramProposer(config.ngram_min, config.ngram_max)
