"""What a module's graph is specialised on: a call's :class:`Signature`, the key plans are cached under.

A call's arguments are taken apart (:mod:`~graphtrace.engine.fx.containers`) into leaves of three kinds: tensors
(placeholders of the graph, keyed by type, dtype, device, layout, shape, strides and ``requires_grad``, since the
trace makes their metadata concrete), constants (None, numbers, strings, dtypes, flags: part of the graph, keyed by
value) and opaque objects (placeholders keyed by type: a cache, whose contents the graph never reads). A fake tensor
keys like the real tensor it stands for, so that a parent's trace finds the plan of the child's real call.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from graphtrace.engine.fx.containers import Structure, flatten
from graphtrace.engine.fx.guard import dispatches_itself

__all__ = ["CONSTANT", "OPAQUE", "TENSOR", "Signature", "is_constant", "leaf_kind", "signature"]

_CONSTANT_TYPES = frozenset(
    {
        type(None),
        bool,
        int,
        float,
        complex,
        str,
        bytes,
        type(Ellipsis),
        slice,
        range,
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
        torch.Size,
    }
)
_UNHASHABLE_CONSTANTS = (float, complex, slice)  # keyed by repr: nan != nan, 0.0 == -0.0, slices are unhashable
TENSOR, CONSTANT, OPAQUE = "tensor", "constant", "opaque"


def leaf_kind(value: Any) -> str:
    if type(value) is torch.Tensor:  # the common case, settled without the subclass checks below
        return TENSOR
    if isinstance(value, torch.Tensor):
        return OPAQUE if dispatches_itself(value) else TENSOR  # a DTensor is passed along, never computed on
    if type(value) in _CONSTANT_TYPES or isinstance(value, enum.Enum):
        return CONSTANT
    return OPAQUE


def _leaf_key(value: Any, kind: str) -> Hashable:
    if kind == TENSOR:
        layout = value.layout
        return (
            torch.Tensor if type(value) is torch.Tensor or isinstance(value, FakeTensor) else type(value),
            value.dtype,
            value.device,
            layout,
            tuple(value.shape),
            tuple(value.stride()) if layout == torch.strided else None,
            value.requires_grad,
        )
    if kind == OPAQUE:
        return (OPAQUE, type(value))
    if isinstance(value, _UNHASHABLE_CONSTANTS):
        return (type(value), repr(value))
    return (type(value), value)


@dataclass(slots=True, eq=False)
class Signature:
    """What a graph is specialised on: the module's training flag, the arguments' structure, and per leaf the
    tensor's type, dtype, device, layout, shape, strides and ``requires_grad``, a constant's value, or an opaque
    object's type. Plans are cached under its ``key``; the object itself is made for every module call and compared
    by nothing, so it is a plain record (a frozen dataclass costs a ``object.__setattr__`` per field to build)."""

    key: Hashable
    leaves: list[Any]
    structure: Structure
    kinds: tuple[str, ...]


def signature(module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Signature:
    if not kwargs and all([type(arg) is torch.Tensor for arg in args]):  # module(x): nothing to take apart
        leaves = list(args)
        structure = _positional_tensors(len(leaves))
        kinds: tuple[str, ...] = (TENSOR,) * len(leaves)
    else:
        leaves, structure = flatten((tuple(args), dict(kwargs)))
        kinds = tuple([leaf_kind(leaf) for leaf in leaves])
    key = (module.training, structure, tuple([_leaf_key(leaf, kind) for leaf, kind in zip(leaves, kinds)]))
    return Signature(key, leaves, structure, kinds)


_POSITIONAL: dict[int, Structure] = {}


def _positional_tensors(count: int) -> Structure:
    """The structure :func:`flatten` gives the arguments of a call with ``count`` positional leaves and no keyword."""
    structure = _POSITIONAL.get(count)
    if structure is None:
        structure = _POSITIONAL[count] = flatten(((None,) * count, {}))[1]
    return structure


def is_constant(value: Any) -> bool:
    """Whether ``value`` holds only constants (no tensor, no opaque object)."""
    leaves, _ = flatten(value)
    return all(leaf_kind(leaf) == CONSTANT for leaf in leaves)
