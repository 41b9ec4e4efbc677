"""Offline throughput: Baton's continuous batching against transformers on the same model, dtype,
threads and device, in one run: its `generate` in static batches of the same size and its own
continuous batching (`generate_batch`'s manager).

    python benchmarks/offline_throughput.py                      # ~30M-param random Llama, CPU
    python benchmarks/offline_throughput.py --preset qwen3-0.6b  # nano-vllm's workload, GPU
    python benchmarks/offline_throughput.py --preset llama-3.1-8b
    python benchmarks/offline_throughput.py --model DIR --device cuda --dtype bfloat16
    python benchmarks/offline_throughput.py --family mixtral     # a random bench-size Mixtral
    python benchmarks/offline_throughput.py --contenders baton --quantization int8  # CPU int8

Workload: N requests, prompt and output lengths uniform in the given ranges, greedy, ignore_eos.
Every side is credited only with the tokens each request asked for; a static batch runs until
its longest request is done, which is exactly the waste continuous batching removes. The GPU
presets use random weights from a shipped config (`--load-format dummy`), so nothing is
downloaded; the script needs only torch, transformers, tokenizers, safetensors and numpy.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
import transformers

from baton.app.llm import LLM
from baton.core.config import QUANTIZATIONS
from baton.core.sampling_params import SamplingParams
from baton.tools.random_checkpoint import FAMILIES, write_checkpoint

CONFIGS = Path(__file__).parent / "configs"
CONTENDERS = ("baton", "generate", "generate_batch")
# Not the workload's prompts: a warm-up on those would leave them in Baton's prefix cache.
WARM_UP_PROMPTS = [[3] * 24, [4] * 40]

# Settings per preset; command-line flags given explicitly win.
PRESETS: dict[str, dict] = {
    # The engine core issue's CPU target: a ~30M Llama, lengths uniform in [32, 256].
    "cpu": dict(
        num_requests=64,
        input_len=(32, 256),
        output_len=(32, 256),
        batch_size=64,
        max_num_batched_tokens=2048,
        device="cpu",
        dtype="float32",
    ),
    # nano-vllm's benchmark: Qwen3-0.6B, 256 requests, input and output uniform in [100, 1024].
    "qwen3-0.6b": dict(
        model=CONFIGS / "qwen3-0.6b.json",
        load_format="dummy",
        num_requests=256,
        input_len=(100, 1024),
        output_len=(100, 1024),
        batch_size=256,
        max_num_batched_tokens=16384,
        max_model_len=2048,
        device="cuda",
        dtype="bfloat16",
    ),
    # The GPU issue's 8B workload: 1000 requests of 512 tokens in, 256 out.
    "llama-3.1-8b": dict(
        model=CONFIGS / "llama-3.1-8b.json",
        load_format="dummy",
        num_requests=1000,
        input_len=(512, 512),
        output_len=(256, 256),
        batch_size=256,
        max_num_batched_tokens=8192,
        max_model_len=768,
        device="cuda",
        dtype="bfloat16",
    ),
}


class Stopwatch:
    """Wall seconds and this process's CPU seconds (all its threads) since it was made: on a
    machine other jobs share, the CPU seconds of each side are the steadier figure."""

    def __init__(self) -> None:
        self.wall_start = time.perf_counter()
        self.cpu_start = time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall_start, time.process_time() - self.cpu_start


def make_workload(
    n: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int
) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(*input_len))] for _ in range(n)]
    outputs = [rng.randint(*output_len) for _ in range(n)]
    return prompts, outputs


def torch_dtype(args: argparse.Namespace) -> torch.dtype:
    if args.dtype == "auto":
        return torch.float32 if args.device == "cpu" else torch.bfloat16
    return getattr(torch, args.dtype)


def release_memory() -> None:
    """Let the next contender have the device's memory (Baton sizes its KV cache to fill it)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_baton(model: Path, prompts, outputs, args) -> tuple[tuple[float, float], tuple[int, int]]:
    """(Wall, CPU) seconds for the workload, and the model's (parameter count, parameter
    bytes)."""
    llm = LLM(
        model,
        device=args.device,
        dtype=args.dtype,
        load_format=args.load_format,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        quantization=args.quantization,
    )
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in outputs]
    llm.generate(WARM_UP_PROMPTS, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    stopwatch = Stopwatch()
    results = llm.generate(prompts, params)
    elapsed = stopwatch.read()
    assert [len(r.token_ids) for r in results] == outputs, "each request gets its max_tokens"
    model_params = list(llm.engine.executor.model.parameters())
    sizes = (sum(p.numel() for p in model_params), sum(p.nbytes for p in model_params))
    del llm, results
    release_memory()
    return elapsed, sizes


def load_transformers(model: Path, args) -> transformers.PreTrainedModel:
    dtype = torch_dtype(args)
    if args.load_format == "dummy":
        config = transformers.AutoConfig.from_pretrained(model)
        # Random weights built on the device itself: initializing an 8B model on the host and
        # copying it over would take minutes.
        with torch.device(args.device):
            hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(args.device)
    return hf.eval()


def run_generate(hf, prompts, outputs, args) -> tuple[float, float]:
    pad = 0

    def generate_batch(batch_prompts, num_new: int) -> None:
        width = max(map(len, batch_prompts))
        # Left padding, as decoder-only batched generation requires.
        ids = [[pad] * (width - len(p)) + p for p in batch_prompts]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts]
        with torch.inference_mode():
            hf.generate(
                input_ids=torch.tensor(ids, device=args.device),
                attention_mask=torch.tensor(mask, device=args.device),
                max_new_tokens=num_new,
                min_new_tokens=num_new,
                do_sample=False,
                pad_token_id=pad,
            )

    generate_batch(WARM_UP_PROMPTS, 2)
    stopwatch = Stopwatch()
    for i in range(0, len(prompts), args.static_batch_size):
        batch = slice(i, i + args.static_batch_size)
        generate_batch(prompts[batch], max(outputs[batch]))
    synchronize(args.device)
    return stopwatch.read()


