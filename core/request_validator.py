"""The checks a request must pass before any engine takes it, built from the engine's settings
and the model's limits alone: admission runs them once, with or without a model in the process."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from baton.core.config import EngineConfig
from baton.core.kv_cache.kv_cache_manager import blocks_needed, max_blocks_held
from baton.core.request import EngineRequest, check_priority
from baton.core.sampling_params import CONTEXT_LENGTH_EXCEEDED, InvalidRequestError
from baton.core.scheduling.policy_registry import POLICY_CLASSES


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a loaded model and its KV cache bound a request by. `sliding_window`: the model's
    window when every layer has one (a request then holds only the blocks inside it)."""

    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    sliding_window: int | None = None


class RequestValidator:
    """Refuses what an engine with `config` and `limits` can never serve. Holds nothing that
    changes, so any thread may call it; it allocates nothing, so it is cheap on the event loop."""

    def __init__(self, config: EngineConfig, limits: ModelLimits) -> None:
        self.limits = limits
        self.max_num_batched_tokens = config.max_num_batched_tokens
        # A static slot holds its whole maximum length from the start, window or not.
        self.static_batching = POLICY_CLASSES[config.scheduling_policy].static_batching

    def validate(
        self, request: EngineRequest, default_max_tokens: int | None = None
    ) -> EngineRequest:
        """`request` with `max_tokens` resolved, or InvalidRequestError saying what to change.
        An unset max_tokens becomes what fits, and at most `default_max_tokens` (the
        checkpoint's max_new_tokens): a default nobody sent is never a reason to refuse."""
        limits = self.limits
        prompt = request.prompt_token_ids
        params = request.sampling_params
        self._check_prompt(prompt)
        if params.logit_bias is not None:
            beyond = [t for t in params.logit_bias if t >= limits.vocab_size]
            if beyond:
                raise InvalidRequestError(
                    f"logit_bias names token id {beyond[0]}, outside the vocabulary "
                    f"[0, {limits.vocab_size})",
                    "logit_bias",
                )
        num_prompt = len(prompt)
        room = limits.max_model_len - num_prompt
        max_tokens = params.max_tokens
        if max_tokens is None:
            # Unset means "as long as it can be": up to the context length, or what the whole
            # KV cache holds if that is less, rather than a refusal for a limit nobody set.
            cache_room = limits.num_kv_blocks * limits.block_size - num_prompt
            max_tokens = max(1, min(room, cache_room))
            if default_max_tokens is not None:
                # The request's own min_tokens wins over a default it did not send.
                max_tokens = min(max_tokens, max(default_max_tokens, params.min_tokens))
            params = dataclasses.replace(params, max_tokens=max_tokens)
            request = dataclasses.replace(request, sampling_params=params)
        elif max_tokens > room:
            raise InvalidRequestError(
                f"the prompt has {num_prompt} tokens and max_tokens is {max_tokens}, "
                f"but the context length is {limits.max_model_len}; lower max_tokens to at most "
                f"{room} or shorten the prompt",
                "max_tokens",
                CONTEXT_LENGTH_EXCEEDED,
            )
        blocks = self._blocks_held(num_prompt + max_tokens)
        if blocks > limits.num_kv_blocks:
            raise InvalidRequestError(
                f"the request needs {blocks} KV blocks ({num_prompt} prompt + {max_tokens}"
                f" max_tokens) but the whole cache has {limits.num_kv_blocks}; lower "
                "max_tokens or start the server with more --num-kv-blocks",
                "max_tokens",
            )
        check_priority(request.priority)
        return request

    def _blocks_held(self, max_len: int) -> int:
        block_size = self.limits.block_size
        if self.static_batching:
            return blocks_needed(max_len, block_size)
        window = self.limits.sliding_window
        return max_blocks_held(max_len, block_size, self.max_num_batched_tokens, window)

    def _check_prompt(self, prompt_token_ids: list[int]) -> None:
        limits = self.limits
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty; send at least one token", "prompt")
        if len(prompt_token_ids) >= limits.max_model_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_token_ids)} tokens but the context length is "
                f"{limits.max_model_len}, which must also leave room for one generated token",
                "prompt",
                CONTEXT_LENGTH_EXCEEDED,
            )
        # min/max run in C: this check runs on the event loop for prompts of any length.
        low, high = min(prompt_token_ids), max(prompt_token_ids)
        if low < 0 or high >= limits.vocab_size:
            bad = low if low < 0 else high
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary [0, {limits.vocab_size})", "prompt"
            )
