"""Train the byte-level BPE tokenizer of Baton's test checkpoints and demo model, offline.

`tokenizers` learns the merges from text that ships with CPython; the result is wrapped as a
transformers fast tokenizer carrying Baton's chat template, ready for `save_pretrained`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def help_topics() -> list[str]:
    """The help topics of `pydoc_data`, CPython's bundled documentation, in a fixed order."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def train_tokenizer(
    vocab_size: int,
    texts: Iterable[str] | None = None,
    role_tokens: Sequence[str] = (),
    prepend_bos: bool = True,
) -> PreTrainedTokenizerFast:
    """Byte-level BPE with `vocab_size` entries learned from `texts` (default: `help_topics()`).

    BOS, EOS and PAD are special tokens, and so are `role_tokens` when given; `prepend_bos`
    makes encoding with special tokens start with BOS.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, *role_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(help_topics() if texts is None else texts, trainer=trainer)
    if prepend_bos:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A",
            pair=f"{BOS} $A {BOS} $B",
            special_tokens=[(BOS, backend.token_to_id(BOS))],
        )
    # Passed only when there are some: an empty list would still be written to the config.
    roles = {"additional_special_tokens": list(role_tokens)} if role_tokens else {}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD, **roles
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
