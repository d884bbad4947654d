"""Checking a later call against a graph already verified bit for bit in this capture, without computing.

The first call of a plan in a capture is replayed numerically (:class:`~graphtrace.engine.fx.replay.Replay`). With
``ops=False`` a later call of the same plan (the same module, or an identical instance sharing it) is checked by a
:class:`StructuralReplay`: the real forward must call the children the graph calls, in the graph's order, each
returning the structure (containers, constants, tensor shapes and dtypes) the graph was traced with, and return
such an output itself. It computes nothing; the call's data flow is the graph's static flow
(:mod:`~graphtrace.engine.fx.graph_flow`) resolved against this call's inputs and child calls. A call that
deviates falls back exactly as one that fails a numeric replay does.

Why this is enough: the signature fixes every non-tensor argument and every tensor's metadata, the plan's key fixes
the module's attributes, and the graph was verified bit for bit on the first call of this capture; what a later
call could still do differently without tensor data deciding it is call other children, which is checked. What
depends on tensor data (``if mask.all()``) fails the trace itself. Values never come from a graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from graphtrace.engine.fx.containers import flatten
from graphtrace.engine.fx.graph_flow import CALL, ChildCall
from graphtrace.engine.fx.guard import tensors_in
from graphtrace.engine.fx.replay import add_flows, nonconforming
from graphtrace.engine.fx.tracer import META, UNKNOWN, Plan
from graphtrace.engine.recorder import Frame, Recorder

__all__ = ["StructuralReplay"]


class StructuralReplay:
    """One call of a module checked against its verified :class:`Plan` without computing: a
    :class:`~graphtrace.engine.fx.replay.Lockstep`, as the numeric :class:`~graphtrace.engine.fx.replay.Replay`."""

    def __init__(self, module: nn.Module, plan: Plan, inputs: list[Any], recorder: Recorder, frame: Frame) -> None:
        self.module = module
        self.plan = plan
        self.frame = frame
        self.failure: str | None = None
        self._inputs = inputs
        self._recorder = recorder
        self._producers: list[tuple[str, ...]] | None = None
        self._child_ids: list[str] = []
        self._flows: list[tuple[int, tuple[str, ...]]] = []
        self._next = 0
        self._returned: Any = _NOTHING

    def child_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if self.failure is None and self._settle_returned():
            calls = self.plan.calls
            if self._next >= len(calls):
                self._fail(f"Mismatch: the forward calls {type(module).__name__} after the graph's last child call")
            elif self._expected(calls[self._next]) is not module:
                self._fail(
                    f"Mismatch: the forward calls {type(module).__name__} where the graph calls "
                    f"{calls[self._next].node.target}"
                )

    def child_begun(self, frame: Frame) -> None:
        if self.failure is not None:
            return
        if self._producers is None:  # as the numeric replay, which reads its inputs' producers when it first runs
            self._producers = [
                tuple(dict.fromkeys(p for t in tensors_in(value) if (p := self._recorder.producer_of(t)) is not None))
                for value in self._inputs
            ]
        producers, child_ids = self._producers, self._child_ids
        flow = tuple(
            dict.fromkeys(
                source
                for kind, index in self.plan.calls[self._next].sources
                for source in ((child_ids[index],) if kind == CALL else producers[index])
            )
        )
        self._flows.append((len(self.frame.children), flow))
        child_ids.append(frame.id)

    def child_returned(self, output: Any) -> None:
        if self.failure is None:
            self._returned = output

    def finish(self, output: Any) -> bool:
        if self.failure is not None or not self._settle_returned():
            return False
        calls = self.plan.calls
        if self._next < len(calls):
            self._fail(f"Mismatch: the graph calls {calls[self._next].node.target}, the forward does not")
            return False
        found = nonconforming(self.plan.output_meta, output)
        if found is None and self.plan.output_meta is UNKNOWN and flatten(output)[1] != self.plan.output:
            found = "another structure"
        if found is not None:
            self._fail(f"Mismatch: the output: {found} than the graph was traced with")
            return False
        add_flows(self.frame, self._flows)
        return True

    def abandon(self) -> None:
        self._fail("the call raised")

    def _expected(self, call: ChildCall) -> Any:
        try:
            return self.module.get_submodule(str(call.node.target))
        except AttributeError:
            return None

    def _settle_returned(self) -> bool:
        """Check the output of the child call that just returned, if any, against the graph's trace-time value."""
        output, self._returned = self._returned, _NOTHING
        if output is _NOTHING:
            return True
        node = self.plan.calls[self._next].node
        self._next += 1
        found = nonconforming(node.meta.get(META, UNKNOWN), output)
        if found is not None:
            self._fail(f"Mismatch: {node.target} returned {found} than the graph was traced with")
            return False
        return True

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason


_NOTHING = object()
