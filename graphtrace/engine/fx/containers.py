"""Containers taken apart and put back: the arguments of a call, the outputs of a graph.

graphtrace's own flattening rather than ``torch.utils._pytree``: that registry is global and other libraries add to
it (transformers registers its ``ModelOutput`` classes there), and capture must neither depend on nor change it.
Tuples, lists, named tuples, plain and ordered dicts and dataclasses (``ModelOutput`` is both a dict and a
dataclass) are containers; everything else is a leaf.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch
from torch.fx.immutable_collections import immutable_dict, immutable_list

__all__ = ["Structure", "flatten", "leaf_paths", "unflatten"]

LEAF = "*"
_PLAIN = {immutable_list: list, immutable_dict: dict}  # fx's read-only containers stand for list and dict
_LEAF_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, type(None), bool, int, float, str})
"""Types that are leaves whatever follows (no tuple, dict or dataclass among them): settled by one lookup."""


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Structure:
    """The shape of a nested value with its leaves taken out; hashable, so it can key a cache.

    Its hash is computed once (a call's signature is hashed at each plan lookup), and :func:`flatten` hands out one
    object per distinct structure it meets, so that comparing two usually ends at their identity."""

    kind: type | str
    keys: tuple[Hashable, ...] = ()
    children: tuple[Structure, ...] = ()
    _hash: int = dataclasses.field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.keys, self.children)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Structure:
            return NotImplemented
        return (
            self._hash == other._hash
            and self.kind == other.kind
            and self.keys == other.keys
            and self.children == other.children
        )

    @property
    def is_leaf(self) -> bool:
        return self.kind == LEAF


_LEAF = Structure(LEAF)
_CACHE_LIMIT = 4096
_structures: dict[tuple[Any, ...], Structure] = {}


def _structure(kind: type, keys: tuple[Hashable, ...], children: tuple[Structure, ...]) -> Structure:
    """The one :class:`Structure` of these parts (made on first sight; the table is cleared when it grows large,
    which costs a comparison by value, never a wrong one). Keys other than strings are not shared: ``1`` and
    ``True`` are equal keys, but a dict rebuilt from the structure must get its own."""
    if keys and not all(type(key) is str for key in keys):
        return Structure(kind, keys, children)
    parts = (kind, keys, children)
    structure = _structures.get(parts)
    if structure is None:
        if len(_structures) >= _CACHE_LIMIT:
            _structures.clear()
        structure = _structures[parts] = Structure(kind, keys, children)
    return structure


def _is_dataclass_instance(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _init_fields(value: Any) -> tuple[str, ...] | None:
    """The field names a dataclass is rebuilt from, or None when it cannot be rebuilt from its fields alone."""
    fields = dataclasses.fields(value)
    if any(not f.init for f in fields):
        return None
    return tuple(f.name for f in fields)


def flatten(value: Any, leaves: list[Any] | None = None) -> tuple[list[Any], Structure]:
    """``(leaves, structure)`` of ``value``; :func:`unflatten` puts the leaves back."""
    if leaves is None:
        leaves = []
    return leaves, _flatten_into(value, leaves)


def _flatten_into(value: Any, leaves: list[Any]) -> Structure:
    """The structure of ``value``, its leaves appended to ``leaves``. Runs for every argument and output of every
    module call: a leaf item of a container is settled inline, without a call of its own."""
    if type(value) in _LEAF_TYPES:
        leaves.append(value)
        return _LEAF
    kind: type = _PLAIN.get(type(value), type(value))  # type: ignore[call-overload]
    if kind is tuple or kind is list:
        return _structure(kind, (), _children(value, leaves))
    if isinstance(value, tuple) and hasattr(kind, "_fields"):  # a named tuple
        return _structure(kind, (), _children(value, leaves))
    if isinstance(value, dict) and (kind is dict or kind is OrderedDict or _is_dataclass_instance(value)):
        keys = tuple(value.keys())
        return _structure(kind, keys, _children([value[key] for key in keys], leaves))
    if _is_dataclass_instance(value) and not isinstance(value, dict):
        names = _init_fields(value)
        if names is not None:
            return _structure(kind, names, _children([getattr(value, name) for name in names], leaves))
    leaves.append(value)
    return _LEAF


def _children(items: Any, leaves: list[Any]) -> tuple[Structure, ...]:
    """The structures of ``items``, in order (a leaf's is settled by one set lookup; ``append`` returns None)."""
    leaf_types, append = _LEAF_TYPES, leaves.append
    return tuple(
        [_LEAF if type(item) in leaf_types and append(item) is None else _flatten_into(item, leaves) for item in items]
    )


def unflatten(leaves: list[Any], structure: Structure) -> Any:
    """The value :func:`flatten` took apart, rebuilt around ``leaves`` (consumed from the front)."""
    iterator = iter(leaves)
    return _build(iterator, structure)


def _build(leaves: Any, structure: Structure) -> Any:
    if structure.is_leaf:
        return next(leaves)
    items = [_build(leaves, child) for child in structure.children]
    kind = structure.kind
    assert isinstance(kind, type)
    if kind is tuple or kind is list:
        return kind(items)
    if issubclass(kind, tuple):  # a named tuple
        return kind(*items)
    if dataclasses.is_dataclass(kind):  # ModelOutput and other dataclasses: rebuilt from their (set) fields
        return kind(**{str(key): item for key, item in zip(structure.keys, items)})
    return kind(zip(structure.keys, items))  # type: ignore[call-arg]  # a dict type


def leaf_paths(
    structure: Structure, prefix: tuple[tuple[str, Hashable], ...] = ()
) -> list[tuple[tuple[str, Hashable], ...]]:
    """How to reach each leaf from the top, in leaf order: steps ``("item", index_or_key)`` (subscript) or
    ``("attr", name)`` (attribute of a dataclass that is not a dict)."""
    if structure.is_leaf:
        return [prefix]
    kind = structure.kind
    paths: list[tuple[tuple[str, Hashable], ...]] = []
    by_attribute = dataclasses.is_dataclass(kind) and not (isinstance(kind, type) and issubclass(kind, dict))
    for i, child in enumerate(structure.children):
        step = ("attr", structure.keys[i]) if by_attribute else ("item", structure.keys[i] if structure.keys else i)
        paths.extend(leaf_paths(child, (*prefix, step)))
    return paths
