"""Engine settings: the scheduler's budgets, the KV cache shape and the policy."""

from __future__ import annotations

from dataclasses import dataclass

from baton.core.scheduling.policy_registry import POLICIES

# How a checkpoint's model runs (baton.core.checkpoint.model_impl): auto, Baton's native model, or
# transformers'.
MODEL_IMPLS = ("auto", "native", "transformers")
# How the native CPU model stores its linear weights (baton.gpu.models.quantization): as loaded, or
# int8.
QUANTIZATIONS = ("none", "int8")
# What the KV cache holds: the model's dtype (auto), or float16 on the CPU, where the cache read
# is a decode step's largest cost at long contexts and llama.cpp's default is float16 too.
KV_CACHE_DTYPES = ("auto", "float16")


@dataclass(slots=True)
class EngineConfig:
    """What `baton serve` and `baton generate` flags set for the engine.

    `max_model_len=None` takes the checkpoint's context length; `num_kv_blocks=None` lets the
    executor size the cache from memory: from `kv_cache_memory_bytes` where given.
    """

    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "slo"
    # Hard bounds under every policy: no request waits longer for its first token, and none is
    # preempted more often (after that it is protected). Static batching keeps only the second
    # (its batch is closed; core/scheduling/scheduler.py).
    max_wait_ms: float = 20_000.0
    max_preemptions: int = 3
    # With the slo policy, no request with a TTFT target starts later than this times its
    # target: refused at arrival when predicted to, refused once it has waited that long.
    # 0 turns SLO admission control off.
    slo_admission_factor: float = 3.0
    gpu_memory_utilization: float = 0.9
    # CUDA graphs for decode steps off: every step runs eagerly (the CPU always does).
    enforce_eager: bool = False
    seed: int = 0
    # auto: Baton's native model where it has one, else transformers' modeling code (the generic
    # path); native or transformers forces one (baton.core.checkpoint.model_impl).
    model_impl: str = "auto"
    # int8: the native model's linear layers over int8 weights with per-channel scales,
    # quantized at load (CPU only).
    quantization: str = "none"
    # float16: keys and values rounded to float16 as they are stored, half the bytes to read
    # and to hold (CPU only); auto: the model's dtype.
    kv_cache_dtype: str = "auto"

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
        if not self.slo_admission_factor >= 0:
            raise ValueError(
                f"--slo-admission-factor must be >= 0, got {self.slo_admission_factor}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