def run_generate_batch(hf, prompts, outputs, args) -> tuple[float, float]:
    """transformers' continuous batching: the manager `generate_batch` drives, fed directly so
    each request can have its own output length; no EOS (-1), like ignore_eos."""
    generation_config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=max(outputs), eos_token_id=-1, pad_token_id=0
    )
    cb_config = transformers.ContinuousBatchingConfig(
        max_requests_per_batch=args.batch_size,
        max_batch_tokens=args.max_num_batched_tokens,
        # On the CPU there is no device memory to size from.
        num_blocks=args.cpu_kv_blocks if args.device == "cpu" else None,
    )
    # Entering warms up (CUDA graph capture); like Baton's warm-up, it is not timed.
    with hf.continuous_batching_context_manager(
        generation_config=generation_config, continuous_batching_config=cb_config
    ) as manager:
        stopwatch = Stopwatch()
        for i, (prompt, num_new) in enumerate(zip(prompts, outputs, strict=True)):
            manager.add_request(prompt, request_id=str(i), max_new_tokens=num_new, eos_token_id=-1)
        produced = {}
        while len(produced) < len(prompts):
            result = manager.get_result(timeout=60)
            if result is None:
                raise RuntimeError(f"generate_batch stalled after {len(produced)} requests")
            if result.is_finished():
                produced[int(result.request_id)] = len(result.generated_tokens)
        elapsed = stopwatch.read()
    assert [produced[i] for i in range(len(prompts))] == outputs, "each request gets its tokens"
    return elapsed


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="cpu")
    parser.add_argument("--model", type=Path, help="checkpoint folder, or a config with dummy")
    parser.add_argument(
        "--family", choices=FAMILIES, default="llama", help="of the random checkpoint, no --model"
    )
    parser.add_argument("--load-format", choices=["auto", "dummy"])
    parser.add_argument("--num-requests", type=int)
    parser.add_argument("--input-len", type=int, nargs=2, metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"))
    parser.add_argument("--batch-size", type=int, help="max_num_seqs = the static batch size")
    parser.add_argument(
        "--static-batch-size", type=int, help="generate's batch, if not --batch-size (memory)"
    )
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--max-model-len", type=int, help="default: the checkpoint's")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument(
        "--quantization", choices=QUANTIZATIONS, default="none", help="Baton's weights"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help=f"comma-separated, of {CONTENDERS}"
    )
    parser.add_argument(
        "--cpu-kv-blocks", type=int, default=512, help="generate_batch's KV blocks on the CPU"
    )
    args = parser.parse_args()
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.load_format = args.load_format or "auto"
    args.static_batch_size = args.static_batch_size or args.batch_size
    args.contenders = args.contenders.split(",")
    unknown = set(args.contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {CONTENDERS}")
    return args


def main() -> None:
    args = parse_args()
    report: dict = {
        "preset": args.preset,
        "family": None if args.model else args.family,
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"transformers {transformers.__version__}",
    }
    if args.device.startswith("cuda"):
        report["device"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or write_checkpoint(Path(scratch) / "bench", args.family, "bench")
        vocab_size = transformers.AutoConfig.from_pretrained(model).vocab_size
        prompts, outputs = make_workload(
            args.num_requests, args.input_len, args.output_len, vocab_size, args.seed
        )
        tokens = sum(outputs)
        report.update(
            requests=args.num_requests,
            batch_size=args.batch_size,
            static_batch_size=args.static_batch_size,
            output_tokens=tokens,
        )
        seconds = {}
        if "baton" in args.contenders:
            seconds["baton"], (num_params, num_bytes) = run_baton(model, prompts, outputs, args)
            report["model_params_m"] = round(num_params / 1e6, 1)
            report["model_weights_mib"] = round(num_bytes / 2**20, 1)
            report["quantization"] = args.quantization
        if {"generate", "generate_batch"} & set(args.contenders):
            hf = load_transformers(model, args)
            if "generate" in args.contenders:
                seconds["generate"] = run_generate(hf, prompts, outputs, args)
                release_memory()  # generate_batch sizes its cache from the free memory
            if "generate_batch" in args.contenders:
                seconds["generate_batch"] = run_generate_batch(hf, prompts, outputs, args)
    for name, (elapsed, cpu) in seconds.items():
        report[f"{name}_s"] = round(elapsed, 2)
        report[f"{name}_cpu_s"] = round(cpu, 2)
        report[f"{name}_tok_s"] = round(tokens / elapsed, 1)
    for name in ("generate", "generate_batch"):
        if "baton" in seconds and name in seconds:
            report[f"speedup_vs_{name}"] = round(seconds[name][0] / seconds["baton"][0], 2)
            report[f"cpu_speedup_vs_{name}"] = round(seconds[name][1] / seconds["baton"][1], 2)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
