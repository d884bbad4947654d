"""A call in progress and where full tensor values go: what the recorder and its helpers (the layer-block deferral,
the engines' watchers) share, below all of them so that none imports another for a type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from graphtrace.model import CallKind, CallNode, SourceLine, Value

__all__ = ["Frame", "ValueSink"]


class ValueSink(Protocol):
    """Where full tensor values go (implemented in ``graphtrace.io.tensors``). ``per_name`` is False when the stored
    value depends only on the tensor's contents, so the recorder may reuse it for an unchanged tensor seen again.
    ``linewidth`` is the print width transformers has in this mode when it takes the ``repr`` of other objects."""

    per_name: bool
    linewidth: int | None

    def store(self, tensor: torch.Tensor, name: str) -> tuple[Sequence[str] | None, str | None]:
        """Keep ``tensor``'s value under ``name``; return ``(repr_lines, None)`` or ``(None, relative_file)``."""
        ...

    def snapshot(self, tensor: torch.Tensor, name: str) -> Any:
        """What :meth:`store_snapshot` needs to store ``tensor``'s value later (a layer block pruning may drop)."""
        ...

    def store_snapshot(self, snapshot: Any, name: str) -> tuple[Sequence[str] | None, str | None]:
        """:meth:`store` of a value taken by :meth:`snapshot`."""
        ...

    def finish(self) -> None:
        """The step's values are complete (files on disk)."""
        ...

    def close(self) -> None:
        """:meth:`finish`, and stop writing for good."""
        ...


class Frame:
    """A call in progress."""

    __slots__ = (
        "path",
        "index",
        "name",
        "id",
        "type_name",
        "leaf",
        "strategy",
        "root",
        "args",
        "kwargs",
        "children",
        "inputs_from",
        "kind",
        "structural",
        "source",
    )

    def __init__(
        self, path: str, index: int, type_name: str, leaf: bool, strategy: str, root: bool, kind: CallKind = "module"
    ) -> None:
        self.path = path
        self.index = index
        # The prefix of this call's file names: the first call keeps the reference's name, later calls get "@N" so
        # that no call overwrites another's tensors.
        self.name = path if index == 0 else f"{path}@{index}"
        self.id = f"{path}@{index}"  # as CallNode.id: what data flow names a call by
        self.type_name = type_name
        self.leaf = leaf
        self.strategy = strategy
        self.root = root
        self.args: tuple[Value, ...] = ()
        self.kwargs: Mapping[str, Value] = {}
        self.children: list[CallNode] = []
        self.inputs_from: list[str] = []
        self.kind = kind
        self.structural = False  # outside the modules selected for recording: kept only as an ancestor of them
        self.source: SourceLine | None = None
