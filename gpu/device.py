"""Which device, model dtype and KV cache dtype a run uses, from the flags' values."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """`auto` picks CUDA when a GPU is visible, else the CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA GPU; use --device cpu")
    return torch.device(device)


def resolve_kv_cache_dtype(
    kv_cache_dtype: str, device: torch.device, model_dtype: torch.dtype
) -> torch.dtype:
    """`auto` is the model's dtype; float16 is taken on the CPU only, where attention widens
    what it reads (the GPU kernels read the cache in the model's dtype)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    dtype = DTYPES[kv_cache_dtype]
    if device.type != "cpu" and dtype != model_dtype:
        raise ValueError(
            f"--kv-cache-dtype {kv_cache_dtype} is for the CPU; on {device.type} the KV cache "
            "is in the model's dtype (--kv-cache-dtype auto, or set --dtype)"
        )
    return dtype


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is float32 on the CPU (the exact reference path) and bfloat16 on CUDA."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]
