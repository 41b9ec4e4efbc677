"""The block tables of a step's packed inputs, kept row by row from one step to the next
(gpu/input_batch.py packs them through `BlockTableRows`)."""

from __future__ import annotations

from itertools import chain, repeat

import numpy as np


class BlockTableRows:
    """Writes block tables into a flat buffer viewed as [rows, width], rewriting only the rows
    that differ from what this buffer last held: a decode step changes a row only when its
    sequence crosses into a new block or another sequence takes its place."""

    def __init__(self) -> None:
        self.width = 0
        # The table each row of the buffer holds, as a copy (lists are compared, not trusted
        # to stay unmodified); [] for a row of zeros (graph padding), None for one not written.
        self.rows: list[list[int] | None] = []

    def write(
        self, flat: np.ndarray, tables: list[list[int]], num_rows: int, width: int
    ) -> np.ndarray:
        """`flat` viewed as [num_rows, width] holding `tables`, then zero rows of padding."""
        out = flat[: num_rows * width].reshape(num_rows, width)
        padded = chain(tables, repeat(_NO_TABLE, num_rows - len(tables)))
        if width != self.width:
            # Every row moved: one vectorized rewrite.
            _fill_block_tables(out, tables)
            self.width = width
            self.rows = [list(table) for table in padded]
            return out
        rows = self.rows
        if len(rows) < num_rows:
            rows.extend(repeat(None, num_rows - len(rows)))
        for i, table in enumerate(padded):
            if table != rows[i]:
                out[i, : len(table)] = table
                out[i, len(table) :] = 0
                rows[i] = list(table)
        return out


_NO_TABLE: list[int] = []


def _fill_block_tables(out: np.ndarray, tables: list[list[int]]) -> None:
    """Write each table into its row of `out` [rows, width]; the rest of `out` becomes block 0."""
    out.fill(0)
    num_tables = len(tables)
    lengths = np.fromiter(map(len, tables), np.int64, num_tables)
    total = int(lengths.sum())
    flat = np.fromiter(chain.from_iterable(tables), np.int32, total)
    rows = np.repeat(np.arange(num_tables), lengths)
    row_starts = np.cumsum(lengths) - lengths
    cols = np.arange(total) - np.repeat(row_starts, lengths)
    out[rows, cols] = flat
