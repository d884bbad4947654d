"""The data flow of a module's graph as a static property: which of the call's inputs and earlier child calls feed
each ``call_module`` node, through any reshapes and arithmetic in between.

A numerically verified replay learns the same thing as it runs (:class:`~graphtrace.engine.fx.replay.Replay`). A
structural replay (:mod:`~graphtrace.engine.fx.structural_replay`) does not compute, so it takes the flow from here and
resolves it against the call: an input stands for the calls that produced its tensors, a child call for the child's
recorded call. Sources are kept in the order and with the deduplication the numeric replay uses, so both give the
same ``inputs_from``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx

__all__ = ["INPUT", "CALL", "ChildCall", "child_calls"]

INPUT, CALL = "input", "call"
Source = tuple[str, int]
"""``(INPUT, k)``: the graph's k-th placeholder; ``(CALL, j)``: the graph's j-th child call."""


@dataclass(frozen=True, slots=True)
class ChildCall:
    """One ``call_module`` node of a graph, in graph order, with the sources of its arguments."""

    node: fx.Node
    sources: tuple[Source, ...]


def child_calls(graph: fx.Graph) -> tuple[ChildCall, ...]:
    """Every ``call_module`` node of ``graph`` in order, each with what feeds it."""
    sources: dict[fx.Node, tuple[Source, ...]] = {}
    calls: list[ChildCall] = []
    inputs = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            sources[node] = ((INPUT, inputs),)
            inputs += 1
        elif node.op == "get_attr" or node.op == "output":
            sources[node] = ()
        else:
            fed = tuple(dict.fromkeys(source for used in node.all_input_nodes for source in sources[used]))
            if node.op == "call_module":
                calls.append(ChildCall(node, fed))
                sources[node] = ((CALL, len(calls) - 1),)
            else:
                sources[node] = fed
    return tuple(calls)
