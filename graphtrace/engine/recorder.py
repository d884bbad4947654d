"""The one sink of capture events.

Both capture strategies (forward wrapping and torch.fx graphs) report the same three events: a call begins, a call
returns, a call raises. The recorder keeps the call stack, numbers repeated calls of a module (``path@N``), turns
tensors into :class:`~graphtrace.model.TensorRecord`\\ s and assembles the :class:`~graphtrace.model.CallNode` tree.
Each top-level call becomes a *step*; a call that starts outside any top-level call is not recorded, unless
``detached_steps`` makes it a step of its own (``generate()`` runs an encoder-decoder model's encoder that way).
Off the CPU, a record's statistics and fingerprint are computed on the tensor's device as it is recorded and read
back with the rest of its step's when the step ends (:mod:`graphtrace.engine.step_numbers`): capture does not wait
for a device once per tensor.

Not thread-safe: one recorder follows one forward at a time.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from graphtrace.engine.caches import StepCache, find_cache
from graphtrace.engine.collector import CollectorPause
from graphtrace.engine.frame import Frame, ValueSink
from graphtrace.engine.layer_pruning import LayerBlockDeferral
from graphtrace.engine.stats import (
    AT_ONCE,
    NO_STATS,
    QUEUED,
    TensorSummary,
    has_stats,
    row_sketch,
    stats_path,
    summarize,
)
from graphtrace.engine.step_numbers import StepNumbers
from graphtrace.errors import describe_error
from graphtrace.model import CallKind, CallNode, DTensorInfo, SourceLine, StepInfo, TensorRecord, Value
from graphtrace.reprs import sanitize_repr, spec_printoptions

__all__ = ["Recorder"]

_PLAIN_SCALARS = frozenset({type(None), bool, int, float, str})


class _Seen:
    """What is known about a tensor object already met in this step (valid while its version is unchanged): its
    record without a value, and once stored, its record with the value (reused when the sink allows)."""

    __slots__ = ("ref", "version", "grad_mode", "record", "stored", "producer", "sketched")

    def __init__(
        self, tensor: torch.Tensor, version: int, grad_mode: bool, record: TensorRecord, sketched: bool
    ) -> None:
        self.ref = weakref.ref(tensor)
        self.version = version
        self.grad_mode = grad_mode
        self.record = record
        self.stored: TensorRecord | None = None
        self.producer: str | None = None
        self.sketched = sketched  # its record has (or waits for) a fingerprint


def _dtensor_info(value: Any) -> DTensorInfo | None:
    try:
        return DTensorInfo(
            placements=str(tuple(value.placements)),
            mesh_shape=tuple(value.device_mesh.shape),
            global_shape=tuple(value.shape),
        )
    except (AttributeError, TypeError):  # a duck-typed object with a _local_tensor but not the DTensor API
        return None


class Recorder:
    """Builds the call tree from begin/end/fail events.

    ``sink`` receives the tensors whose full value is wanted (None: statistics only). ``on_step_start`` is called with
    the number of each top-level call as it begins, ``on_step`` with each finished one, also when it raised.
    ``detached_steps`` records a submodule call made outside any call of the model as a step of its own;
    ``step_caches`` fills :attr:`step_info` (what each step did to the key/value cache passed to it);
    ``keep_steps=False`` hands each step to ``on_step`` without keeping it (the transformers shim needs only the last).
    ``prune_layers`` records the layer blocks that pruning will drop without their values (see ``layer_pruning``).
    ``select`` (a predicate on call paths) records only the calls it accepts and everything inside them; the calls
    around them stay in the tree as structural nodes (no inputs, no outputs), every other call is left out.
    ``calls`` counts the calls begun so far (for a progress line).
    """

    def __init__(
        self,
        sink: ValueSink | None = None,
        on_step: Callable[[CallNode], None] | None = None,
        on_step_start: Callable[[int], None] | None = None,
        *,
        detached_steps: bool = False,
        step_caches: bool = False,
        keep_steps: bool = True,
        prune_layers: bool = False,
        select: Callable[[str], bool] | None = None,
        sketches: bool = False,
    ) -> None:
        self.sink = sink
        self.sketches = sketches  # value fingerprints, for traces that keep no full values
        self.select = select
        self.calls = 0
        self._numbers = StepNumbers()
        # With pruning ahead, blocks that it will drop get no values (see layer_pruning); sinks opt in.
        deferral = LayerBlockDeferral(sink, self._numbers.derive) if prune_layers and sink is not None else None
        self._deferral = deferral
        self._linewidth = sink.linewidth if sink is not None else None
        self._named = sink is not None  # values are stored under file names; without a sink no name is read
        self.on_step = on_step
        self.on_step_start = on_step_start
        self.detached_steps = detached_steps
        self.step_caches = step_caches
        self.keep_steps = keep_steps
        self.steps: list[CallNode] = []
        self.step_info: list[StepInfo] = []
        self._step_count = 0
        self._step_cache: StepCache | None = None
        self._stack: list[Frame] = []
        self._counts: dict[str, int] = {}
        self._seen: dict[int, _Seen] = {}
        self._aliases: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        self.collector = CollectorPause()  # held during each step (see collector.py); callers may hold it longer

    def close(self) -> None:
        """The capture is over: garbage collection resumes, also when a step never ended (a call that did not
        return), and the numbers such a step left waiting are dropped."""
        self._numbers.clear()
        self.collector.release_all()

    # -- events -----------------------------------------------------------------------------------------------------

    def begin(
        self,
        path: str,
        type_name: str,
        leaf: bool,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        strategy: str = "eager",
        root: bool = False,
        kind: CallKind = "module",
    ) -> Frame | None:
        """Record the start of a call; returns None when the call is not recorded (it began outside a step).

        An op's call (``kind="op"``, recorded by the fx engine) takes no part in data flow by tensor identity: the
        engine knows it from the graph."""
        step = not self._stack
        if step:
            if not (root or self.detached_steps):
                return None
            root = True  # the first call of a step is its root, also a detached submodule call
            self.collector.hold()
        try:
            if step:
                self._counts = {}
                self._seen = {}
                self._aliases = {}
                self._numbers.clear()  # left by a step that never ended
                if self.step_caches:
                    cache = find_cache((*args, *kwargs.values()))
                    self._step_cache = StepCache(cache) if cache is not None else None
                if self.on_step_start is not None:
                    self.on_step_start(self._step_count)
            index = self._counts.get(path, 0)
            self._counts[path] = index + 1
            frame = Frame(path, index, type_name, leaf, strategy, root, kind)
            self.calls += 1
            if self._deferral is not None:
                self._deferral.begin(frame, self._stack[-1] if self._stack else None)
            if self.select is not None and (not self._stack or self._stack[-1].structural) and not self.select(path):
                frame.structural = True
                self._stack.append(frame)
                return frame
            prefix = f"{frame.name}_inputs" if self._named else ""
            # The reference records {"args": ..., "kwargs": ...}; a submodule drops an empty one (naming is unaffected).
            if args:
                frame.args = self._convert_sequence(args, f"{prefix}_args", frame, True, False)
            if kwargs:
                frame.kwargs = self._convert_mapping(kwargs, f"{prefix}_kwargs", frame, True, False)
            self._stack.append(frame)
            return frame
        except BaseException:
            if step and not self._stack:  # the step never began, so nothing will end it: collection resumes now
                self.collector.release()
            raise

    def end(self, frame: Frame, output: Any) -> None:
        """Record the return of ``frame``'s call with ``output``."""
        # The reference keeps full values of leaf and root outputs only; other outputs get statistics.
        if frame.structural:
            self._finish(frame, None, None)
            return
        store = frame.leaf or frame.root
        try:
            outputs = self._convert(output, f"{frame.name}_outputs" if self._named else "", frame, store, True)
        except BaseException as exc:
            self.fail(frame, exc)
            raise
        self._finish(frame, outputs, None)

    def fail(self, frame: Frame, exc: BaseException) -> None:
        """Record that ``frame``'s call raised ``exc`` (the caller re-raises it)."""
        self._finish(frame, None, describe_error(exc))

    # -- tree assembly ----------------------------------------------------------------------------------------------

    def _finish(self, frame: Frame, outputs: Value | None, error: str | None) -> None:
        stack = self._stack
        while stack and stack[-1] is not frame:  # a call that never returned (should not happen with wrappers)
            lost = stack.pop()
            self._attach(self._completed(lost, None, "did not return"))
        if not stack:
            return
        stack.pop()
        node = self._completed(frame, outputs, error)
        if frame.structural and not node.children and error is None and stack:
            return  # outside the selected modules, and nothing selected inside it: left out
        self._attach(node)

    def _completed(self, frame: Frame, outputs: Value | None, error: str | None) -> CallNode:
        deferral = self._deferral
        if deferral is None:
            return self._node(frame, outputs, error)
        deferral.finishing(frame)
        return deferral.finished(frame, self._node(frame, outputs, error), self._stack[-1] if self._stack else None)

    def _node(self, frame: Frame, outputs: Value | None, error: str | None) -> CallNode:
        return CallNode(
            path=frame.path,
            index=frame.index,
            type_name=frame.type_name,
            kind=frame.kind,
            leaf=frame.leaf,
            strategy=frame.strategy,
            args=frame.args,
            kwargs=frame.kwargs,
            outputs=outputs,
            children=tuple(frame.children),
            error=error,
            inputs_from=tuple(frame.inputs_from),
            source=frame.source,
        )

    def _attach(self, node: CallNode) -> None:
        if self._stack:
            self._stack[-1].children.append(node)
            return
        if self.step_caches:
            watched, self._step_cache = self._step_cache, None
            self.step_info.append(watched.step_info(self._state_tensor) if watched is not None else StepInfo())
        self._numbers.read()  # the step's one read of its numbers: its records are complete from here on
        if self.keep_steps:
            self.steps.append(node)
        self._step_count += 1
        self._seen = {}
        self._aliases = {}
        self.collector.release()
        if self.on_step is not None:
            self.on_step(node)

    def current_module(self) -> Frame | None:
        """The innermost call in progress when it is a recorded module call (not an op, not a structural ancestor
        outside the selected modules): where an op called now belongs."""
        stack = self._stack
        if not stack:
            return None
        top = stack[-1]
        return None if top.kind == "op" or top.structural else top

    def record_op(self, name: str, inputs: Iterable[Any], output: Any, source: SourceLine) -> None:
        """Record an op that the current module call made during the real forward (the op tier): its output, the
        calls that produced its tensor inputs, and the line of user code that called it. Its output becomes the
        producer of what it returned, so later ops and calls name it in their data flow."""
        module = self.current_module()
        if module is None:
            return
        frame = self.begin(f"{module.path}#{name}", name, True, (), {}, kind="op")
        if frame is None:
            return
        frame.source = source
        for tensor in inputs:
            producer = self.producer_of(tensor)
            if producer is not None and producer not in frame.inputs_from:
                frame.inputs_from.append(producer)
        try:
            outputs = self._convert(output, f"{frame.name}_outputs", frame, True, True)
        except BaseException as exc:
            self.fail(frame, exc)
            raise
        self._finish(frame, outputs, None)

    def producer_of(self, tensor: torch.Tensor) -> str | None:
        """The id of the call whose output ``tensor`` was, if it was recorded as one in this step (or, for a view
        the op tier saw made, the call whose output it views)."""
        seen = self._seen.get(id(tensor))
        if seen is not None and seen.ref() is tensor:
            return seen.producer
        alias = self._aliases.get(id(tensor))
        return alias[1] if alias is not None and alias[0]() is tensor else None

    def alias(self, view: torch.Tensor, base: torch.Tensor) -> None:
        """``view`` holds ``base``'s values in another shape (an unrecorded op): data flow goes through it."""
        producer = self.producer_of(base)
        if producer is not None and view is not base:
            self._aliases[id(view)] = (weakref.ref(view), producer)

    # -- values -----------------------------------------------------------------------------------------------------

    def _convert(self, value: Any, name: str, frame: Frame, store: bool, produced: bool) -> Value:
        # Same order of checks as the reference: sequences, mappings, DTensor-likes, tensors, anything else.
        if type(value) is torch.Tensor:
            return self._tensor(value, name, frame, store, produced, None)
        if isinstance(value, (list, tuple)):
            return self._convert_sequence(value, name, frame, store, produced)
        if isinstance(value, dict):
            return self._convert_mapping(value, name, frame, store, produced)
        if hasattr(value, "_local_tensor"):
            return self._tensor(value._local_tensor, name, frame, store, produced, _dtensor_info(value))
        if isinstance(value, torch.Tensor):
            return self._tensor(value, name, frame, store, produced, None)
        if type(value) in _PLAIN_SCALARS:
            return repr(value)
        with spec_printoptions(self._linewidth):  # an object's repr may print tensors
            return sanitize_repr(repr(value))

    def _convert_sequence(self, values: Any, name: str, frame: Frame, store: bool, produced: bool) -> tuple[Value, ...]:
        convert = self._convert  # a list comprehension: no generator frame per call
        if not self._named:
            return tuple([convert(v, "", frame, store, produced) for v in values])
        return tuple([convert(v, f"{name}_{i}", frame, store, produced) for i, v in enumerate(values)])

    def _convert_mapping(
        self, values: Any, name: str, frame: Frame, store: bool, produced: bool
    ) -> Mapping[str, Value]:
        convert = self._convert
        if not self._named:
            return {k: convert(v, "", frame, store, produced) for k, v in values.items()}
        return {k: convert(v, f"{name}_{k}", frame, store, produced) for k, v in values.items()}

    def _tensor(
        self,
        tensor: torch.Tensor,
        name: str,
        frame: Frame,
        store: bool,
        produced: bool,
        dtensor: DTensorInfo | None,
    ) -> TensorRecord:
        # a fingerprint of what calls return (what a diff compares), not of every argument; but of integer arguments
        # too (ids, positions, a relative position's buckets): few and small, and their only fingerprint
        sketch = self.sketches and (produced or _integral(tensor.dtype))
        seen = self._remember(tensor, sketch)
        if sketch and not seen.sketched and has_stats(tensor):  # met before as an argument
            numbers = self._numbers
            if numbers.at_once(tensor):
                seen.record = seen.record.with_sketch(row_sketch(tensor))
            else:
                seen.record = numbers.derive(seen.record, seen.record.with_sketch(None), numbers.fingerprint(tensor))
            seen.sketched = True
        if frame.kind == "op" and frame.source is None:
            pass  # an fx op record: its data flow comes from the graph
        elif produced:
            seen.producer = frame.id
        elif seen.producer is not None and seen.producer not in frame.inputs_from:
            frame.inputs_from.append(seen.producer)
        sink = self.sink
        if sink is None:
            record = seen.record
        elif not store:
            # A container's output that a call inside it already stored (attention's output is o_proj's) refers to
            # that value, so the diff compares the container by values too; no second copy is written.
            record = seen.stored if produced and seen.stored is not None else seen.record
        elif self._deferral is not None and self._deferral.deferring and seen.stored is None:
            record = self._deferral.defer(seen.record, tensor, seen, name)
        elif sink.per_name:
            record = self._numbers.derive(seen.record, seen.record.with_value(*sink.store(tensor, name)))
            if seen.stored is None:
                seen.stored = record
        else:
            stored = seen.stored
            if stored is None:
                value = sink.store(tensor, name)
                stored = seen.stored = self._numbers.derive(seen.record, seen.record.with_value(*value))
            record = stored
        if dtensor is not None:
            record = self._numbers.derive(record, dataclasses.replace(record, dtensor=dtensor))
        return record

    def _state_tensor(self, value: torch.Tensor, statistics: bool) -> TensorRecord:
        """A record of a tensor held as state (a cache's keys): no value, no data flow, statistics when asked."""
        dtensor = None
        if hasattr(value, "_local_tensor"):
            value, dtensor = value._local_tensor, _dtensor_info(value)
        record = self._remember(value).record if statistics else _record(value, NO_STATS)
        return record if dtensor is None else self._numbers.derive(record, dataclasses.replace(record, dtensor=dtensor))

    def _remember(self, tensor: torch.Tensor, sketch: bool = False) -> _Seen:
        """The cached facts about ``tensor``, recomputed when it is new or was modified in place since (a new record
        gets the value fingerprint when ``sketch``)."""
        key = id(tensor)
        grad_mode = tensor.requires_grad and torch.is_grad_enabled()
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter: never reuse
            return _Seen(tensor, -1, grad_mode, self._record(tensor, sketch), sketch)
        old = self._seen.get(key)
        producer = None
        if old is not None and old.ref() is tensor:
            if old.version == version and old.grad_mode == grad_mode:
                return old
            producer = old.producer  # modified in place since: new statistics, same origin
        seen = _Seen(tensor, version, grad_mode, self._record(tensor, sketch), sketch)
        seen.producer = producer
        self._seen[key] = seen
        return seen

    def _record(self, tensor: torch.Tensor, sketch: bool) -> TensorRecord:
        """A new record of ``tensor`` with its statistics (and its fingerprint when ``sketch``), no value: read at
        once on the CPU, otherwise queued and the record completed with its step."""
        numbers = self._numbers
        if numbers.at_once(tensor):
            return _record(tensor, summarize(tensor), row_sketch(tensor) if sketch else None)
        summary = -1
        path = stats_path(tensor)
        if path == QUEUED:
            record = _record(tensor, NO_STATS)
            summary = numbers.summary(tensor)
        else:
            record = _record(tensor, summarize(tensor) if path == AT_ONCE else NO_STATS)
        fingerprint = numbers.fingerprint(tensor) if sketch else None
        if summary >= 0 or fingerprint is not None:
            numbers.pending(record, summary, fingerprint)
        return record


_dtype_names: dict[torch.dtype, str] = {}


def _record(tensor: torch.Tensor, summary: TensorSummary, sketch: tuple[float, ...] | None = None) -> TensorRecord:
    """The record of ``tensor``: shape, dtype, device, the statistics of ``summary`` and the fingerprint ``sketch``,
    no value."""
    dtype = tensor.dtype
    dtype_name = _dtype_names.get(dtype)
    if dtype_name is None:
        dtype_name = _dtype_names[dtype] = str(dtype)
    stats = summary.stats
    return TensorRecord(
        tuple(tensor.shape),
        dtype_name,
        "cpu" if tensor.is_cpu else str(tensor.device),
        stats,
        summary.spec_stats,
        summary.nan_count,
        summary.inf_count,
        None,  # value
        None,  # file
        None,  # dtensor
        sketch,
    )


def _integral(dtype: torch.dtype) -> bool:
    """An integer or boolean dtype: no statistics, but a fingerprint (see stats.fingerprint)."""
    return not dtype.is_floating_point and not dtype.is_complex
