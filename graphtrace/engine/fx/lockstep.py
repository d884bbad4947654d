"""The one walk of a real call beside its module's plan, shared by the numeric and the structural replay.

The fx engine (``dispatch.py``) tells a :class:`Lockstep` what the real forward does: ``child_call`` before each
child module runs, ``child_begun`` once the recorder has its frame, ``child_returned`` with its output, then
``finish`` with the forward's output (or ``abandon`` when it raised). The walk matches the forward's child calls one
by one against the graph's ``call_module`` nodes, in order, then the forward's output against the graph's, and
collects the graph's data flow into each child call; the first deviation is the call's :attr:`failure`. How the next
node is reached and what is compared is each replay's own: :class:`~graphtrace.engine.fx.replay.Replay` computes the
module's operations up to the node and compares the child's arguments bit for bit;
:class:`~graphtrace.engine.fx.structural_replay.StructuralReplay` steps through the plan's calls and compares the
structure of what the children return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import fx, nn

from graphtrace.engine.frame import Frame
from graphtrace.engine.fx.tracer import Plan

__all__ = ["END", "Lockstep", "add_flows"]

END: Any = object()
"""What :meth:`Lockstep._next_node` returns when the graph makes no further child call."""


class Lockstep:
    """One call of a module walked beside its :class:`Plan` (see the module docs); subclasses say how the next node
    is reached (:meth:`_next_node`), what a matched child call adds (:meth:`_accept`, :meth:`_flow_into`,
    :meth:`_begun`) and how the outputs compare (:meth:`_output_difference`)."""

    def __init__(self, module: nn.Module, plan: Plan, frame: Frame) -> None:
        self.module = module
        self.plan = plan
        self.frame = frame
        self.failure: str | None = None
        self._current: fx.Node | None = None
        self._flows: list[tuple[int, tuple[str, ...]]] = []
        self._returned: Any = _NOTHING

    # -- the driver's side ------------------------------------------------------------------------------------------

    def child_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """The real forward is about to call ``module``: it must be the graph's next child call."""
        if self.failure is None:
            self._guarded(self._match_child, module, args, kwargs)

    def child_begun(self, frame: Frame) -> None:
        """The child's call was recorded as ``frame``: the graph's inputs to it become its data flow."""
        if self.failure is None and self._current is not None:
            self._flows.append((len(self.frame.children), self._flow_into(self._current)))
            self._begun(self._current, frame)

    def child_returned(self, output: Any) -> None:
        if self.failure is None:
            self._returned = output

    def finish(self, output: Any) -> bool:
        """The real forward returned ``output``: the graph must make no further child call and return the same.
        True when the call is verified (its data flow is then added to its frame)."""
        return self.failure is None and bool(self._guarded(self._match_end, output))

    def abandon(self) -> None:
        """The real call raised: nothing is verified."""
        self._fail("the call raised")

    # -- the walk ---------------------------------------------------------------------------------------------------

    def _match_child(self, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        node = self._next_node()
        if node is None:
            return
        if node is END:
            self._fail(f"Mismatch: the forward calls {type(module).__name__} after the graph's last child call")
        elif self._child_module(node) is not module:
            self._fail(f"Mismatch: the forward calls {type(module).__name__} where the graph calls {node.target}")
        elif self._accept(node, module, args, kwargs):
            self._current = node

    def _match_end(self, output: Any) -> bool:
        node = self._next_node()
        if node is None:
            return False
        if node is not END:
            self._fail(f"Mismatch: the graph calls {node.target}, the forward does not")
            return False
        found = self._output_difference(output)
        if found is not None:
            self._fail(f"Mismatch: the output: {found}")
            return False
        self._verified()
        add_flows(self.frame, self._flows)
        return True

    def _take_returned(self, default: Any = None) -> Any:
        """The output of the child call that returned since the last step (``default`` when none did)."""
        output, self._returned = self._returned, _NOTHING
        return default if output is _NOTHING else output

    def _child_module(self, node: fx.Node) -> nn.Module | None:
        target = str(node.target)
        child = _registered_child(self.module, target)
        if child is not None:
            return child
        try:
            return self.module.get_submodule(target)
        except AttributeError:
            return None

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason

    # -- what each replay says --------------------------------------------------------------------------------------

    def _guarded(self, method: Callable[..., Any], *args: Any) -> Any:
        """Runs a step of the walk (the numeric replay turns its own trouble into a failure here)."""
        return method(*args)

    def _next_node(self) -> Any:
        """The graph's next ``call_module`` node, :data:`END` after its last, or None when the walk just failed;
        first settles the child call that returned, if any."""
        raise NotImplementedError

    def _accept(self, node: fx.Node, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        """The forward calls the child the graph expects: anything more to check (False when it failed)."""
        return True

    def _flow_into(self, node: fx.Node) -> tuple[str, ...]:
        """The ids of the calls whose outputs reach the child call at ``node``, through the graph."""
        raise NotImplementedError

    def _begun(self, node: fx.Node, frame: Frame) -> None:
        """The child call at ``node`` is recorded as ``frame``."""

    def _output_difference(self, output: Any) -> str | None:
        """How the forward's output differs from the graph's, or None."""
        raise NotImplementedError

    def _verified(self) -> None:
        """The walk reached the end without a deviation."""


_NOTHING: Any = object()
_MODULE_GETATTR = nn.Module.__getattr__
_OBJECT_GETATTRIBUTE = object.__getattribute__


def _registered_child(module: nn.Module, target: str) -> nn.Module | None:
    """What ``module.get_submodule(target)`` returns, when that is plainly the registered child (None when it may
    not be: a dotted path, a name shadowed by an attribute, parameter, buffer or class attribute, or attribute
    lookup of its own). ``get_submodule`` asks ``hasattr`` and then ``getattr``, each failing the normal lookup
    before ``nn.Module.__getattr__`` finds the child: several microseconds per child call."""
    child = module._modules.get(target)
    if (
        not isinstance(child, nn.Module)
        or type(module).__getattr__ is not _MODULE_GETATTR
        or type(module).__getattribute__ is not _OBJECT_GETATTRIBUTE
        or target in module.__dict__
        or target in module._parameters
        or target in module._buffers
        or hasattr(type(module), target)
    ):
        return None
    return child


def add_flows(frame: Frame, flows: Iterable[tuple[int, tuple[str, ...]]]) -> None:
    """A verified graph's data flow into each child call of ``frame`` (by position among its children), added to
    what eager capture saw. A structural frame (outside the selected modules) drops children: no flow by position."""
    if frame.structural:
        return
    children = frame.children
    for position, flow in flows:
        child = children[position]
        extra = tuple(source for source in flow if source not in child.inputs_from)
        if extra:
            children[position] = dataclasses.replace(child, inputs_from=child.inputs_from + extra)
