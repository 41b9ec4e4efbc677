"""Torch executor: checkpoint loading, model definitions, KV cache tensors, the sampler."""
