"""Inside the module the diff names: the first op of the port whose value has no counterpart in the original.

Both traces need op records (``ops=True``, engine/ops.py). Every value the port's module computes (its ops' outputs
and its sub-calls' outputs) is looked up among the values the original's module had (its ops' outputs, its
sub-calls' outputs and its inputs): equal within tolerance, with the usual equivalences (size-1 dimensions, a
re-ordered last dimension) and the two layouts of attention tensors (``[B, T, H, D]`` and ``[B, H, T, D]``). Two
implementations decompose the same computation differently, so a value without counterpart is not yet a bug: the
culprit is an op whose inputs all have counterparts, whose own value has none, and after which nothing on its data
path finds one again; of several, one that computes in a dtype the original never used there (a bf16 round trip),
else the one whose inputs agreed last. Its source line is named in the port, and the original's line that
consumes the last matching value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from graphtrace.compare.measure import Tolerance, measure
from graphtrace.model import CallNode, TensorRecord

__all__ = ["OpLocus", "locate_op"]

Values = Callable[[TensorRecord, TensorRecord], "tuple[Any, Any] | None"]


@dataclass(frozen=True, slots=True)
class OpLocus:
    """The port's op that departs (``op``, with its source line), what it last agreed on, and where the original
    goes on from there."""

    op: CallNode
    last_match: str
    original_next: CallNode | None

    def __str__(self) -> str:
        where = str(self.op.source) if self.op.source is not None else self.op.name
        text = (
            f"port {where} ({self.op.name}) has no counterpart in the original; "
            f"the last matching value is {self.last_match}"
        )
        if self.original_next is not None and self.original_next.source is not None:
            text += f"; the original goes on at {self.original_next.source}"
        return text


def _single(node: CallNode) -> TensorRecord | None:
    out = node.outputs
    if isinstance(out, tuple) and out:
        out = out[0]
    return out if isinstance(out, TensorRecord) else None


def _layouts(a: TensorRecord, b: TensorRecord) -> list[str]:
    """How ``b``'s values may line up with ``a``'s: "same" (the same elements in the same order, whatever the
    shapes: heads split or merged), "swap12" (dims 1 and 2 of a 4-d tensor exchanged, then reshaped: attention's
    ``[B, T, H, D]`` and ``[B, H, T, D]``)."""
    if a.numel != b.numel or a.dtype != b.dtype:
        return []
    found = ["same"]
    if len(b.shape) == 4 and b.shape[1] != 1 and b.shape[2] != 1:
        found.append("swap12")
    return found


class _Matcher:
    def __init__(self, references: Sequence[tuple[str, TensorRecord]], tolerance: Tolerance, values: Values) -> None:
        self.references = references
        self.tolerance = tolerance
        self.values = values

    def counterpart(self, record: TensorRecord) -> str | None:
        """The id of a reference value equal to ``record``, or None."""
        for ident, reference in self.references:
            for layout in _layouts(reference, record):
                pair = self.values(reference, record)
                if pair is None and record.stats is None:
                    continue
                # compared in the reference's shape: a reshape (and the swap) keep statistics as they are
                candidate = TensorRecord(reference.shape, record.dtype, stats=record.stats)
                if pair is not None:
                    moved = pair[1].transpose(1, 2) if layout == "swap12" else pair[1]
                    pair = (pair[0], moved.reshape(reference.shape))
                if measure("a", reference, "b", candidate, self.tolerance, pair).status == "equal":
                    return ident
        return None


def _references(call: CallNode) -> list[tuple[str, TensorRecord]]:
    found = [(f"{call.id} input {name}", record) for name, record in call.input_tensors() if record.stats is not None]
    for child in call.children:
        record = _single(child)
        if record is not None and record.stats is not None:
            found.append((child.id, record))
    return found


def _consumers(calls: Iterable[CallNode]) -> dict[str, list[str]]:
    consumers: dict[str, list[str]] = {}
    for node in calls:
        for source in node.inputs_from:
            consumers.setdefault(source, []).append(node.id)
    return consumers


def _downstream(start: str, consumers: dict[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in consumers.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def locate_op(a_call: CallNode, b_call: CallNode, tolerance: Tolerance, values: Values) -> OpLocus | None:
    """The op of ``b_call`` (the port) where its values depart from ``a_call``'s (see the module docstring)."""
    b_children = list(b_call.children)
    if not any(child.kind == "op" for child in b_children):
        return None
    matcher = _Matcher(_references(a_call), tolerance, values)
    matched: dict[str, str] = {}  # B id -> A id
    for child in b_children:
        record = _single(child)
        if record is not None and record.stats is not None:
            counterpart = matcher.counterpart(record)
            if counterpart is not None:
                matched[child.id] = counterpart
    inside = {child.id for child in b_children}
    consumers = _consumers(b_children)
    by_id = {child.id: child for child in b_children}
    position = {child.id: k for k, child in enumerate(b_children)}
    candidates: list[tuple[bool, int, int, CallNode, str | None]] = []
    dtypes_a = {record.dtype for _, record in matcher.references}
    for child in b_children:
        if child.kind != "op" or child.id in matched or _single(child) is None:
            continue
        sources = [s for s in child.inputs_from if s in inside]
        if any(s not in matched for s in sources):
            continue  # an input already departed: not where the departure starts
        if any(later in matched for later in _downstream(child.id, consumers)):
            continue  # the values meet again further on: another decomposition of the same computation
        last = max(sources, key=position.__getitem__) if sources else None
        record = _single(child)
        foreign = record is not None and record.dtype not in dtypes_a
        candidates.append((foreign, position[last] if last is not None else -1, -position[child.id], child, last))
    if not candidates:
        return None
    # A value of a dtype the original never computed here is a departure, not another decomposition; otherwise the
    # departure follows the latest agreement: of the ops that could start it, the one whose inputs agreed last.
    *_, op, last = max(candidates, key=lambda item: item[:3])
    last_name = _describe(by_id[last]) if last is not None else f"the inputs of {b_call.path}"
    return OpLocus(op, last_name, _original_next(a_call, matched.get(last) if last is not None else None))


def _describe(node: CallNode) -> str:
    if node.kind == "op":
        return f"{node.name} ({node.source})" if node.source is not None else node.name
    return f"{node.path.rpartition('.')[2]}'s output"


def _original_next(a_call: CallNode, counterpart: str | None) -> CallNode | None:
    """The original's first op that uses the counterpart of the port's last matching value."""
    for child in a_call.children:
        if child.kind == "op" and (counterpart is None or counterpart in child.inputs_from):
            return child
    return None
