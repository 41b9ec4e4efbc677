"""Recorded request traces for `baton simulate --workload-file` and `baton bench --dataset
trace`: Baton's JSONL rows, or the Azure LLM inference trace's CSV, read into the same
`WorkloadRequest`s the synthetic workloads give, with errors that name the line and the field.

JSONL: one object a line, `arrival_s`, `prompt_tokens` and `output_tokens`, optionally
`ttft_ms`, `tpot_ms`, `priority` and `class`. A row without a target takes its class's where
`class` names a known one (baton.core.simulation.workloads.REQUEST_CLASSES), else it has none.
Azure CSV: `TIMESTAMP` (e.g. `2023-11-16 18:15:46.6805900`), `ContextTokens`, `GeneratedTokens`;
arrivals count from the earliest row, and the rows have no class or targets.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from baton.core.simulation.workloads import (
    REQUEST_CLASSES,
    TraceClass,
    WorkloadRequest,
    scale_length,
)

JSONL_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
JSONL_OPTIONAL = ("ttft_ms", "tpot_ms", "priority", "class")
AZURE_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# The class of a row that names none.
UNCLASSED = "trace"


class TraceError(ValueError):
    """A trace file Baton cannot replay; the message names the file, line and field."""


def load_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    limit: int | None = None,
) -> list[WorkloadRequest]:
    """The first `limit` rows of the trace at `path` (all by default), in arrival order.
    `time_scale` multiplies every arrival time (0.5 replays at twice the rate) and
    `length_scale` every prompt and output length. The format is told by the first line."""
    if not time_scale > 0 or math.isinf(time_scale):
        raise ValueError(f"--time-scale must be a finite number > 0, got {time_scale}")
    if not length_scale > 0:
        raise ValueError(f"--length-scale must be > 0, got {length_scale}")
    if limit is not None and limit < 1:
        raise ValueError(f"the number of trace rows to replay must be >= 1, got {limit}")
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as file:
        first = file.readline()
        file.seek(0)
        if first.lstrip().startswith("{"):
            rows = _jsonl_rows(path, file, limit)
        else:
            rows = _azure_rows(path, file, limit)
    if not rows:
        raise TraceError(f"{path}: the trace has no rows")
    requests = [
        WorkloadRequest(
            arrival * time_scale,
            scale_length(prompt, length_scale),
            scale_length(output, length_scale),
            scale_length(output, length_scale),
            request_class,
        )
        for arrival, prompt, output, request_class in rows
    ]
    return sorted(requests, key=lambda r: r.arrival_s)


# One parsed row: arrival in seconds, prompt and output tokens, and its class.
Row = tuple[float, int, int, TraceClass]


def _jsonl_rows(path: Path, file: TextIO, limit: int | None) -> list[Row]:
    rows: list[Row] = []
    for number, line in enumerate(file, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"{where}: not a JSON object ({error.msg})") from None
        if not isinstance(row, dict):
            raise TraceError(f"{where}: not a JSON object")
        missing = [name for name in JSONL_FIELDS if name not in row]
        if missing:
            raise TraceError(f"{where}: missing field {', '.join(missing)}")
        unknown = sorted(set(row) - set(JSONL_FIELDS) - set(JSONL_OPTIONAL))
        if unknown:
            raise TraceError(
                f"{where}: unknown field {', '.join(unknown)}; a row takes "
                f"{', '.join(JSONL_FIELDS + JSONL_OPTIONAL)}"
            )
        rows.append(
            (
                _seconds(row["arrival_s"], where, "arrival_s"),
                _tokens(row["prompt_tokens"], where, "prompt_tokens"),
                _tokens(row["output_tokens"], where, "output_tokens"),
                _row_class(row, where),
            )
        )
        if len(rows) == limit:
            break
    return rows


def _row_class(row: dict, where: str) -> TraceClass:
    """The row's own targets and priority, each falling back on its named class's."""
    name = row.get("class", UNCLASSED)
    if not isinstance(name, str) or not name:
        raise TraceError(f"{where}: field class must be a non-empty string, got {name!r}")
    known = REQUEST_CLASSES.get(name)
    targets = {}
    for field in ("ttft_ms", "tpot_ms"):
        value = row.get(field)
        if value is None:
            targets[field] = getattr(known, field) if known else None
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise TraceError(f"{where}: field {field} must be a number > 0, got {value!r}")
        elif math.isinf(value):
            raise TraceError(f"{where}: field {field} must be finite (leave it out for none)")
        else:
            targets[field] = float(value)
    priority = row.get("priority")
    if priority is None:
        priority = known.priority if known else 0
    elif isinstance(priority, bool) or not isinstance(priority, int):
        raise TraceError(f"{where}: field priority must be an integer, got {priority!r}")
    return TraceClass(name, targets["ttft_ms"], targets["tpot_ms"], priority)


def _azure_rows(path: Path, file: TextIO, limit: int | None) -> list[Row]:
    reader = csv.DictReader(file)
    header = reader.fieldnames or []
    missing = [name for name in AZURE_FIELDS if name not in header]
    if missing:
        raise TraceError(
            f"{path}: neither JSONL (a first line starting with '{{') nor an Azure LLM inference "
            f"trace CSV: its header lacks {', '.join(missing)} (it needs "
            f"{', '.join(AZURE_FIELDS)})"
        )
    stamps: list[float] = []
    lengths: list[tuple[int, int]] = []
    for row in reader:
        where = f"{path}, line {reader.line_num}"
        if None in row or any(row[name] is None for name in AZURE_FIELDS):
            raise TraceError(f"{where}: expected {len(header)} columns as in the header")
        stamps.append(_timestamp(row["TIMESTAMP"], where))
        lengths.append(
            (
                _cell_tokens(row["ContextTokens"], where, "ContextTokens"),
                _cell_tokens(row["GeneratedTokens"], where, "GeneratedTokens"),
            )
        )
        if len(stamps) == limit:
            break
    start = min(stamps, default=0.0)
    unclassed = TraceClass(UNCLASSED, None, None, 0)
    return [
        (stamp - start, prompt, output, unclassed)
        for stamp, (prompt, output) in zip(stamps, lengths, strict=True)
    ]


def _timestamp(text: str, where: str) -> float:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceError(
            f"{where}: field TIMESTAMP must be a date and time like 2023-11-16 18:15:46.6805900, "
            f"got {text!r}"
        ) from None
    # A naive time is read as UTC, so a daylight-saving change cannot shift the gaps.
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _seconds(value: object, where: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise TraceError(f"{where}: field {field} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _tokens(value: object, where: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(f"{where}: field {field} must be an integer >= 1, got {value!r}")
    return value


def _cell_tokens(text: str, where: str, field: str) -> int:
    try:
        count = int(text.strip())
    except ValueError:
        raise TraceError(f"{where}: field {field} must be an integer >= 1, got {text!r}") from None
    return _tokens(count, where, field)
