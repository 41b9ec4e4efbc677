"""An executor without a model, for tests and the simulator: it "samples" a token that is a pure
function of the sequence so far, ends an answer where a script says, verifies draft tokens
against those, and charges each step the duration a step-cost model gives it on a simulated
clock."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence, TokenLogprobs
from baton.core.scheduling.step_cost import CostCoefficients, StepShape
from baton.core.speculative.draft_proposer import MODEL_DRAFT_TOKEN

# What a scripted answer says until its end.
FILLER_TOKEN_ID = 0


@dataclass(slots=True)
class SimulatedClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedExecutor:
    """`cost` is the machine's true step cost; `noise` makes each step's duration uniformly up
    to that share longer or shorter (drawn from `seed`), so a model fitted to the steps is never
    exact, as on a real machine. `on_batch` sees every batch before it runs. A draft token is
    accepted when it is the token the executor would sample there, and then only with chance
    `draft_acceptance` (also drawn from `seed`): the simulator's answers are filler a lookup
    always predicts, and a draft model's placeholders stand for the tokens it would sample, so
    this is the workload's acceptance rate."""

    def __init__(
        self,
        num_kv_blocks: int,
        block_size: int,
        vocab_size: int,
        clock: SimulatedClock | None = None,
        cost: CostCoefficients | None = None,
        *,
        noise: float = 0.0,
        seed: int = 0,
        eos_token_id: int | None = None,
        on_batch: Callable[[Batch], None] | None = None,
        kv_bytes_per_token: int = 0,
        draft_acceptance: float = 1.0,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.clock = clock or SimulatedClock()
        self.cost = cost if cost is not None else CostCoefficients()
        self.noise = noise
        self.rng = random.Random(seed)
        self.eos_token_id = eos_token_id
        # Request id → the output length at which a scripted answer ends with EOS (None: it
        # goes on until max_tokens).
        self.scripts: dict[str, int | None] = {}
        self.on_batch = on_batch
        # The modelled KV size, for a handed-off request's transfer; no contents exist.
        self.kv_bytes_per_token = kv_bytes_per_token
        self.draft_acceptance = draft_acceptance

    def script_answer(self, request_id: str, output_len: int | None) -> None:
        """Answer `request_id` with filler tokens, ending with EOS as its `output_len`-th token
        (None: never by itself). The simulator's tokens are never read, so it skips the hash."""
        if output_len is not None and self.eos_token_id is None:
            raise ValueError("give the executor an eos_token_id to end answers with")
        self.scripts[request_id] = output_len

    def execute(self, batch: Batch) -> ExecutorOutput:
        if self.on_batch is not None:
            self.on_batch(batch)
        seconds = self.cost.predict(StepShape.of_batch(batch))
        if self.noise:
            seconds *= 1 + self.rng.uniform(-self.noise, self.noise)
        self.clock.now += seconds
        # One loop, no call per plain decode: the simulator runs it for every token it simulates.
        scripts = self.scripts
        sampled = []
        prompt_logprobs = {}
        accepted_drafts = {}
        for seq in batch.sequences:
            if seq.prompt_logprob_positions:
                prompt_logprobs[seq.request_id] = self.prompt_logprobs(seq)
            if not seq.sample:
                continue
            if not seq.draft_token_ids:
                if seq.request_id not in scripts:
                    sampled.append(self.next_token(seq.all_token_ids))
                    continue
                output_len = scripts[seq.request_id]
                num_output = len(seq.all_token_ids) - seq.num_prompt_tokens + 1
                ended = output_len is not None and num_output >= output_len
                sampled.append(self.eos_token_id if ended else FILLER_TOKEN_ID)
                continue
            history = list(seq.all_token_ids)
            accepted = []
            for draft in seq.draft_token_ids:
                token_id = self._sample(seq, history)
                # A draft model's placeholder stands for a draft model that agrees with this one.
                agrees = draft in (token_id, MODEL_DRAFT_TOKEN)
                if not agrees or self.rng.random() >= self.draft_acceptance:
                    break
                accepted.append(token_id)
                history.append(token_id)
            accepted_drafts[seq.request_id] = accepted
            sampled.append(self._sample(seq, history))
        return ExecutorOutput(
            sampled, prompt_logprobs=prompt_logprobs, accepted_draft_ids=accepted_drafts
        )

    def _sample(self, seq: ScheduledSequence, history: list[int]) -> int:
        """The token after `history`, the sequence's tokens so far."""
        output_len = self.scripts.get(seq.request_id, -1)
        if output_len == -1:
            return self.next_token(history)
        num_output = len(history) - seq.num_prompt_tokens + 1
        ended = output_len is not None and num_output >= output_len
        return self.eos_token_id if ended else FILLER_TOKEN_ID

    def read_kv(self, block_ids: Sequence[int]) -> None:
        """No cache to read: a simulated transfer moves no contents."""

    def write_kv(self, block_ids: Sequence[int], contents: object) -> None:
        """No cache to write: the simulated tokens depend on the history alone."""

    @staticmethod
    def prompt_logprobs(seq: ScheduledSequence) -> list[TokenLogprobs]:
        """Made-up scores, a pure function of position and token, so any chunking or batching
        of a prompt must give the same list."""
        tokens = seq.all_token_ids
        return [
            TokenLogprobs(tokens[p + 1], -((p * 31 + tokens[p + 1]) % 97) / 10, [])
            for p in seq.prompt_logprob_positions
        ]

    def next_token(self, token_ids: list[int]) -> int:
        """Deterministic in the whole history, so a request's output cannot depend on batching."""
        state = len(token_ids)
        for token_id in token_ids[-8:]:
            state = (state * 1_000_003 + token_id) % 2_147_483_647
        token_id = state % self.vocab_size
        # Only a script ends an answer: a token that happens to be EOS becomes its neighbour.
        if token_id == self.eos_token_id:
            token_id = (token_id + 1) % self.vocab_size
        return token_id
