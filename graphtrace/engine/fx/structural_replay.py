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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from graphtrace.engine.frame import Frame
from graphtrace.engine.fx.containers import flatten
from graphtrace.engine.fx.graph_flow import CALL
from graphtrace.engine.fx.guard import tensors_in
from graphtrace.engine.fx.lockstep import END, Lockstep
from graphtrace.engine.fx.tracer import UNKNOWN, Plan
from graphtrace.engine.recorder import Recorder

__all__ = ["StructuralReplay"]


class StructuralReplay(Lockstep):
    """One call of a module checked against its verified :class:`Plan` without computing: the shared
    :class:`~graphtrace.engine.fx.lockstep.Lockstep` walk, stepping through the plan's child calls and comparing the
    structure of what they return with what the graph was traced with."""

    def __init__(self, module: nn.Module, plan: Plan, inputs: list[Any], recorder: Recorder, frame: Frame) -> None:
        super().__init__(module, plan, frame)
        self._inputs = inputs
        self._recorder = recorder
        self._producers: list[tuple[str, ...]] | None = None
        self._child_ids: list[str] = []
        self._next = 0

    def _next_node(self) -> Any:
        output = self._take_returned(_NOTHING)
        calls = self.plan.calls
        if output is not _NOTHING:  # the child call that just returned: its output as the graph was traced with?
            node = calls[self._next].node
            self._next += 1
            found = self.plan.returns[node].nonconforming(output)
            if found is not None:
                self._fail(f"Mismatch: {node.target} returned {found} than the graph was traced with")
                return None
        return calls[self._next].node if self._next < len(calls) else END

    def _flow_into(self, node: Any) -> tuple[str, ...]:
        if self._producers is None:  # as the numeric replay, which reads its inputs' producers when it first runs
            producer_of = self._recorder.producer_of
            self._producers = [_producers(value, producer_of) for value in self._inputs]
        producers, child_ids = self._producers, self._child_ids
        sources = self.plan.calls[self._next].sources
        if len(sources) == 1:  # one input or one earlier call feeds the child: already free of repeats
            kind, index = sources[0]
            return (child_ids[index],) if kind == CALL else producers[index]
        return tuple(
            dict.fromkeys(
                source
                for kind, index in sources
                for source in ((child_ids[index],) if kind == CALL else producers[index])
            )
        )

    def _begun(self, node: Any, frame: Frame) -> None:
        self._child_ids.append(frame.id)

    def _output_difference(self, output: Any) -> str | None:
        found = self.plan.output_expectation.nonconforming(output)
        if found is None and self.plan.output_meta is UNKNOWN and flatten(output)[1] != self.plan.output:
            found = "another structure"
        return None if found is None else f"{found} than the graph was traced with"


_NOTHING = object()


def _producers(value: Any, producer_of: Callable[[torch.Tensor], str | None]) -> tuple[str, ...]:
    """The ids of the calls that produced the tensors in ``value``, each once, in order."""
    if type(value) is torch.Tensor:  # the common input, without walking containers
        producer = producer_of(value)
        return () if producer is None else (producer,)
    return tuple(dict.fromkeys(p for t in tensors_in(value) if (p := producer_of(t)) is not None))
