"""Offline throughput: Baton's continuous batching against transformers `generate` in static
batches of the same size, on the same checkpoint, dtype and threads, in one run.

    python benchmarks/offline_throughput.py                 # ~30M-param random Llama, CPU
    python benchmarks/offline_throughput.py --model DIR --device cuda --dtype bfloat16

Workload: N requests, prompt and output lengths uniform in [min_len, max_len], greedy,
ignore_eos. Both sides are credited only with the tokens each request asked for; a static batch
runs until its longest request is done, which is exactly the waste continuous batching removes.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers

from app.llm import LLM
from core.sampling_params import SamplingParams
from gpu.random_checkpoint import write_checkpoint


def make_workload(n: int, lo: int, hi: int, vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    outputs = [rng.randint(lo, hi) for _ in range(n)]
    return prompts, outputs


def run_baton(model: Path, prompts, outputs, args) -> tuple[float, int, int]:
    llm = LLM(
        model,
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]
    llm.generate(prompts[:2], params[:2])  # warm-up
    start = time.perf_counter()
    results = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    produced = sum(len(r.token_ids) for r in results)
    assert produced == sum(outputs), "every request must get exactly its max_tokens"
    num_params = sum(p.numel() for p in llm.engine.executor.model.parameters())
    return elapsed, produced, num_params


def run_transformers(model: Path, prompts, outputs, args) -> tuple[float, int]:
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    device = "cuda" if args.device == "cuda" else "cpu"
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        model, dtype=dtype or (torch.float32 if device == "cpu" else torch.bfloat16)
    ).to(device)
    hf.eval()
    pad = 0

    def generate_batch(batch_prompts, num_new: int) -> None:
        width = max(map(len, batch_prompts))
        # Left padding, as decoder-only batched generation requires.
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch_prompts], device=device)
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts], device=device
        )
        with torch.inference_mode():
            hf.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=num_new,
                min_new_tokens=num_new,
                do_sample=False,
                pad_token_id=pad,
            )

    generate_batch(prompts[:2], 2)  # warm-up
    start = time.perf_counter()
    for i in range(0, len(prompts), args.batch_size):
        batch = slice(i, i + args.batch_size)
        generate_batch(prompts[batch], max(outputs[batch]))
    elapsed = time.perf_counter() - start
    return elapsed, sum(outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="checkpoint (default: a random ~30M Llama)")
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="max_num_seqs = HF batch")
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or write_checkpoint(Path(scratch) / "bench", "llama", "bench")
        config = json.loads((model / "config.json").read_text())
        prompts, outputs = make_workload(
            args.num_requests, args.min_len, args.max_len, config["vocab_size"], args.seed
        )
        baton_s, tokens, num_params = run_baton(model, prompts, outputs, args)
        hf_s, _ = run_transformers(model, prompts, outputs, args)

    print(
        json.dumps(
            {
                "machine": f"{platform.processor() or platform.machine()}, "
                f"{torch.get_num_threads()} threads, torch {torch.__version__}",
                "requests": args.num_requests,
                "batch_size": args.batch_size,
                "output_tokens": tokens,
                "baton_s": round(baton_s, 2),
                "baton_tok_s": round(tokens / baton_s, 1),
                "transformers_s": round(hf_s, 2),
                "transformers_tok_s": round(tokens / hf_s, 1),
                "speedup": round(hf_s / baton_s, 2),
                "model_params_m": round(num_params / 1e6, 1),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
