"""Turns a step's logits into one next token per sequence: penalties, logit bias, filters,
seeded draws.

Everything is vectorized over the batch; per-row Python touches only token lists and the
seeded generators. Log-probabilities are reported under the raw model distribution, as vLLM
does by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import torch

from baton.core.batch import ExecutorOutput, ScheduledSequence, TokenLogprobs
from baton.core.sampling_params import SamplingParams
from baton.kernels import ops

if TYPE_CHECKING:  # xgrammar loads with the first structured-output request, not here
    from baton.gpu.structured_output import GrammarMask

_NEG_INF = float("-inf")


class Sampler:
    """Samples one token per row of `logits`; ids at or past `vocab_size` are never chosen."""

    def __init__(self, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._generators: dict[torch.device, torch.Generator] = {}

    def __call__(
        self,
        logits: torch.Tensor,
        sequences: list[ScheduledSequence],
        grammar_mask: GrammarMask | None = None,
    ) -> ExecutorOutput:
        # Columns past the tokenizer's vocabulary (padded embeddings) have no token behind them.
        if logits.shape[1] != self.vocab_size:
            logits = logits[:, : self.vocab_size]
        if grammar_mask is None and all(map(_takes_argmax, sequences)):
            # The usual greedy decode: nothing to set up per row, one argmax (exact in any dtype).
            return ExecutorOutput(ops.argmax(logits).tolist(), [None] * len(sequences))
        raw = logits.float()
        params = [seq.sampling_params for seq in sequences]
        processed = raw
        if any(p.uses_penalties for p in params):
            processed = apply_penalties(processed, sequences)
        if any(p.logit_bias is not None for p in params):
            processed = apply_logit_bias(processed, params)
        processed = mask_stop_tokens(processed, sequences, self.eos_token_ids)
        # Structured output: the grammar's disallowed tokens go last, after every other
        # processor, and the logprobs below still describe the raw model distribution.
        if grammar_mask is not None:
            processed = grammar_mask.apply(processed)
        if all(p.greedy for p in params):
            token_ids = ops.argmax(processed)
        else:
            token_ids = self._sample(processed, sequences)
        sampled = token_ids.tolist()
        return ExecutorOutput(sampled, gather_logprobs(raw, sampled, params))

    def _sample(self, logits: torch.Tensor, sequences: list[ScheduledSequence]) -> torch.Tensor:
        params = [seq.sampling_params for seq in sequences]
        vocab, device = logits.shape[1], logits.device
        greedy = torch.tensor([p.greedy for p in params], device=device)
        # Greedy rows get temperature 1 so the division stays finite; their draw is discarded.
        temperature = _column([1.0 if p.greedy else p.temperature for p in params], device)
        scaled = logits / temperature
        if any(p.min_p > 0.0 for p in params):
            scaled = apply_min_p(scaled, _column([p.min_p for p in params], device))
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
            # A disabled top_p becomes inf: rounding can push a cumulative sum past 1.0.
            top_p = [p.top_p if p.top_p < 1.0 else float("inf") for p in params]
            scaled = apply_top_k_top_p(
                scaled, _column(top_k, device, torch.long), _column(top_p, device)
            )
        probs = scaled.softmax(dim=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p, and the noise of a
        # row can come from that row's own generator without touching the others.
        drawn = ops.argmax(probs / self._exponential_noise(probs, sequences))
        return torch.where(greedy, ops.argmax(logits), drawn)

    def _exponential_noise(
        self, probs: torch.Tensor, sequences: list[ScheduledSequence]
    ) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_()
        for row, seq in enumerate(sequences):
            params = seq.sampling_params
            if params.seed is None or params.greedy:
                continue
            # Seeding from (seed, output position) makes a row's draws independent of the batch
            # around it and repeatable after a preemption recomputes the sequence.
            generator = self._generator(probs.device)
            generator.manual_seed(_step_seed(params.seed, seq.num_output_tokens))
            noise[row].exponential_(generator=generator)
        # exponential_ may return exactly 0, and 0/0 is NaN, which argmax would pick.
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device)
        return self._generators[device]


def _takes_argmax(seq: ScheduledSequence) -> bool:
    """Whether `seq`'s token is the argmax of its raw logits, with no log-probabilities asked:
    greedy, and no penalty, logit bias or stop-token mask changes a logit."""
    params = seq.sampling_params
    return (
        params.greedy
        and params.logprobs is None
        and params.logit_bias is None
        and not params.uses_penalties
        and seq.num_output_tokens >= params.min_tokens  # else mask_stop_tokens would act
    )


def apply_penalties(logits: torch.Tensor, sequences: Sequence[ScheduledSequence]) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens, presence and frequency over output."""
    params = [seq.sampling_params for seq in sequences]
    vocab, device = logits.shape[1], logits.device
    # Rows that do not use a penalty contribute no tokens, so long prompts cost nothing there.
    output_counts = _token_counts(
        [
            seq.all_token_ids[seq.num_prompt_tokens :] if seq.sampling_params.uses_penalties else []
            for seq in sequences
        ],
        vocab,
        device,
    )
    prompt_counts = _token_counts(
        [
            seq.all_token_ids[: seq.num_prompt_tokens]
            if seq.sampling_params.repetition_penalty != 1.0
            else []
            for seq in sequences
        ],
        vocab,
        device,
    )
    repetition = _column([p.repetition_penalty for p in params], device)
    seen = (prompt_counts + output_counts) > 0
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)
    presence = _column([p.presence_penalty for p in params], device)
    frequency = _column([p.frequency_penalty for p in params], device)
    return logits - presence * (output_counts > 0) - frequency * output_counts


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Add each row's `logit_bias` to its logits: one scattered add for the whole batch."""
    vocab = logits.shape[1]
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for row, p in enumerate(params):
        if p.logit_bias is None:
            continue
        for token_id, bias in p.logit_bias.items():
            # Checked against the vocabulary at admission; a padded LM head may be wider still.
            if token_id < vocab:
                rows.append(row)
                cols.append(token_id)
                values.append(bias)
    index = (_tensor(rows, logits.device), _tensor(cols, logits.device))
    bias = torch.tensor(values, dtype=logits.dtype, device=logits.device)
    return logits.index_put(index, bias, accumulate=True)


