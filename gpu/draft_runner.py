"""The draft model of `--speculative-method draft`: a small model of the served model's
vocabulary that proposes each decode's draft tokens, greedily, before the step verifies them.

Its keys and values live in the served model's block pool: a block id names the block's slots
in the draft's layers as well as in the model's, the pool is sized for both models' bytes per
block (gpu/kv_cache.py), and the step's block tables and slot mapping address both. So prefix
caching, preemption and freeing need nothing of their own. Each step the draft model first runs
over the step's prefill chunks and over the decodes the planner gave drafts, from the first
token each one's draft KV lacks, then proposes for those decodes, one token per forward. A
decode without drafts leaves its token's draft KV for the next step that drafts for it: where
the planner speculates for nobody (a draft model that is often wrong, a compute-bound batch)
the draft model costs nothing, and catching up later is one forward over the missed tokens,
which comes anyway.

Greedy drafts keep verification exact (gpu/rejection_sampler.py): a draft that is the argmax of
the draft's logits is a draw from a point mass, q(d) = 1. Speculative sampling accepts it with
probability min(1, p(d) / q(d)) = p(d) and otherwise samples the residual, p without d,
renormalised; the verifier accepts exactly when the model's own draw is d (probability p(d))
and otherwise keeps that draw, which given that it is not d is a draw from the residual. So the
kept tokens follow the model's distribution, sampled or greedy, and a seeded request gets the
tokens it gets without speculation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import torch

from baton.core.batch import Batch, ExecutorOutput, ScheduledSequence
from baton.core.checkpoint.model_config import ModelConfig
from baton.core.config import EngineConfig
from baton.gpu.input_batch import InputBuffers
from baton.gpu.kv_cache import allocate_kv_caches
from baton.gpu.loader import load_model
from baton.gpu.models.cpu_layers import CpuLayers
from baton.gpu.models.model import CausalLM, LayerKVCache

logger = logging.getLogger(__name__)


class DraftRunner:
    """Runs the draft model over each step (`propose`) and keeps, per request, where its
    draft KV ends.

    Besides a decode that did not draft, a request's draft KV lags where verification accepted
    every draft: the last one was only ever a forward's output, never its input. Its request's
    next drafting step runs the draft model from that position on, so that token joins the
    forward that comes anyway, rather than costing one more forward now.
    """

    def __init__(
        self, model: CausalLM, buffers: InputBuffers, cpu_layers: CpuLayers | None
    ) -> None:
        self.model = model
        self.config: ModelConfig = model.config
        self.buffers = buffers
        self.cpu_layers = cpu_layers
        self.kv_caches: list[LayerKVCache] = []
        # The position of each request's first token without draft KV, where one is behind.
        self._behind: dict[str, int] = {}

    @classmethod
    def load(
        cls,
        config: ModelConfig,
        engine_config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        load_format: str,
    ) -> DraftRunner:
        """The draft model of `config` on `device` in the served model's `dtype`, its weights
        read as the model's are (`load_format`); its KV cache comes with `allocate`, once the
        pool's size is known."""
        model = load_model(config, device, dtype, max_model_len, load_format)
        model.pack_linear_weights(rows_hint=engine_config.max_num_seqs)
        cpu_layers = CpuLayers.of(model) if device.type == "cpu" else None
        # Room for a step and a token of catch-up per sequence; a longer catch-up (a request
        # that went without drafts for a while) gets tensors of its own (InputBuffers.prepare).
        buffers = InputBuffers(
            engine_config.max_num_batched_tokens + engine_config.max_num_seqs,
            engine_config.max_num_seqs,
            max_model_len,
            engine_config.block_size,
            device,
            dtype,
        )
        logger.info(
            "draft model: %s (%d layers) proposes draft tokens, its KV in the model's blocks",
            config.path,
            config.num_hidden_layers,
        )
        return cls(model, buffers, cpu_layers)

    def allocate(
        self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        """The draft's layers of the pool's `num_blocks` blocks."""
        self.kv_caches = allocate_kv_caches(self.config, num_blocks, block_size, dtype, device)

    def release(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._behind.pop(request_id, None)

    def propose(self, batch: Batch) -> Batch:
        """Compute the draft model's KV for `batch`'s new tokens, and return `batch` with its
        decodes' draft placeholders (core/speculative/draft_proposer.py) replaced by the draft
        model's greedy tokens."""
        sequences = batch.sequences
        drafting = [i for i, seq in enumerate(sequences) if seq.draft_token_ids]
        shares = []
        for seq in sequences:
            if seq.draft_token_ids or not _decodes(seq):
                shares.append(self._catch_up(seq))
            else:  # its token waits for the request's next drafts
                self._behind.setdefault(seq.request_id, seq.start_position)
        first = self._forward(shares, bool(drafting)) if shares else []
        # Only once its forward ran: a step that fails is run again, sequence by sequence.
        for share in shares:
            self._behind.pop(share.request_id, None)
        if not drafting:
            return batch
        drafts = {i: [token] for i, token in zip(drafting, first, strict=True)}
        most = max(len(sequences[i].draft_token_ids) for i in drafting)
        for j in range(1, most):
            # The j-th draft at its position, proposing the one after it.
            growing = [i for i in drafting if len(sequences[i].draft_token_ids) > j]
            step = [
                _share(sequences[i], [drafts[i][-1]], sequences[i].start_position + j, True)
                for i in growing
            ]
            for i, token in zip(growing, self._forward(step, True), strict=True):
                drafts[i].append(token)
        filled = list(sequences)
        for i, tokens in drafts.items():
            seq = sequences[i]
            new_tokens = seq.token_ids[: len(seq.token_ids) - len(tokens)]
            filled[i] = dataclasses.replace(
                seq, token_ids=[*new_tokens, *tokens], draft_token_ids=tokens
            )
        return dataclasses.replace(batch, sequences=filled)

    def settle(self, sequences: Sequence[ScheduledSequence], output: ExecutorOutput) -> None:
        """Note the requests whose every draft `output` accepted: the last of those has no
        draft KV until their next drafting step."""
        for seq in sequences:
            drafts = seq.draft_token_ids
            if drafts and len(output.accepted_draft_ids[seq.request_id]) == len(drafts):
                self._behind[seq.request_id] = seq.start_position + len(drafts)

    def _catch_up(self, seq: ScheduledSequence) -> ScheduledSequence:
        """The draft model's share of `seq`: its new tokens without the drafts, from the first
        token the draft's KV lacks (a preempted request may restart before it)."""
        new_tokens = seq.token_ids[: len(seq.token_ids) - len(seq.draft_token_ids)]
        start = seq.start_position
        behind = self._behind.get(seq.request_id, start)
        if behind < start:
            new_tokens = [*seq.all_token_ids[behind:start], *new_tokens]
            start = behind
        return _share(seq, new_tokens, start, bool(seq.draft_token_ids))

    def _forward(self, sequences: list[ScheduledSequence], sample: bool) -> list[int]:
        """One forward of the draft model over `sequences`, writing their KV; with `sample`,
        the argmax after each sequence whose `sample` is set."""
        inputs = self.buffers.prepare(Batch(sequences=sequences))
        cpu_layers = self.cpu_layers
        if cpu_layers is not None and cpu_layers.takes(inputs.input_ids, inputs.attn_metadata):
            hidden = cpu_layers.forward(
                inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
            )
        else:
            hidden = self.model(
                inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_caches
            )
        if not sample:
            return []
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        return logits.argmax(dim=-1).tolist()


def _decodes(seq: ScheduledSequence) -> bool:
    """Whether `seq` is a decode: one new token, past the prompt."""
    return len(seq.token_ids) == 1 and seq.start_position >= seq.num_prompt_tokens


def _share(
    seq: ScheduledSequence, token_ids: list[int], start: int, sample: bool
) -> ScheduledSequence:
    """`token_ids` of `seq`'s request at `start`, in its blocks, sampled after if `sample`."""
    return ScheduledSequence(
        seq.request_id,
        token_ids,
        start,
        seq.block_table,
        sample,
        seq.sampling_params,
        seq.all_token_ids,
        seq.num_prompt_tokens,
    )
