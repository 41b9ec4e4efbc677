"""The generic path's speed beside its two anchors, on random checkpoints of the `bench` shape
(or `--shape wide`) saved by transformers: one stream against transformers' own `generate`, and
several streams against the native path where Baton has a native model (Llama).

    python benchmarks/generic_path.py                      # llama, glm4, gptj; 1 and 8 streams
    python benchmarks/generic_path.py --families gptj --streams 1 --rounds 5 --threads 1
    python benchmarks/generic_path.py --families llama --shape wide --streams 1 8 16

OpenMP's threads wait passively, as under `baton serve` (docs/decisions.md). Every contender is
built once and warmed up, then the rounds run them in turn (generic, anchor, generic, ...) so
that a noisy machine weighs on both alike. A run is one batch of `streams` greedy requests
(prompt `--prompt-len`, `--new-tokens` each, `ignore_eos`; transformers `generate` with
`min_new_tokens`), timed whole: generated tokens per wall second, and per CPU second of the
process (all threads; steadier than wall time on a shared machine, though it counts threads that
spin). Ratios are of the medians. Each request's tokens are checked equal to the generic path's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from baton.kernels.cpu_threads import prefer_passive_waits

# Before torch loads, as `baton serve` does: torch's OpenMP threads then sleep after its
# parallel ops instead of spinning on the cores Baton's kernel threads compute on.
prefer_passive_waits()

import torch  # noqa: E402
import transformers  # noqa: E402

from baton.app.llm import LLM  # noqa: E402
from baton.core.sampling_params import SamplingParams  # noqa: E402
from baton.tools.tokenizer_trainer import train_tokenizer  # noqa: E402

VOCAB = 8192
# (hidden, intermediate, layers, heads, KV heads). `bench` is the preset of that name
# (baton.tools.random_checkpoint); `wide` has TinyLlama-1.1B's layers, 4 of its 22, where a
# layer's matmuls outweigh its few dozen small torch calls as in the models people serve.
SHAPES = {"bench": (512, 1408, 8, 8, 4), "wide": (2048, 5632, 4, 32, 4)}
# What each family adds to Llama, in comments beside its config class.
FAMILIES = {
    "llama": "LlamaConfig",
    # fused gate/up and qkv, interleaved partial rotary, post-sublayer norms
    "glm4": "Glm4Config",
    # parallel attention and MLP, interleaved rotary on a quarter of each head, biases
    "gptj": "GPTJConfig",
}
Run = Callable[[list[list[int]]], list[list[int]]]


def family_shape(family: str, shape: str) -> dict:
    """The config fields of `shape` in `family`'s own names."""
    hidden, intermediate, layers, heads, kv_heads = SHAPES[shape]
    if family == "gptj":
        return dict(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=2048, rotary_dim=16)
    fields = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers)
    fields |= dict(num_attention_heads=heads, num_key_value_heads=kv_heads)
    fields |= dict(max_position_embeddings=2048)
    return fields | dict(partial_rotary_factor=0.5) if family == "glm4" else fields


def write_family(out: Path, family: str, tokenizer, shape: str = "bench") -> Path:
    config = getattr(transformers, FAMILIES[family])(
        **family_shape(family, shape),
        vocab_size=VOCAB,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def baton_run(path: Path, impl: str, streams: int, new_tokens: int) -> Run:
    llm = LLM(path, device="cpu", model_impl=impl, max_num_seqs=max(streams, 8))
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return lambda prompts: [r.token_ids for r in llm.generate(prompts, params)]


def generate_run(path: Path, new_tokens: int) -> Run:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    @torch.inference_mode()
    def run(prompts: list[list[int]]) -> list[list[int]]:
        (prompt,) = prompts
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return [out[0, len(prompt) :].tolist()]

    return run


def timed(run: Run, prompts: list[list[int]]) -> tuple[float, float, list[list[int]]]:
    """Wall seconds, this process's CPU seconds (every thread), and the tokens of one run."""
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens = run(prompts)
    return time.perf_counter() - start, time.process_time() - cpu_start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--shape", default="bench", choices=SHAPES, help="the layers' size")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="runs per contender, interleaved")
    parser.add_argument(
        "--threads", type=int, help="torch's (and Baton's kernels') threads; default: torch's"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tokenizer = train_tokenizer(512)
    rng = random.Random(0)
    results: list[tuple[str, int, str, tuple[list[float], list[float]]]] = []
    for family in args.families:
        folder = Path(tempfile.mkdtemp(prefix=f"baton-{family}-"))
        path = write_family(folder, family, tokenizer, args.shape)
        for streams in args.streams:
            if streams == 1:
                anchor_name, anchor = "generate", generate_run(path, args.new_tokens)
            elif family == "llama":
                anchor_name = "native"
                anchor = baton_run(path, "native", streams, args.new_tokens)
            else:
                continue
            generic = baton_run(path, "transformers", streams, args.new_tokens)
            prompts = [
                [rng.randrange(3, VOCAB) for _ in range(args.prompt_len)] for _ in range(streams)
            ]
            warm_up = [[3] * args.prompt_len] * streams
            generic(warm_up), anchor(warm_up)
            rates: dict[str, tuple[list[float], list[float]]] = {}
            for _ in range(args.rounds):
                for name, run in (("generic", generic), (anchor_name, anchor)):
                    elapsed, cpu, tokens = timed(run, prompts)
                    num_tokens = streams * args.new_tokens
                    walls, cpus = rates.setdefault(name, ([], []))
                    walls.append(num_tokens / elapsed)
                    cpus.append(num_tokens / cpu)
                    if name == "generic":
                        expected = tokens
                    same = sum(a == b for a, b in zip(tokens, expected, strict=True))
                    print(
                        f"{family} x{streams} {name:>9}: {walls[-1]:7.1f} tok/s, "
                        f"{cpus[-1]:7.1f} tok per CPU s ({same}/{streams} requests as generic)"
                    )
            results.extend((family, streams, name, rate) for name, rate in rates.items())
    print("\n| model | streams | contender | tok/s (rounds) | tok per CPU s (rounds) | ratio |")
    print("|---|---|---|---|---|---|")
    for index in range(0, len(results), 2):
        (family, streams, _, generic), (_, _, anchor_name, anchor) = results[index : index + 2]
        wall, cpu = (statistics.median(generic[i]) / statistics.median(anchor[i]) for i in (0, 1))
        ratios = f"**{wall:.2f}×** wall, {cpu:.2f}× CPU"
        for name, (walls, cpus), cell in (("generic", generic, ratios), (anchor_name, anchor, "")):
            print(
                f"| {family} | {streams} | {name} | {median_and_rounds(walls)} | "
                f"{median_and_rounds(cpus)} | {cell} |"
            )


def median_and_rounds(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)})"


if __name__ == "__main__":
    main()
