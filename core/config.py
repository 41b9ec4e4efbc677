"""Engine settings: the scheduler's budgets and policy, the KV cache's shape and how the model
runs; each field is also the flag that sets it (core/setting.py)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from baton.core.kv_cache.host_memory import parse_memory_size
from baton.core.setting import setting

# The scheduling policies by name, the default first. A plain tuple rather than the registry's
# keys, so the config loads without the policies (baton.core.scheduling.policy_registry builds
# them; a test checks that both name the same policies in the same order).
POLICIES = ("slo", "fcfs", "priority", "sjf", "hrrn", "ltr", "static")
# Where a checkpoint's weights come from (baton.gpu.loader): its files, or random values drawn
# for the shapes config.json gives.
LOAD_FORMATS = ("auto", "dummy")
# How a checkpoint's model runs (baton.core.checkpoint.model_impl): auto, Baton's native model, or
# transformers'.
MODEL_IMPLS = ("auto", "native", "transformers")
# How the native CPU model stores its linear weights (baton.gpu.models.quantization): as loaded, or
# int8.
QUANTIZATIONS = ("none", "int8")
# What the KV cache holds: the model's dtype (auto), or float16 on the CPU, where the cache read
# is a decode step's largest cost at long contexts and llama.cpp's default is float16 too.
KV_CACHE_DTYPES = ("auto", "float16")
# Where speculative decoding's draft tokens come from (baton.core.speculative): none, prompt
# lookup over the request's own tokens, or a small draft model (--speculative-model).
SPECULATIVE_METHODS = ("none", "ngram", "draft")


@dataclass(slots=True)
class EngineConfig:
    """What `baton serve`, `baton generate` and (in part) `baton simulate` flags set for the
    engine.

    `max_model_len=None` takes the checkpoint's context length; `num_kv_blocks=None` lets the
    executor size the cache from memory: from `kv_cache_memory_bytes` where given.
    """

    max_model_len: int | None = setting(
        None,
        help="the longest sequence, prompt and output together",
        default_text="the checkpoint's context length",
    )
    max_num_seqs: int = setting(64, help="the most sequences in one step's batch")
    max_num_batched_tokens: int = setting(
        2048, help="the token budget of one step: every decode and prefill chunk in it"
    )
    block_size: int = setting(16, help="tokens per KV cache block (a power of two)")
    num_kv_blocks: int | None = setting(
        None,
        help="KV cache blocks to allocate (wins over --kv-cache-memory)",
        default_text="sized from memory",
    )
    kv_cache_memory_bytes: int | None = setting(
        None,
        name="--kv-cache-memory",
        metavar="SIZE",
        parse=partial(parse_memory_size, flag="--kv-cache-memory"),
        help="size the KV cache from this budget: bytes, or with a unit (512MiB, 2GiB)",
        default_text="on the CPU, --max-num-seqs sequences of --max-model-len, at most 2 GiB "
        "and a quarter of available memory; on CUDA, --gpu-memory-utilization",
    )
    enable_prefix_caching: bool = setting(
        True, help="reuse the KV blocks of a prompt prefix computed before"
    )
    scheduling_policy: str = setting(
        "slo",
        choices=POLICIES,
        help="what orders the queue: slo (the SLO-aware planner), fcfs, priority, sjf, hrrn and "
        "ltr (the literature's orderings) or static (classic static batching)",
    )
    # Hard bounds under every policy: no request waits longer for its first token, and none is
    # preempted more often (after that it is protected). Static batching keeps only the second
    # (its batch is closed; core/scheduling/scheduler.py).
    max_wait_ms: float = setting(
        20_000.0,
        help="starvation bound, under every policy but static: no request waits longer for its "
        "first token (one about to pass it preempts the running request that loses least)",
    )
    max_preemptions: int = setting(
        3, help="a request preempted this many times is never preempted again"
    )
    kv_growth_forecast: bool = setting(
        True,
        help="with the slo policy, start a prompt only if the running requests and it still fit "
        "the KV cache as they grow to their predicted lengths, instead of preempting one later",
    )
    # 0 turns SLO admission control off.
    slo_admission_factor: float = setting(
        3.0,
        help="with the slo policy, no request with a TTFT target starts later than this factor "
        "times its target: one predicted to is refused at arrival (429), one that has waited "
        "that long is refused then (0: off)",
    )
    gpu_memory_utilization: float = setting(
        0.9, help="on CUDA, the share of GPU memory weights, activations and the KV cache fill"
    )
    enforce_eager: bool = setting(
        False, help="no CUDA graphs: run decode steps eagerly too (for debugging and comparison)"
    )
    cpu_threads: int | None = setting(
        None,
        help="on the CPU, the threads a step computes on (torch's and Baton's kernels'); fewer "
        "leave cores to other work on the machine",
        default_text="the cores this process may run on",
    )
    seed: int = setting(
        0, help="seeds the generator that requests without a seed of their own sample from"
    )
    model_impl: str = setting(
        "auto",
        choices=MODEL_IMPLS,
        help="auto: Baton's native model where it has one, else transformers' modeling code "
        "over Baton's paged cache; native or transformers forces one",
    )
    quantization: str = setting(
        "none",
        choices=QUANTIZATIONS,
        help="int8: weight-only int8 with per-channel scales, quantized at load from the float "
        "checkpoint (native model on the CPU only)",
    )
    kv_cache_dtype: str = setting(
        "auto",
        choices=KV_CACHE_DTYPES,
        help="auto: the KV cache in the model's dtype; float16: keys and values stored in "
        "float16, half the memory and half the bytes each decode step reads (CPU only; outputs "
        "may differ slightly from float32's)",
    )
    # Compiled output constraints kept for reuse, bounded by what xgrammar says they hold: a
    # large enum's grammar holds tens of megabytes (gpu/structured_output.py).
    grammar_cache_bytes: int = setting(
        256 * 1024**2,
        name="--grammar-cache-memory",
        metavar="SIZE",
        parse=partial(parse_memory_size, flag="--grammar-cache-memory"),
        help="memory the compiled output constraints kept for reuse may hold: bytes, or with a "
        "unit (64MiB)",
        default_text="256MiB",
    )
    speculative_method: str = setting(
        "none",
        choices=SPECULATIVE_METHODS,
        help="speculative decoding: ngram proposes the tokens that followed the latest earlier "
        "match of the sequence's last tokens (prompt lookup), draft the greedy tokens of a "
        "small model of the same vocabulary (--speculative-model); either is verified exactly "
        "in one forward, and the planner speculates per step and request only where it pays",
    )
    speculative_model: str | None = setting(
        None,
        metavar="DIR",
        help="with --speculative-method draft, the draft model's checkpoint folder: a native "
        "family sharing the model's tokenizer, its KV cache in the same blocks as the model's",
        default_text="none",
    )
    num_speculative_tokens: int = setting(
        4, help="with --speculative-method, the most draft tokens a request verifies per step"
    )
    ngram_min: int = setting(
        2, help="with --speculative-method ngram, the shortest suffix a lookup matches"
    )
    ngram_max: int = setting(
        4, help="with --speculative-method ngram, the longest suffix a lookup matches"
    )

    @property
    def speculates(self) -> bool:
        return self.speculative_method != "none" and self.num_speculative_tokens > 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(
                f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes < 1:
            raise ValueError(
                f"--kv-cache-memory must be more than zero bytes, got {self.kv_cache_memory_bytes}"
            )
        if self.scheduling_policy not in POLICIES:
            raise ValueError(
                f"--scheduling-policy must be one of {', '.join(POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        if not self.max_wait_ms > 0:
            raise ValueError(f"--max-wait-ms must be > 0, got {self.max_wait_ms}")
        if self.grammar_cache_bytes < 0:
            raise ValueError(f"--grammar-cache-memory must be >= 0, got {self.grammar_cache_bytes}")
        if self.max_preemptions < 0:
            raise ValueError(f"--max-preemptions must be >= 0, got {self.max_preemptions}")
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(
                f"--model-impl must be one of {', '.join(MODEL_IMPLS)}, got {self.model_impl!r}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"--quantization must be one of {', '.join(QUANTIZATIONS)}, "
                f"got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"--speculative-method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.speculative_method!r}"
            )
        if self.speculative_model is not None and self.speculative_method != "draft":
            raise ValueError(
                "--speculative-model is the draft model of --speculative-method draft; add "
                f"--speculative-method draft or drop --speculative-model (the method is "
                f"{self.speculative_method})"
            )
        if self.num_speculative_tokens < 0:
            raise ValueError(
                f"--num-speculative-tokens must be >= 0, got {self.num_speculative_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                "--ngram-min must be >= 1 and at most --ngram-max, got "
                f"--ngram-min {self.ngram_min} --ngram-max {self.ngram_max}"
            )
        if not self.slo_admission_factor >= 0:
            raise ValueError(
                f"--slo-admission-factor must be >= 0, got {self.slo_admission_factor}"
            )
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ValueError(f"--cpu-threads must be >= 1, got {self.cpu_threads}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
