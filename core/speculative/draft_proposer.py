"""A draft model's proposals as core sees them: the planner grants a decode its drafts, the
scheduler reserves their slots and budget, and the executor's draft model writes the tokens
(gpu/draft_runner.py) before the step verifies them. Core cannot run a model, so it hands the
executor placeholders where the drafts go."""

from __future__ import annotations

# No vocabulary has this id: a placeholder an executor did not fill is never accepted, since
# no target draw equals it.
MODEL_DRAFT_TOKEN = -1


class DraftModelProposer:
    """Proposes as many draft tokens as the planner grants; the draft model fills them in."""

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        return [MODEL_DRAFT_TOKEN] * max(0, max_tokens)
