"""The interface through which the engine runs a model; `gpu` implements it, tests fake it."""

from __future__ import annotations

from typing import Protocol

from baton.core.batch import Batch, ExecutorOutput


class Executor(Protocol):
    """Runs one forward over a packed batch and samples the next tokens.

    `num_kv_blocks` and `block_size` describe the KV cache the executor allocated; the engine
    sizes its block pool from them, so block ids in a batch's block tables index that cache.
    """

    num_kv_blocks: int
    block_size: int

    def execute(self, batch: Batch) -> ExecutorOutput: ...
