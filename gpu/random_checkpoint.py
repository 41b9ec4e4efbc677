"""Write small random-weight Hugging Face checkpoints, with a real tokenizer, for tests and
benchmarks; nothing is downloaded.

The tokenizer is byte-level BPE trained with `tokenizers` on the documentation topics that ship
with CPython (`pydoc_data`), so prompts tokenize like English text.

    python -m gpu.random_checkpoint --out /tmp/tiny --family llama --preset bench
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|begin|>", "<|end|>", "<|pad|>"]

# Shapes by name: "tiny" for fast tests, "bench" for the ~30M-parameter offline benchmark.
PRESETS = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
    "bench": dict(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8192,
    ),
}

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def training_text() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def train_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer wrapped as a transformers fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    bos = tokenizer.token_to_id("<|begin|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin|> $A", pair="<|begin|> $A <|begin|> $B", special_tokens=[("<|begin|>", bos)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def model_config(family: str, vocab_size: int, bos: int, eos: int, **overrides):
    """A transformers config of the given family with Baton's test defaults."""
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }
    if family not in classes:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    settings = dict(
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    if family == "mistral":
        settings["sliding_window"] = None
    settings.update(overrides)
    return classes[family](**settings)


def write_checkpoint(
    out: str | Path,
    family: str = "llama",
    preset: str = "tiny",
    seed: int = 0,
    tokenizer=None,
    **overrides,
) -> Path:
    """Save a random-weight `{family}` checkpoint of shape `preset` (plus `overrides`) to `out`."""
    import torch
    import transformers

    out = Path(out)
    shape = {**PRESETS[preset], **overrides}
    if tokenizer is None:
        tokenizer = train_tokenizer(shape["vocab_size"])
    config = model_config(family, bos=tokenizer.bos_token_id, eos=tokenizer.eos_token_id, **shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def write_config_folder(config_file: str | Path, out: str | Path) -> Path:
    """A weightless checkpoint folder for `--load-format dummy`: `config_file` as config.json
    plus this module's small tokenizer (ids past its vocabulary decode to nothing)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(Path(config_file).read_text())
    train_tokenizer(512).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--family", choices=FAMILIES, default="llama")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = write_checkpoint(args.out, args.family, args.preset, args.seed)
    print(f"wrote a random {args.family} checkpoint ({args.preset}) to {path}")


if __name__ == "__main__":
    main()
