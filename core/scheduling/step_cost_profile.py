"""The warm-up profile that seeds a step-cost model before traffic: a few synthetic step shapes
spanning its features, timed on a real executor at start-up or given their true cost in the
simulator."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from baton.core.batch import Batch, ScheduledSequence
from baton.core.executor import Executor
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.step_cost import StepCostModel, StepShape


def warm_up(
    model: StepCostModel,
    measure: Callable[[StepShape], float],
    shapes: Sequence[StepShape],
    rounds: int = 2,
) -> None:
    """Seed `model` before traffic: time each synthetic step shape `rounds` times; the fit
    becomes the model's anchor."""
    for _ in range(rounds):
        for shape in shapes:
            model.update(shape, measure(shape))
    model.anchor()


def profile_shapes(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int
) -> list[StepShape]:
    """A handful of step shapes spanning the features, so every coefficient is identified:
    prefill-only chunks of a few sizes, decode-only batches of a few sizes and context lengths,
    and one mixed step."""
    longest = max(2, max_model_len - 1)
    chunk = max(4, min(256, max_num_batched_tokens, longest))
    few, many = max(1, min(4, max_num_seqs - 1)), max(1, min(16, max_num_seqs - 1))
    short, long = min(64, longest), min(512, longest)
    return [
        StepShape(chunk // 4, 0, chunk // 4),
        StepShape(chunk, 0, chunk),
        StepShape(0, 1, short),
        StepShape(0, few, few * long),
        StepShape(0, many, many * short),
        StepShape(0, many, many * long),
        StepShape(chunk // 2, few, few * short + chunk // 2),
    ]


def profile_executor(
    model: StepCostModel,
    executor: Executor,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    vocab_size: int,
    clock: Callable[[], float] = time.perf_counter,
    rounds: int = 1,
) -> None:
    """The warm-up profile for a real executor: run a few synthetic steps through it at start-up
    (before any request holds a KV block, so the blocks they write are free) and fit to them,
    after one untimed pass."""
    shapes = profile_shapes(max_num_batched_tokens, max_num_seqs, max_model_len)

    def measure(shape: StepShape) -> float:
        batch = synthetic_batch(shape, executor.num_kv_blocks, executor.block_size, vocab_size)
        started = clock()
        executor.execute(batch)
        return clock() - started

    for shape in shapes:  # first forwards of each size pay one-off costs (allocation, init)
        measure(shape)
    warm_up(model, measure, shapes, rounds)
    # What the model reports as its error should be its error on real steps, not on the fit.
    model.last_error_ratio = model.mean_abs_error_ratio = None


def synthetic_batch(shape: StepShape, num_blocks: int, block_size: int, vocab_size: int) -> Batch:
    """A batch of `shape`: decodes of equal context, then one prefill chunk from position 0."""
    batch = Batch()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    num_prefill_seqs = 1 if shape.num_prefill_tokens else 0
    decode_context = shape.num_context_tokens - shape.num_prefill_tokens
    context = max(1, decode_context // max(1, shape.num_decode_tokens))
    next_block = 0

    def blocks(num_tokens: int) -> list[int]:
        nonlocal next_block
        count = -(-num_tokens // block_size)
        table = [(next_block + i) % num_blocks for i in range(count)]
        next_block += count
        return table

    for i in range(shape.num_decode_tokens):
        tokens = [(i * 31 + j) % vocab_size for j in range(context)]
        batch.sequences.append(
            ScheduledSequence(
                f"profile-decode-{i}",
                tokens[-1:],
                context - 1,
                blocks(context),
                True,
                params,
                tokens,
                context - 1,
            )
        )
        batch.num_decode_tokens += 1
    for i in range(num_prefill_seqs):
        tokens = [(j * 7 + 3) % vocab_size for j in range(shape.num_prefill_tokens)]
        batch.sequences.append(
            ScheduledSequence(
                f"profile-prefill-{i}",
                tokens,
                0,
                blocks(len(tokens)),
                True,
                params,
                tokens,
                len(tokens),
            )
        )
        batch.num_prefill_tokens += len(tokens)
    return batch
