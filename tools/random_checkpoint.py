"""Write small random-weight Hugging Face checkpoints, with a real tokenizer, for tests and
benchmarks; nothing is downloaded. The tokenizer is `baton.tools.tokenizer_trainer`'s.

    python -m baton.tools.random_checkpoint --out /tmp/tiny --family llama --preset bench
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from baton.tools.tokenizer_trainer import train_tokenizer

# Shapes by name: "tiny" for fast tests, "bench" for the ~30M-parameter offline benchmark,
# "bench-0.4b" for a ~0.37B model (Qwen2.5-0.5B's layers with a small vocabulary) where the
# weights, not the step's fixed cost, dominate a CPU decode step.
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
    "bench-0.4b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=8192,
    ),
}

FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3",
    "phi3",
    "mixtral",
    "qwen3_moe",
    "gpt_oss",
)

# What each family's tiny checkpoint sets beyond the shape: Gemma's and gpt-oss's head size
# (their defaults are 256 and 64) and window, the experts of the MoE families.
FAMILY_DEFAULTS = {
    "gemma2": dict(head_dim=16, sliding_window=16),
    "gemma3": dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=16),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True
    ),
    "gpt_oss": dict(head_dim=16, sliding_window=16, num_local_experts=4, num_experts_per_tok=2),
}
# The bench shape's head size (hidden / heads) where a family's default or tiny one differs,
# and experts a quarter of the dense MLP's width; gpt-oss's in its own proportions (top-4 of its
# experts, each as wide as the hidden size, a 128-token window on every other layer).
BENCH_FAMILY_DEFAULTS = {
    "gemma2": dict(head_dim=64, query_pre_attn_scalar=64),
    "gemma3": dict(head_dim=64, query_pre_attn_scalar=64),
    "qwen3_moe": dict(head_dim=64, moe_intermediate_size=352),
    "gpt_oss": dict(
        head_dim=64,
        intermediate_size=512,
        num_local_experts=16,
        num_experts_per_tok=4,
        sliding_window=128,
    ),
}


def model_config(family: str, vocab_size: int, bos: int, eos: int, **overrides):
    """A transformers config of the given family with Baton's test defaults."""
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma2": transformers.Gemma2Config,
        "gemma3": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "mixtral": transformers.MixtralConfig,
        "qwen3_moe": transformers.Qwen3MoeConfig,
        "gpt_oss": transformers.GptOssConfig,
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
    if family in ("mistral", "mixtral", "phi3"):
        settings["sliding_window"] = None
    settings.update(FAMILY_DEFAULTS.get(family, {}))
    settings.update(overrides)
    if family == "gemma3" and "layer_types" not in overrides:
        # Sliding and global layers alternating, so a tiny model has both (Gemma 3's own
        # default is one global layer in six).
        kinds = ("sliding_attention", "full_attention")
        settings["layer_types"] = [kinds[i % 2] for i in range(settings["num_hidden_layers"])]
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
    if preset == "bench":
        shape = {**PRESETS[preset], **BENCH_FAMILY_DEFAULTS.get(family, {}), **overrides}
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
