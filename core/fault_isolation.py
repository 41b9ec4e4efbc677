"""What a step does when its forward raised: a failed forward cannot say whose input broke it,
so each sequence runs alone; the ones that still raise fail, and the step goes on with the rest
as if it had gone through."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence
from baton.core.executor import Executor


@dataclass(slots=True)
class IsolatedStep:
    """The sequences that ran alone without error, as one batch, with their merged outputs;
    and the ones that raised, with what they raised."""

    batch: Batch = field(default_factory=Batch)
    output: ExecutorOutput = field(default_factory=lambda: ExecutorOutput([], []))
    failures: list[tuple[ScheduledSequence, Exception]] = field(default_factory=list)


def run_each_alone(executor: Executor, batch: Batch) -> IsolatedStep:
    step = IsolatedStep()
    kept, merged = step.batch, step.output
    for seq in batch.sequences:
        alone = Batch(
            [seq],
            num_prompt_logprobs=len(seq.prompt_logprob_positions),
            num_pooled=int(seq.pools),
            num_draft_tokens=len(seq.draft_token_ids),
        )
        try:
            result = executor.execute(alone)
        except Exception as error:
            step.failures.append((seq, error))
            continue
        kept.sequences.append(seq)
        kept.num_prompt_logprobs += len(seq.prompt_logprob_positions)
        kept.num_pooled += seq.pools
        kept.num_draft_tokens += len(seq.draft_token_ids)
        merged.sampled_token_ids.extend(result.sampled_token_ids)
        merged.logprobs.extend(result.logprobs or [None] * len(result.sampled_token_ids))
        merged.prompt_logprobs.update(result.prompt_logprobs)
        merged.pooled.update(result.pooled)
        merged.accepted_draft_ids.update(result.accepted_draft_ids)
        merged.draft_logprobs.update(result.draft_logprobs)
    return step
