"""Why Baton refuses a model at load: one error type carrying a reason from a short fixed list,
so a caller (the sweep over transformers' causal LMs, a log search) reads the cause, not prose.
"""

from __future__ import annotations

from enum import Enum


class RefusalReason(Enum):
    """The causes a model is refused for; the value is the short name tables and tests use."""

    # Conv / SSM / linear-attention layers whose state the paged KV cache does not hold.
    RECURRENT_STATE = "recurrent_state"
    # The decoder half of an encoder-decoder model: it reads an encoder's output.
    ENCODER_DECODER = "encoder_decoder"
    # Attention that looks at later tokens too (an encoder used as an LM head).
    NOT_CAUSAL = "not_causal"
    # A vision/audio model whose generation class needs more than token ids.
    MULTIMODAL = "multimodal"
    # The checkpoint names no *ForCausalLM / *LMHeadModel class, or transformers maps none to
    # its config (the text part of a multimodal model saved alone).
    NO_CAUSAL_LM_CLASS = "no_causal_lm_class"
    # The architecture is not in the installed transformers; Baton runs no checkpoint code.
    NEEDS_REMOTE_CODE = "needs_remote_code"
    # transformers' class computes attention itself instead of through its attention interface.
    NO_ATTENTION_INTERFACE = "no_attention_interface"
    # Layers hand attention different numbers of key/value heads from one another.
    KV_SHAPES_DIFFER = "kv_shapes_differ"
    # A mask or bias the model adds to the attention scores itself (learned, ALiBi).
    ATTENTION_BIAS = "attention_bias"
    # Layers that reuse another layer's (or another model's) keys and values.
    SHARED_KV = "shared_kv"
    # Soft-capped attention logits, which the paged kernels do not apply.
    ATTENTION_SOFTCAP = "attention_softcap"
    # Attention with learned sink logits, which the paged kernels do not add yet (issue 42).
    # Attention that reads a learned index or compressed cache beside the keys and values.
    SPARSE_ATTENTION = "sparse_attention"
    # Positions numbered from the padding id on (RoBERTa), not from the sequence's start.
    POSITIONS_AFTER_PADDING = "positions_after_padding"
    # Anything that the config or the model's layout rules out for the native or generic path.
    UNSUPPORTED_LAYOUT = "unsupported_layout"


class UnsupportedModelError(ValueError):
    """A model Baton cannot serve exactly; the message says why and what to do, `reason` is the
    machine-readable cause."""

    def __init__(
        self, message: str, reason: RefusalReason = RefusalReason.UNSUPPORTED_LAYOUT
    ) -> None:
        super().__init__(message)
        self.reason = reason
