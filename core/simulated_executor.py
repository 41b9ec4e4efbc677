"""An executor without a model, for scheduler tests and the simulator: it "samples" a token that
is a pure function of the sequence so far and charges each step a modelled duration on a
simulated clock."""

from __future__ import annotations

from dataclasses import dataclass

from core.batch import Batch, ExecutorOutput


@dataclass(slots=True)
class SimulatedClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class StepCost:
    """Seconds a step takes: a fixed overhead plus per-token and per-sequence terms."""

    base_s: float = 0.005
    per_token_s: float = 0.0001
    per_seq_s: float = 0.0002

    def __call__(self, batch: Batch) -> float:
        return self.base_s + self.per_token_s * batch.num_tokens + self.per_seq_s * len(batch)


class SimulatedExecutor:
    def __init__(
        self,
        num_kv_blocks: int,
        block_size: int,
        vocab_size: int,
        clock: SimulatedClock | None = None,
        cost: StepCost | None = None,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.clock = clock or SimulatedClock()
        self.cost = cost or StepCost()

    def execute(self, batch: Batch) -> ExecutorOutput:
        self.clock.now += self.cost(batch)
        return ExecutorOutput(
            [self.next_token(seq.all_token_ids) for seq in batch.sequences if seq.sample]
        )

    def next_token(self, token_ids: list[int]) -> int:
        """Deterministic in the whole history, so a request's output cannot depend on batching."""
        state = len(token_ids)
        for token_id in token_ids[-8:]:
            state = (state * 1_000_003 + token_id) % 2_147_483_647
        return state % self.vocab_size
