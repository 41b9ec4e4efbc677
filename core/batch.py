"""The two plain objects that cross the seam between the scheduler and the executor."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from baton.core.pooling import Pooling
from baton.core.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSequence:
    """One request's share of a step: compute KV for `token_ids`, maybe sample after them.

    `token_ids` sit at positions `start_position ..`, so `start_position + len(token_ids)` is
    the sequence length the attention sees. `block_table` maps the sequence's logical blocks to
    physical KV blocks and already covers every position written this step.
    `all_token_ids` is the request's whole token list (prompt then output) for penalties;
    the first `num_prompt_tokens` of it are the prompt. The executor must not modify either list.
    `prompt_logprob_positions` are positions of this chunk whose next prompt token's
    log-probability the request still needs (position p scores `all_token_ids[p + 1]`); empty
    for requests that did not ask, so only those pay for the extra logits.
    `draft_token_ids` are speculative decoding's guesses at the tokens after the request's last
    one: they end `token_ids` (a decode then computes `1 + len(draft_token_ids)` tokens), the
    executor verifies them against the model's distribution at each of their positions and
    reports the accepted prefix (`ExecutorOutput.accepted_draft_ids`); `all_token_ids` does not
    hold them.
    """

    request_id: str
    token_ids: list[int]
    start_position: int
    block_table: list[int]
    sample: bool
    sampling_params: SamplingParams
    all_token_ids: list[int]
    num_prompt_tokens: int
    prompt_logprob_positions: range = range(0)
    # A tuple by default: a list per sequence would cost every plain step an allocation.
    draft_token_ids: Sequence[int] = ()

    @property
    def seq_len(self) -> int:
        return self.start_position + len(self.token_ids)

    @property
    def pools(self) -> bool:
        """Whether this chunk's final hidden states feed the request's embedding: every chunk
        under mean pooling, only the one ending the prompt under last-token pooling."""
        pooling = self.sampling_params.pooling
        if pooling is None:
            return False
        return pooling is Pooling.MEAN or self.seq_len == self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:
        """Output tokens generated before this step (the one sampled now is not counted)."""
        return len(self.all_token_ids) - self.num_prompt_tokens


@dataclass(frozen=True, slots=True)
class Padding:
    """What a dense executor computes beyond the sequences when it runs a static batch as one
    padded tensor: positions padding each prompt to the longest, rows of members that have
    finished, and the keys and values of both that the attention reads."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_context_tokens: int = 0


NO_PADDING = Padding()


@dataclass(slots=True)
class Batch:
    """Everything one step computes: decodes first, then prefill chunks.

    `num_prompt_logprobs` counts the sequences' `prompt_logprob_positions`, so a step without any
    costs one test; `num_pooled` counts the sequences whose final hidden states are pooled this
    step (an embedding's every chunk under mean pooling, its last under last-token pooling).
    `num_draft_tokens` counts the decodes' draft tokens (speculative decoding), which the step
    computes like prefill tokens. `num_constrained_rows` counts the positions sampled under an
    output constraint (a grammar's mask is filled for each). `finished_request_ids` are
    requests that ended since the previous batch, so an executor that keeps state per request
    (grammar matchers) can drop theirs. `padding` is a cost only (static batching,
    core/scheduling/static_batch.py): an executor packs the sequences and never computes it, so
    it cannot change a token; a simulated one charges it.
    """

    sequences: list[ScheduledSequence] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_draft_tokens: int = 0
    num_constrained_rows: int = 0
    num_prompt_logprobs: int = 0
    num_pooled: int = 0
    finished_request_ids: list[str] = field(default_factory=list)
    padding: Padding = NO_PADDING

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_tokens

    def __len__(self) -> int:
        return len(self.sequences)

    def prefill_chunks(self) -> Iterator[ScheduledSequence]:
        """The sequences computing prefill tokens, the last first. A one-token chunk past the
        prompt (a resumed request with all else cached) counts as a decode."""
        # Prefill chunks follow the decodes, so the walk from the end stops once it has seen all
        # of the step's prefill tokens: steady decoding costs nothing here.
        remaining = self.num_prefill_tokens
        for seq in reversed(self.sequences):
            if remaining <= 0:
                return
            if len(seq.token_ids) == 1 and seq.start_position >= seq.num_prompt_tokens:
                continue
            yield seq
            remaining -= len(seq.token_ids)


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities under the model's raw distribution for one sampled position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class ExecutorOutput:
    """One sampled token per sequence with `sample=True`, in batch order.

    `logprobs` is aligned with `sampled_token_ids`; an entry is None where the request did not
    ask for log-probabilities. `prompt_logprobs` maps a request id to one entry per position of
    its `prompt_logprob_positions`, in order. `pooled` maps a pooling request's id to what this
    step's chunk adds to its embedding, in float32 (core/pooling.py `PooledState.add`).
    A sequence that carried draft tokens has its accepted prefix of them (possibly empty) in
    `accepted_draft_ids`, and their log-probabilities in `draft_logprobs` where it asked; its
    `sampled_token_ids` entry is the token sampled after that prefix.
    """

    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    pooled: dict[str, list[float]] = field(default_factory=dict)
    accepted_draft_ids: dict[str, list[int]] = field(default_factory=dict)
    draft_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)
