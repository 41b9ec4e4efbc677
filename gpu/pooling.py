"""What the embedding requests of a step take from its final hidden states (after the model's
final norm, before the LM head): the last prompt row, or the chunk's sum of rows for a mean.

A mean is summed per chunk and added up by the request (core/pooling.py), since chunked prefill
spreads a long prompt over several steps; the sums run in float32 whatever the model's dtype.
"""

from __future__ import annotations

import torch

from baton.core.batch import Batch
from baton.core.pooling import Pooling


def pooled_parts(
    batch: Batch, hidden: torch.Tensor, query_start_loc: list[int]
) -> dict[str, list[float]]:
    """Per request id whose sequence `pools` this step, its part of the embedding; `hidden`
    holds the packed batch's rows, sequence i owning `query_start_loc[i]:query_start_loc[i + 1]`.
    """
    ids: list[str] = []
    parts: list[torch.Tensor] = []
    for index, seq in enumerate(batch.sequences):
        if not seq.pools:
            continue
        start, end = query_start_loc[index], query_start_loc[index + 1]
        if seq.sampling_params.pooling is Pooling.LAST:
            parts.append(hidden[end - 1].float())
        else:
            parts.append(hidden[start:end].float().sum(dim=0))
        ids.append(seq.request_id)
    if not parts:
        return {}
    # One copy to the host for the whole step, not one per request.
    rows = torch.stack(parts).tolist()
    return dict(zip(ids, rows, strict=True))
