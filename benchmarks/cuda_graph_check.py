"""End-to-end check of the CUDA path: the same greedy requests through CUDA-graph replay, the
eager Triton path and the torch references, on one checkpoint, in one run.

    python benchmarks/cuda_graph_check.py                       # Qwen3-0.6B shape, dummy weights
    python benchmarks/cuda_graph_check.py --config benchmarks/configs/llama-3.1-8b.json
    python benchmarks/cuda_graph_check.py --device cpu --tiny   # smoke run: references only

Three engines get the same prompts (mixed lengths, so steps go from mixed prefill to decode-only
batches of shrinking size, i.e. every padded graph size below the batch): graphs (the default
CUDA path), `enforce_eager=True` (Triton, no graphs) and `enforce_eager=True` under
`baton.kernels.ops.force_reference()` (the plain-torch references on the GPU). It reports, per pair,
how many requests generated the same tokens and where the first one differs, and for the graph
engine how many of its steps replayed a graph. Run it in float32 for an exactness check (the
Triton kernels then compute in IEEE fp32, so all three should agree token for token; random
weights make near ties, so a rare late divergence is possible and is reported, not hidden), and
in bfloat16 to see that the served dtype runs. Needs only torch, triton, transformers,
tokenizers, safetensors and numpy (nothing of the web stack).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch

from baton.app.llm import LLM
from baton.core.sampling_params import SamplingParams
from baton.kernels import ops

CONFIGS = Path(__file__).resolve().parent / "configs"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "qwen3-0.6b.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama, for a CPU smoke run")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    return parser.parse_args()


def tiny_config(folder: Path) -> Path:
    from baton.tools.random_checkpoint import write_checkpoint

    return write_checkpoint(folder, "llama", "tiny")


def run_engine(args: argparse.Namespace, model: Path, prompts, *, eager: bool, reference: bool):
    """Greedy tokens per prompt, the executor's step counters and the generation time."""
    llm = LLM(
        model,
        device=args.device,
        dtype=args.dtype,
        load_format="dummy",
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        num_kv_blocks=args.num_kv_blocks,
        enforce_eager=eager,
        seed=args.seed,
    )
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    forcing = ops.force_reference() if reference else contextlib.nullcontext()
    with forcing:
        start = time.perf_counter()
        results = llm.generate(prompts, params)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    executor = llm.engine.executor
    counters = {
        "steps": executor.num_steps,
        "graph_steps": executor.num_graph_steps,
        "captured_sizes": executor.graphs.captured_sizes if executor.graphs else [],
        "host_share": round(executor.host_time_s / max(executor.step_time_s, 1e-9), 3),
        "seconds": round(elapsed, 3),
    }
    tokens = [list(r.token_ids) for r in results]
    del llm
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return tokens, counters


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """How many requests agree token for token, and the earliest position any of them differ."""
    first_diffs = [
        next((i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y), None)
        for ta, tb in zip(a, b, strict=True)
    ]
    differing = [d for d in first_diffs if d is not None]
    return {
        "identical": len(a) - len(differing),
        "requests": len(a),
        "earliest_difference": min(differing) if differing else None,
    }


def main() -> None:
    args = parse_args()
    model = args.config
    if args.tiny:
        import tempfile

        model = tiny_config(Path(tempfile.mkdtemp(prefix="baton-graph-check-")) / "tiny")
        args.max_model_len = min(args.max_model_len, 256)
        args.num_kv_blocks = min(args.num_kv_blocks, 256)
    rng = random.Random(args.seed)
    longest = min(300, args.max_model_len - args.max_tokens)
    prompts = [
        [rng.randrange(3, 500) for _ in range(rng.randint(4, longest))]
        for _ in range(args.num_requests)
    ]
    graphs, graph_counters = run_engine(args, model, prompts, eager=False, reference=False)
    eager, eager_counters = run_engine(args, model, prompts, eager=True, reference=False)
    reference, reference_counters = run_engine(args, model, prompts, eager=True, reference=True)
    report = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "config": str(args.config) if not args.tiny else "tiny llama",
        "dtype": args.dtype,
        "graphs": graph_counters,
        "eager": eager_counters,
        "reference": reference_counters,
        "graphs_vs_eager": compare(graphs, eager),
        "eager_vs_reference": compare(eager, reference),
        "graphs_vs_reference": compare(graphs, reference),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
