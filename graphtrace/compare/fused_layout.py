"""Where each part of a fused projection lies in the fused output's last dimension.

A fused projection need not hold its parts side by side. GPT-2's ``c_attn`` and most ``wqkv`` do (``[q k v]``),
but GPT-NeoX, Pythia, Bloom and Falcon lay the fused output out *per head* (or per key/value group):
``[q_0 k_0 v_0 q_1 k_1 v_1 ...]``, where ``q_g`` is the ``g``-th of ``G`` equal chunks of ``q``. A port with
separate projections is faithful to either layout, so the columns that hold part ``k`` are found from the values:
for each grouping ``G`` that divides every part's width (``G = 1`` is side by side), each part is set against its
columns by a signature that ignores the order of columns *within* the part (a rotary layout may permute those, and
measure allows for that), and the grouping under which most parts agree wins; side by side wins ties. The order
of the parts can be imposed instead of found (the same projection's in another block, see compare/pairs.py).

Tensor methods only (no torch import), like :mod:`graphtrace.compare.measure`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PartColumns", "part_columns"]

_MAX_REORDERED_PARTS = 4
"""Up to this many parts (q, k, v; gate and up), every order of them is tried: 24 orders at most."""


@dataclass(frozen=True, slots=True)
class PartColumns:
    """Part ``k`` of a fused output is its columns ``columns[k]`` (in order) under a grouping of ``groups``."""

    groups: int
    columns: tuple[Any, ...]  # one index tensor per part
    order: tuple[int, ...] = ()  # the parts in the order their columns lie in each group

    def where(self, part: int) -> str:
        """The part's place in words, for the report: ``[..., 64:128]`` or a per-group slice."""
        columns = self.columns[part]
        chunk = int(columns.numel()) // self.groups
        start = int(columns[0].item())
        if self.groups == 1:
            return f"[..., {start}:{start + chunk}]"
        return f"[..., {start}:{start + chunk} of each of {self.groups} head groups]"


def _columns(widths: Sequence[int], groups: int, like: Any) -> tuple[Any, ...]:
    """Column indices of each part when the fused output is ``groups`` groups of the parts' chunks in order."""
    chunks = [width // groups for width in widths]
    index = like.new_zeros(0).long()  # an integer tensor to make others from (bfloat16 cannot count far)
    starts = index.new_tensor(range(groups)) * sum(chunks)
    result = []
    offset = 0
    for chunk in chunks:
        within = index.new_tensor(range(offset, offset + chunk))
        result.append((starts[:, None] + within[None, :]).reshape(-1))
        offset += chunk
    return tuple(result)


def _signatures(values: Any, rows: int) -> Any:
    """One number per column: the column's values in a fixed direction (distinct columns get distinct numbers)."""
    index = values.new_tensor(range(rows))
    direction = ((index * 0.6180339887498949) % 1.0) + 0.5
    return direction @ values


def _finite(values: Any, scale: float) -> Any:
    """``values`` with NaN and infinities as distinct finite stand-ins beyond ``scale`` (both traces alike), so that
    a column holding the same NaN or inf in both still has the same signature."""
    return values.nan_to_num(nan=3.0 * scale, posinf=5.0 * scale, neginf=-5.0 * scale)


def part_columns(
    fused: Any, parts: Sequence[Any], rtol: float, atol: float, in_order: Sequence[int] | None = None
) -> PartColumns:
    """The columns of ``fused`` (a tensor whose last dimension holds the parts) that hold each of ``parts``: the
    grouping and the order of the parts (a port may compute v before q) under which most parts agree; with
    ``in_order``, the grouping only, the parts lying in that order."""
    widths = [int(part.shape[-1]) for part in parts]
    total = int(fused.shape[-1])
    rows = fused.numel() // max(total, 1)
    side_by_side = PartColumns(1, _columns(widths, 1, fused), tuple(range(len(parts))))
    if (
        len(parts) < 2
        or sum(widths) != total
        or rows < 1
        or any(part.numel() != rows * w for part, w in zip(parts, widths))
    ):
        return side_by_side
    whole = fused.detach().reshape(rows, total).double()
    finite = whole.isfinite()
    scale = float(whole.masked_fill(~finite, 0.0).abs().max().item()) + 1.0
    whole = _finite(whole, scale)
    fused_keys = _signatures(whole, rows)
    allowed = _signatures(atol + rtol * whole.abs(), rows)
    part_keys = [
        _signatures(_finite(part.detach().reshape(rows, w).double(), scale), rows).sort().values
        for part, w in zip(parts, widths)
    ]
    orders = list(itertools.permutations(range(len(parts)))) if len(parts) <= _MAX_REORDERED_PARTS else []
    orders = orders or [tuple(range(len(parts)))]
    if in_order is not None and sorted(in_order) == list(range(len(parts))):
        orders = [tuple(in_order)]
    best, best_agreeing = side_by_side, -1
    for groups in range(1, min(widths) + 1):
        if any(width % groups for width in widths):
            continue
        for order in orders:  # the identity first: on a tie, the parts in the order they ran
            placed = _columns([widths[k] for k in order], groups, whole)
            columns = [placed[0]] * len(parts)
            for position, k in enumerate(order):
                columns[k] = placed[position]
            agreeing = 0
            for keys, chosen in zip(part_keys, columns):
                ordered = fused_keys[chosen].sort()
                if bool(((ordered.values - keys).abs() <= allowed[chosen][ordered.indices]).all().item()):
                    agreeing += 1
            if agreeing > best_agreeing:
                best, best_agreeing = PartColumns(groups, tuple(columns), tuple(order)), agreeing
            if agreeing == len(parts):
                return best
    return best
