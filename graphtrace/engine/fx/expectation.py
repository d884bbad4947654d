"""What a real value must look like to be the one a graph was traced with: a child's output, the forward's output.

A graph is specialised on the trace-time value of each child's output (its containers, its constants, its tensors'
shapes, dtypes and devices): code after the call may branch on them. Every replayed or structurally checked call
compares the real output with that value, so the trace-time value is taken apart once, when the plan is made, and
each call only takes the real output apart. A lone tensor, the most common output, is compared without either.
"""

from __future__ import annotations

from typing import Any

import torch

from graphtrace.engine.fx.containers import Structure, flatten
from graphtrace.engine.fx.guard import difference

__all__ = ["UNKNOWN", "Expectation", "Opaque"]


class Opaque:
    """The trace-time stand-in for an argument graphtrace does not look into (a cache object): children learn its
    type, nothing reads it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()
"""A trace-time value that was not learned: anything conforms to it."""

_TENSOR, _OPAQUE, _CONSTANT = 0, 1, 2


class Expectation:
    """The trace-time value ``expected`` taken apart once: :meth:`nonconforming` says how a real value differs."""

    __slots__ = ("_known", "_structure", "_leaves", "_lone_tensor")

    def __init__(self, expected: Any) -> None:
        self._known = expected is not UNKNOWN
        leaves, structure = flatten(expected) if self._known else ([], None)
        self._structure: Structure | None = structure
        self._leaves = tuple([_leaf_expectation(leaf) for leaf in leaves])
        lone = self._structure is not None and self._structure.is_leaf and self._leaves[0][0] == _TENSOR
        self._lone_tensor = self._leaves[0][1] if lone else None

    def nonconforming(self, actual: Any) -> str | None:
        """How ``actual`` differs from the trace-time value (its structure, its constants, its tensors' shapes,
        dtypes and devices), or None."""
        if not self._known:
            return None
        lone = self._lone_tensor
        if lone is not None and type(actual) is torch.Tensor:  # what flatten would find: one tensor leaf
            return None if (actual.shape, actual.dtype, actual.device) == lone else "another tensor"
        actual_leaves, actual_structure = flatten(actual)
        if actual_structure != self._structure:
            return "another structure"
        for (kind, want), got in zip(self._leaves, actual_leaves):
            if kind == _TENSOR:
                if not isinstance(got, torch.Tensor) or want != (got.shape, got.dtype, got.device):
                    return "another tensor"
            elif kind == _OPAQUE:
                if type(got) is not want:
                    return "another object"
            elif difference(want, got) is not None:
                return f"another constant ({got!r}, traced with {want!r})"
        return None


def _leaf_expectation(leaf: Any) -> tuple[int, Any]:
    if isinstance(leaf, torch.Tensor):
        return _TENSOR, (leaf.shape, leaf.dtype, leaf.device)
    if isinstance(leaf, Opaque):
        return _OPAQUE, type(leaf.value)
    return _CONSTANT, leaf
