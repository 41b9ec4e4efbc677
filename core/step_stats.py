"""What one engine step was made of and how long it took: the step-cost model fits to these,
metrics and tracing read them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class StepStats:
    """One step, timed on the engine's clock (seconds).

    `started` is when scheduling began, `executed` when the forward returned and `finished`
    when every request's output for the step was processed. `num_context_tokens` is the number
    of KV entries the step's attention read: the sum of every scheduled sequence's length.
    `num_draft_tokens` are the decodes' speculative draft tokens, verified beside them;
    `num_constrained_rows` the positions sampled under an output constraint (grammar masks).
    """

    started: float
    executed: float
    finished: float
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int
    num_draft_tokens: int = 0
    num_constrained_rows: int = 0

    @property
    def duration_s(self) -> float:
        return self.finished - self.started

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_tokens
