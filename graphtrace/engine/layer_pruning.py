"""Layer blocks that pruning will drop, recorded without paying for their values.

transformers' ``do_prune_layers`` keeps the first and the last of the layer blocks under a call and drops the ones in
between after the forward, so every dropped block still costs its reprs or its files. Here a numbered block that
starts after a layer block of the same parent is *deferred*: its tensors get statistics as usual, but their full
values are only snapshotted (the printed elements for reprs, a copy for files) and stored when it is known that the
block is kept. That is known when a later sibling turns out to be a layer block (then the deferred block is in the
middle and dropped) or when the parent returns (then it was the last, and its values are stored as if nothing had
been deferred). At most two blocks per parent are pending at a time. Kept calls therefore hold exactly the values
they would have held; dropped calls keep their statistics but no values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from graphtrace.model import CallNode, TensorRecord, Value, is_layer_block, numbered

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from graphtrace.engine.frame import Frame, ValueSink

__all__ = ["LayerBlockDeferral"]


@dataclass
class _Block:
    frame: Frame
    node: CallNode | None = None
    values: list[tuple[TensorRecord, Any, str]] = field(default_factory=list)


class LayerBlockDeferral:
    """The recorder's bookkeeping of deferred blocks (see the module docstring)."""

    def __init__(self, sink: ValueSink, derive: Callable[[TensorRecord, TensorRecord], TensorRecord]) -> None:
        self.sink = sink
        self._derive = derive  # a copy of a record whose numbers are still to be read is announced (step_numbers)
        self._open: _Block | None = None  # the deferred block now running (its nested calls are deferred with it)
        self._snapshots: dict[object, Any] = {}  # per tensor version (the recorder's key) within the open block
        self._pending: dict[int, _Block] = {}  # per parent frame: the finished block that may be the last
        self._with_layer_block: set[int] = set()  # parent frames that already have a layer block

    @property
    def deferring(self) -> bool:
        return self._open is not None

    def begin(self, frame: Frame, parent: Frame | None) -> None:
        if self._open is None and parent is not None and id(parent) in self._with_layer_block:
            if numbered(frame.path) is not None:
                self._open = _Block(frame)
                self._snapshots = {}

    def defer(self, record: TensorRecord, tensor: torch.Tensor, key: object, name: str) -> TensorRecord:
        """A copy of ``record`` (without a value) whose value is taken from a snapshot of ``tensor`` if kept."""
        assert self._open is not None
        snapshot = self._snapshots.get(key)
        if snapshot is None:
            snapshot = self._snapshots[key] = self.sink.snapshot(tensor, name)
        placeholder = self._derive(record, record.with_value(record.value, record.file))  # its own identity
        self._open.values.append((placeholder, snapshot, name))
        return placeholder

    def finishing(self, frame: Frame) -> None:
        """Before ``frame``'s node is built: its last pending child block was the last; store its values."""
        block = self._pending.pop(id(frame), None)
        self._with_layer_block.discard(id(frame))
        if block is not None:
            assert block.node is not None
            kept = self._store(block)
            children = frame.children
            for i in range(len(children) - 1, -1, -1):
                if children[i] is block.node:
                    children[i] = kept
                    break

    def finished(self, frame: Frame, node: CallNode, parent: Frame | None) -> CallNode:
        """``frame`` returned as ``node``; returns the node to attach to ``parent``."""
        if parent is None:
            return node
        if self._open is not None and self._open.frame is frame:
            block, self._open = self._open, None
            block.node = node
            if not is_layer_block(node):
                return self._store(block)  # not a layer block after all: nothing will drop it
            self._pending[id(parent)] = block  # the block it replaces lies between two layer blocks: dropped
        elif self._open is None and is_layer_block(node):
            self._with_layer_block.add(id(parent))
        return node

    def _store(self, block: _Block) -> CallNode:
        stored: dict[int, tuple[Sequence[str] | None, str | None]] = {}
        kept: dict[int, TensorRecord] = {}
        for placeholder, snapshot, name in block.values:
            value = stored.get(id(snapshot))
            if value is None or self.sink.per_name:
                value = stored[id(snapshot)] = self.sink.store_snapshot(snapshot, name)
            kept[id(placeholder)] = self._derive(placeholder, placeholder.with_value(*value))
        assert block.node is not None
        return _with_records(block.node, kept)


def _with_records(node: CallNode, kept: dict[int, TensorRecord]) -> CallNode:
    """``node`` and its subtree with the records in ``kept`` (by identity) replaced."""
    return replace(
        node,
        args=tuple(_value(arg, kept) for arg in node.args),
        kwargs={key: _value(value, kept) for key, value in node.kwargs.items()},
        outputs=None if node.outputs is None else _value(node.outputs, kept),
        children=tuple(_with_records(child, kept) for child in node.children),
    )


def _value(value: Value, kept: dict[int, TensorRecord]) -> Value:
    if isinstance(value, TensorRecord):
        return kept.get(id(value), value)
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return tuple(_value(item, kept) for item in value)
    return {key: _value(item, kept) for key, item in value.items()}
