"""A draft model's speculation at one stream (`--speculative-method draft`) beside Baton
without speculation, offline, on random checkpoints of one of random_checkpoint's shapes.

    python benchmarks/draft_model.py                        # the bench Llama, 3 rounds
    python benchmarks/draft_model.py --preset bench-0.4b --output-len 64

Random weights agree with no small model, so the target is built to be predictable: its decoder
layers past the first `--draft-layers` have their output projections scaled by `DAMPING`, which
leaves their cost as it was (every weight is still read) while they barely move the residual
stream. Its first `--draft-layers` layers with its embeddings, norm and head are then a draft
model that is right almost always: `draft` is the upper bound of a draft model of that size.
`random-draft` is a random model of the same shape and vocabulary, almost always wrong: the
cost of a draft model the planner learns not to use. Each side is built once and warmed up,
then the rounds run the sides in turn (in reverse on odd rounds); a figure is the median over
rounds of output tokens per wall second and per CPU second of the process (all threads), each
ratio (x) against plain Baton's. Every side's tokens are checked equal to plain Baton's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from safetensors.torch import load_file, save_file

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.tools.random_checkpoint import PRESETS, write_checkpoint
from baton.tools.tokenizer_trainer import train_tokenizer

# What the target's later layers add to the residual stream, against a random layer's.
DAMPING = 1e-3
# The projections that write a decoder layer's output into the residual stream.
OUTPUT_PROJECTIONS = (".self_attn.o_proj.weight", ".mlp.down_proj.weight")


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[2]) if name.startswith("model.layers.") else None


def build_checkpoints(root: Path, preset: str, draft_layers: int) -> dict[str, Path]:
    """The damped target, its truncation and a random draft of the truncation's shape."""
    tokenizer = train_tokenizer(PRESETS[preset]["vocab_size"])
    paths = {name: root / name for name in ("target", "draft", "random-draft")}
    if all((path / "config.json").is_file() for path in paths.values()):
        return paths
    write_checkpoint(paths["target"], "llama", preset, tokenizer=tokenizer)
    write_checkpoint(
        paths["random-draft"],
        "llama",
        preset,
        seed=1,
        tokenizer=tokenizer,
        num_hidden_layers=draft_layers,
    )
    weights = load_file(paths["target"] / "model.safetensors")
    for name, tensor in weights.items():
        layer = layer_of(name)
        if layer is not None and layer >= draft_layers and name.endswith(OUTPUT_PROJECTIONS):
            weights[name] = tensor * DAMPING
    save_file(weights, paths["target"] / "model.safetensors", metadata={"format": "pt"})
    kept = {k: v for k, v in weights.items() if (layer_of(k) or 0) < draft_layers}
    write_checkpoint(paths["draft"], "llama", preset, tokenizer=tokenizer)
    save_file(kept, paths["draft"] / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((paths["draft"] / "config.json").read_text())
    config["num_hidden_layers"] = draft_layers
    (paths["draft"] / "config.json").write_text(json.dumps(config))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="bench", choices=("bench", "bench-0.4b"))
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/baton-draft-model"))
    args = parser.parse_args()

    paths = build_checkpoints(args.dir / args.preset, args.preset, args.draft_layers)
    speculative = dict(
        speculative_method="draft", num_speculative_tokens=args.num_speculative_tokens
    )
    sides = {
        "baton": LLM(paths["target"], device="cpu"),
        "baton+draft": LLM(
            paths["target"], device="cpu", speculative_model=str(paths["draft"]), **speculative
        ),
        "baton+random-draft": LLM(
            paths["target"],
            device="cpu",
            speculative_model=str(paths["random-draft"]),
            **speculative,
        ),
    }
    rng = random.Random(0)
    prompt = [rng.randrange(3, PRESETS[args.preset]["vocab_size"]) for _ in range(args.prompt_len)]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    reference = sides["baton"].generate([prompt], params)[0].token_ids
    for name, llm in sides.items():
        assert llm.generate([prompt], params)[0].token_ids == reference, name
    figures: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in sides}
    loads = [os.getloadavg()[0]]
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            wall, cpu = time.perf_counter(), time.process_time()
            tokens = sides[name].generate([prompt], params)[0].token_ids
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert tokens == reference, name
            figures[name]["wall"].append(len(tokens) / wall)
            figures[name]["cpu"].append(len(tokens) / cpu)
        loads.append(os.getloadavg()[0])
    plain = {key: statistics.median(figures["baton"][key]) for key in ("wall", "cpu")}
    load = f"load {min(loads):.1f}-{max(loads):.1f}"
    print(f"| side | tokens/s | x | tokens/CPU-s | x | acceptance | ({load})")
    print("|---|---|---|---|---|---|")
    for name, llm in sides.items():
        wall, cpu = (statistics.median(figures[name][key]) for key in ("wall", "cpu"))
        spec = llm.engine.make_stats().spec_decode
        rate = (
            "-" if spec is None or spec.acceptance_rate is None else f"{spec.acceptance_rate:.2f}"
        )
        print(
            f"| {name} | {wall:.1f} | {wall / plain['wall']:.2f} | {cpu:.1f} "
            f"| {cpu / plain['cpu']:.2f} | {rate} |"
        )


if __name__ == "__main__":
    main()
