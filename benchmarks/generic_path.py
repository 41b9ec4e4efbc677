"""The generic path's speed beside its two anchors, on random checkpoints of the `bench` shape
saved by transformers: one stream against transformers' own `generate`, and several streams
against the native path where Baton has a native model (Llama).

    python benchmarks/generic_path.py                      # llama, glm4, gptj; 1 and 8 streams
    python benchmarks/generic_path.py --families gptj --streams 1 --rounds 5

Every contender is built once and warmed up, then the rounds run them in turn (generic, anchor,
generic, ...) so that a noisy machine weighs on both alike. A run is one batch of `streams`
greedy requests (prompt `--prompt-len`, `--new-tokens` each, `ignore_eos`; transformers
`generate` with `min_new_tokens`), timed whole; the figure is generated tokens per second and
the ratio is of the medians. Each request's tokens are checked equal to the generic path's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.tools.tokenizer_trainer import train_tokenizer

VOCAB = 8192
# The `bench` preset's shape (baton.tools.random_checkpoint), in each family's own config names.
LLAMA_SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8)
LLAMA_SHAPE |= dict(num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
FAMILIES = {
    "llama": ("LlamaConfig", LLAMA_SHAPE),
    # fused gate/up and qkv, interleaved partial rotary, post-sublayer norms
    "glm4": ("Glm4Config", LLAMA_SHAPE | dict(partial_rotary_factor=0.5)),
    # parallel attention and MLP, interleaved rotary on a quarter of each head, biases
    "gptj": ("GPTJConfig", dict(n_embd=512, n_layer=8, n_head=8, n_positions=2048, rotary_dim=16)),
}
Run = Callable[[list[list[int]]], list[list[int]]]


def write_family(out: Path, family: str, tokenizer) -> Path:
    config_class, shape = FAMILIES[family]
    config = getattr(transformers, config_class)(
        **shape, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=None
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


def timed(run: Run, prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    tokens = run(prompts)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="runs per contender, interleaved")
    args = parser.parse_args()

    tokenizer = train_tokenizer(512)
    rng = random.Random(0)
    results: list[tuple[str, int, str, list[float]]] = []
    for family in args.families:
        path = write_family(Path(tempfile.mkdtemp(prefix=f"baton-{family}-")), family, tokenizer)
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
            times: dict[str, list[float]] = {"generic": [], anchor_name: []}
            for _ in range(args.rounds):
                for name, run in (("generic", generic), (anchor_name, anchor)):
                    elapsed, tokens = timed(run, prompts)
                    times[name].append(streams * args.new_tokens / elapsed)
                    if name == "generic":
                        expected = tokens
                    same = sum(a == b for a, b in zip(tokens, expected, strict=True))
                    print(f"{family} x{streams} {name:>9}: {times[name][-1]:7.1f} tok/s", end="")
                    print(f"  ({same}/{streams} requests the generic path's tokens)")
            for name, values in times.items():
                results.append((family, streams, name, values))
    print("\n| model | streams | contender | tok/s (median) | rounds | generic / anchor |")
    print("|---|---|---|---|---|---|")
    for index in range(0, len(results), 2):
        (family, streams, _, generic), (_, _, anchor_name, anchor) = results[index : index + 2]
        ratio = statistics.median(generic) / statistics.median(anchor)
        for name, values, cell in (
            ("generic", generic, f"**{ratio:.2f}×**"),
            (anchor_name, anchor, ""),
        ):
            rounds = ", ".join(f"{v:.1f}" for v in values)
            print(
                f"| {family} | {streams} | {name} | {statistics.median(values):.1f} | "
                f"{rounds} | {cell} |"
            )


if __name__ == "__main__":
    main()
