"""Log-probabilities of prompt tokens, for the requests of a step that ask (scoring, `echo`).

Only the positions a batch names in `prompt_logprob_positions` get logits: every other request
keeps paying for its last position only. The rows go through the LM head in slices, so a long
prompt chunk never holds a [chunk, vocab] float32 tensor at once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from baton.core.batch import Batch, TokenLogprobs

# Rows per pass through the LM head: bounds the logits tensor to ROWS × vocab floats.
ROWS_PER_SLICE = 256


def prompt_logprobs(
    batch: Batch,
    hidden: torch.Tensor,
    query_start_loc: list[int],
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
) -> dict[str, list[TokenLogprobs]]:
    """Per request id, one entry per position of its `prompt_logprob_positions`: the next prompt
    token's log-probability under the raw model distribution and the top-N alternatives.

    `hidden` holds the packed batch's final hidden states, sequence i owning rows
    `query_start_loc[i]:query_start_loc[i + 1]`.
    """
    rows: list[int] = []
    targets: list[int] = []
    owners: list[tuple[str, int, int]] = []  # request id, its first row in `rows`, top-N
    for index, seq in enumerate(batch.sequences):
        positions = seq.prompt_logprob_positions
        if not positions:
            continue
        first_row = query_start_loc[index] - seq.start_position
        owners.append((seq.request_id, len(rows), seq.sampling_params.prompt_logprobs or 0))
        rows.extend(range(first_row + positions.start, first_row + positions.stop))
        targets.extend(seq.all_token_ids[positions.start + 1 : positions.stop + 1])
    if not rows:
        return {}
    num_top = min(max(top for _, _, top in owners), vocab_size)
    chosen, top_values, top_ids = _score(hidden, rows, targets, num_top, compute_logits, vocab_size)
    result: dict[str, list[TokenLogprobs]] = {}
    bounds = [start for _, start, _ in owners[1:]] + [len(rows)]
    for (request_id, start, top), end in zip(owners, bounds, strict=True):
        result[request_id] = [
            TokenLogprobs(
                targets[row],
                chosen[row],
                list(zip(top_ids[row][:top], top_values[row][:top], strict=True)),
            )
            for row in range(start, end)
        ]
    return result


def _score(
    hidden: torch.Tensor,
    rows: list[int],
    targets: list[int],
    num_top: int,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_size: int,
) -> tuple[list[float], list[list[float]], list[list[int]]]:
    """The targets' log-probabilities and each row's top `num_top`, as Python lists."""
    device = hidden.device
    row_index = torch.tensor(rows, dtype=torch.long, device=device)
    target_index = torch.tensor(targets, dtype=torch.long, device=device)
    chosen_parts, value_parts, id_parts = [], [], []
    for start in range(0, len(rows), ROWS_PER_SLICE):
        part = slice(start, start + ROWS_PER_SLICE)
        logits = compute_logits(hidden[row_index[part]]).float()[:, :vocab_size]
        logprobs = logits.log_softmax(dim=-1)
        chosen_parts.append(logprobs.gather(1, target_index[part].unsqueeze(1)).squeeze(1))
        values, ids = logprobs.topk(num_top, dim=-1)
        value_parts.append(values)
        id_parts.append(ids)
    chosen = torch.cat(chosen_parts).tolist()
    return chosen, torch.cat(value_parts).tolist(), torch.cat(id_parts).tolist()