def mask_stop_tokens(
    logits: torch.Tensor, sequences: Sequence[ScheduledSequence], eos_token_ids: list[int]
) -> torch.Tensor:
    """Forbid EOS and the request's stop tokens while it has fewer than `min_tokens` outputs."""
    vocab = logits.shape[1]
    rows: list[int] = []
    cols: list[int] = []
    for row, seq in enumerate(sequences):
        params = seq.sampling_params
        if seq.num_output_tokens >= params.min_tokens:
            continue
        # stop_token_ids come from the user unbounded; ids outside the vocabulary cannot be
        # sampled anyway and would be out of range for the index.
        blocked = {t for t in (*eos_token_ids, *params.stop_token_ids) if t < vocab}
        rows.extend([row] * len(blocked))
        cols.extend(blocked)
    if not rows:
        return logits
    index = (_tensor(rows, logits.device), _tensor(cols, logits.device))
    return logits.index_put(index, torch.tensor(_NEG_INF, device=logits.device))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens less likely than `min_p` times the most likely one (per-row `min_p`)."""
    # p / p_max = exp(logit - logit_max), so the test needs no softmax; log(0) keeps everything.
    threshold = logits.amax(dim=-1, keepdim=True) + min_p.log()
    return logits.masked_fill(logits < threshold, _NEG_INF)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Keep each row's `top_k` best tokens, then the fewest that reach `top_p` mass; one sort."""
    # A stable sort breaks ties by token id, so a row filters the same way in any batch.
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(logits.shape[1], device=logits.device)
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k, _NEG_INF)
    probs = sorted_logits.softmax(dim=-1)
    # A token goes once the more likely tokens before it already cover top_p; the first always
    # stays, also when a tiny top_p rounds to 0 in float32.
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill((mass_before >= top_p) & (ranks > 0), _NEG_INF)
    return torch.full_like(logits, _NEG_INF).scatter(-1, order, sorted_logits)


def gather_logprobs(
    raw_logits: torch.Tensor, token_ids: list[int], params: Sequence[SamplingParams]
) -> list[TokenLogprobs | None]:
    """The sampled token's log-probability and the top-N alternatives, for rows that ask."""
    out: list[TokenLogprobs | None] = [None] * len(params)
    wanted = [row for row, p in enumerate(params) if p.logprobs is not None]
    if not wanted:
        return out
    device = raw_logits.device
    logprobs = raw_logits[_tensor(wanted, device)].log_softmax(dim=-1)
    chosen = logprobs.gather(1, _tensor([token_ids[r] for r in wanted], device).unsqueeze(1))
    num_top = min(max(params[r].logprobs or 0 for r in wanted), logprobs.shape[1])
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    chosen_list, values, ids = chosen.squeeze(1).tolist(), top_values.tolist(), top_ids.tolist()
    for i, row in enumerate(wanted):
        n = params[row].logprobs or 0
        top = list(zip(ids[i][:n], values[i][:n], strict=True))
        out[row] = TokenLogprobs(token_ids[row], chosen_list[i], top)
    return out


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Per-row occurrence counts of token ids, as float [rows, vocab], from one scatter."""
    lengths = torch.tensor([len(tokens) for tokens in token_lists])
    rows = torch.repeat_interleave(torch.arange(len(token_lists)), lengths).to(device)
    ids = _tensor(list(chain.from_iterable(token_lists)), device)
    # Weighting out-of-vocabulary ids by 0 instead of filtering them avoids a device sync.
    weights = (ids < vocab).float()
    counts = torch.zeros(len(token_lists), vocab, device=device)
    return counts.index_put_((rows, ids.clamp(max=vocab - 1)), weights, accumulate=True)


def _step_seed(seed: int, step: int) -> int:
    """A 64-bit generator seed mixing a request's seed with its output position."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _column(
    values: list[float] | list[int], device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device).unsqueeze(1)


def _tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
