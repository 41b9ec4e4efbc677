"""The scheduler's other half: a step's executor output applied to the requests it scheduled.
Each advances past the tokens it computed and takes what the step produced for it: prompt
log-probabilities, a pooled chunk, its accepted draft tokens and the token sampled after them."""

from __future__ import annotations

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence, TokenLogprobs
from baton.core.kv_cache.kv_cache_manager import KVCacheManager
from baton.core.request import Request
from baton.core.speculative.speculator import Speculator

# A request's new tokens from one step, with their log-probabilities where it asked for them.
SampledTokens = tuple[Request, list[int], list[TokenLogprobs | None] | None]


def update_from_output(
    batch: Batch,
    output: ExecutorOutput,
    requests: dict[str, Request],
    kv_cache: KVCacheManager,
    speculator: Speculator | None,
) -> list[SampledTokens]:
    """Advance each scheduled request past this step's tokens and append what it produced:
    its accepted draft tokens, if it carried any, then the token sampled after them. Return
    each request's new tokens with their log-probabilities where asked, and no tokens for a
    request with `max_tokens` 0 whose prompt is now computed."""
    sampled = []
    index = 0
    for seq in batch.sequences:
        request = requests[seq.request_id]
        if seq.draft_token_ids:
            assert speculator is not None
            sampled.append(_update_drafted(seq, request, output, index, kv_cache, speculator))
            index += 1
            continue
        request.num_computed_tokens += len(seq.token_ids)
        kv_cache.cache_computed_blocks(request)
        if seq.prompt_logprob_positions:
            assert request.prompt_logprobs is not None
            request.prompt_logprobs.extend(output.prompt_logprobs[seq.request_id])
        if request.pooled is not None and seq.request_id in output.pooled:
            request.pooled.add(output.pooled[seq.request_id])
        if seq.sample:
            token_id = output.sampled_token_ids[index]
            logprobs = output.logprobs[index] if output.logprobs else None
            index += 1
            request.append_token(token_id)
            sampled.append((request, [token_id], None if logprobs is None else [logprobs]))
        elif request.num_uncomputed_tokens == 0:
            sampled.append((request, [], None))  # max_tokens 0: the prompt is scored
    return sampled


def _update_drafted(
    seq: ScheduledSequence,
    request: Request,
    output: ExecutorOutput,
    index: int,
    kv_cache: KVCacheManager,
    speculator: Speculator,
) -> SampledTokens:
    """The update of a decode that carried draft tokens (the `index`-th sampled sequence): its
    accepted drafts and the token after them join it; the rejected drafts' keys and values stay
    behind in slots the next tokens overwrite, and blocks past its tokens go."""
    accepted = output.accepted_draft_ids[seq.request_id]
    request.num_computed_tokens += 1 + len(accepted)
    request.token_ids.extend(accepted)
    speculator.observe(request, len(seq.draft_token_ids), len(accepted))
    kv_cache.cache_computed_blocks(request)
    token_id = output.sampled_token_ids[index]
    request.append_token(token_id)
    kv_cache.free_unused_tail(request)
    logprobs = output.logprobs[index] if output.logprobs else None
    if logprobs is None:
        return request, [*accepted, token_id], None
    return request, [*accepted, token_id], [*output.draft_logprobs[seq.request_id], logprobs]
