"""The interface through which the engine runs a model; `gpu` implements it, tests fake it."""

from __future__ import annotations

from collections.abc import Sequence
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


class KVTransfer(Protocol):
    """What an executor implements to move a prefilled request's KV between engines
    (core/prefilled.py): read the contents of some blocks of its cache, and write contents read
    elsewhere into blocks of its own. The contents are opaque to the engine."""

    def read_kv(self, block_ids: Sequence[int]) -> object: ...

    def write_kv(self, block_ids: Sequence[int], contents: object) -> None: ...
