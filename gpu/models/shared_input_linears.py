"""Sibling linear layers of transformers' modeling code that read the same input, run as one
matmul over their weights packed side by side: a layer's q, k and v projections, an MLP's gate
and up projections, a parallel block's attention and MLP inputs.

Which linears share an input is seen, not named: a probe forward records the tensor each
`nn.Linear` is called with, and linears called once with the same tensor, unmodified between
the calls, form a group. At run time any member called with a tensor computes the whole group's
product for it; a sibling called next with that very tensor takes its columns of that product
instead of a matmul of its own. Another tensor, or a member asking twice, computes afresh.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from baton.gpu.models.model import pack_cpu_weight, packed_linear


@dataclass(slots=True)
class _Product:
    """The group's last product, the input it was computed for (held, so that no other tensor
    can take its identity), and the members yet to read it."""

    input: torch.Tensor
    output: torch.Tensor
    unread: set[int]


class SharedInputGroup:
    """The packed [member 0 | member 1 | ...] weight of linears that read one input, and the
    product of their last input."""

    def __init__(self, linears: list[nn.Linear], rows_hint: int) -> None:
        self.in_features = linears[0].in_features
        weight = torch.cat([linear.weight.detach() for linear in linears])
        self.out_features = weight.shape[0]
        self.packed_weight = pack_cpu_weight(weight, rows_hint)
        biases = [linear.bias for linear in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self.num_members = len(linears)
        self._last: _Product | None = None

    def product(self, x: torch.Tensor, member: int) -> torch.Tensor:
        """Every member's output for `x` [..., in], side by side: the last product where it was
        for this same `x` and `member` has not read it yet, else a new one. (Inference tensors
        keep no version counter: that `x` is not modified in place between its members' calls
        is what the probe checked.)"""
        last = self._last
        if last is None or last.input is not x or member not in last.unread:
            rows = x.reshape(-1, self.in_features)
            output = packed_linear(rows, self.packed_weight, self.bias, self.out_features)
            output = output.view(*x.shape[:-1], self.out_features)
            last = self._last = _Product(x, output, set(range(self.num_members)))
        last.unread.discard(member)
        return last.output


class GroupedLinear(nn.Module):
    """One member of a `SharedInputGroup`: its columns of the group's product.

    `weight` stays as a meta tensor of the linear's shape and dtype, for code that reads those;
    the group's packed weight is the only copy in memory.
    """

    def __init__(self, linear: nn.Linear, group: SharedInputGroup, member: int, start: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to("meta"), requires_grad=False)
        self.bias = linear.bias
        self.group = group
        self.member = member
        self.columns = slice(start, start + linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.product(x, self.member)[..., self.columns]


def shared_input_linears(
    linears: list[nn.Linear], probe: Callable[[], object]
) -> list[list[nn.Linear]]:
    """The groups, two or more each, of `linears` that `probe()` called exactly once each with
    the same tensor at the same version (not modified in place between the calls), of one
    input size, dtype and device, and all with a bias or none. The probe runs under `no_grad`
    rather than inference mode, whose tensors keep no version counter."""
    calls: dict[nn.Linear, list[tuple[torch.Tensor, int] | None]] = {x: [] for x in linears}

    def record(module: nn.Module, args: tuple) -> None:
        x = args[0] if args else None
        calls[module].append((x, x._version) if isinstance(x, torch.Tensor) else None)

    hooks = [linear.register_forward_pre_hook(record) for linear in linears]
    try:
        with torch.no_grad():
            probe()
    finally:
        for hook in hooks:
            hook.remove()
    groups: dict[tuple[int, int], list[nn.Linear]] = {}
    for linear, inputs in calls.items():
        if len(inputs) == 1 and inputs[0] is not None:
            x, version = inputs[0]
            groups.setdefault((id(x), version), []).append(linear)
    return [members for members in groups.values() if len(members) > 1 and _packable(members)]


def _packable(members: list[nn.Linear]) -> bool:
    """Whether `members`' weights can stand side by side in one packed weight."""
    first = members[0].weight
    return all(
        linear.in_features == members[0].in_features
        and linear.weight.dtype == first.dtype
        and linear.weight.device == first.device
        and (linear.bias is None) == (members[0].bias is None)
        for linear in members
    )


def grouped_linears(members: list[nn.Linear], rows_hint: int) -> list[GroupedLinear]:
    """The `GroupedLinear` standing in for each of `members`, over one shared group."""
    group = SharedInputGroup(members, rows_hint)
    starts = [0]
    for linear in members[:-1]:
        starts.append(starts[-1] + linear.out_features)
    return [
        GroupedLinear(linear, group, member, start)
        for member, (linear, start) in enumerate(zip(members, starts, strict=True))
    ]
