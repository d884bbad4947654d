"""Trace -> networkx DiGraph: the call graph of one step, as it is drawn.

Nodes are calls (module calls, and ops when recorded), keyed by call id (``path@index``). A call whose children are
drawn is a *cluster* (``cluster=True``); every node names its enclosing cluster in ``parent``. Edges are data flow
(:mod:`graphtrace.render.step_flow`), mapped onto the drawn nodes; ``inferred=True`` marks flow derived from call order.

Three things keep the graph readable at any size:

- folding: a run of consecutive, identical numbered blocks (``layers.0`` ... ``layers.15``, or repeated calls of one
  module) is drawn once, as ``layers.0–15`` with ``repeat=16``. Identical means the same module types, relative
  paths, output shapes and dtypes, capture strategy and marks (an error, a fallback, NaN/Inf) all the way down, so
  folding never hides something the unfolded graph would mark;
- a depth limit: calls at ``depth`` are drawn as boxes with their calls inside counted (``calls_inside``); without an
  explicit depth, the deepest limit whose graph has at most ``max_boxes`` boxes is chosen;
- focus: only one call's subtree is drawn; the calls outside that feed it or read its outputs appear as
  ``context`` nodes.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass

import networkx as nx

from graphtrace.errors import CallNotFoundError, InvalidOptionError
from graphtrace.model import CallNode, Trace, iter_tensors, locate, numbered
from graphtrace.render.step_flow import data_flow

__all__ = ["DEFAULT_MAX_BOXES", "boxes", "call_graph"]

DEFAULT_MAX_BOXES = 150
"""Box budget of a graph drawn without an explicit depth: a screen's worth."""


def call_graph(
    trace: Trace,
    *,
    step: int = -1,
    depth: int | None = None,
    focus: str | None = None,
    unfold: bool = False,
    max_boxes: int | None = DEFAULT_MAX_BOXES,
) -> nx.DiGraph:
    """The call graph of ``trace``'s step ``step`` (the last by default).

    Args:
        step: which top-level forward call to draw.
        depth: draw calls down to this depth below the drawn root (0: the root alone); None: as deep as
            ``max_boxes`` allows.
        focus: draw only this call's subtree: a module path, with or without the model class
            (``model.layers.3``), optionally ``@N`` for its N-th call.
        unfold: draw every repeated block instead of folding identical runs.
        max_boxes: box budget when ``depth`` is None (None: no budget).
    """
    _check_options(depth, max_boxes, unfold)
    steps = len(trace.steps)
    if not steps:
        raise InvalidOptionError("this trace recorded no forward call, so there is no call graph to draw.")
    if not isinstance(step, int) or not -steps <= step < steps:
        raise InvalidOptionError(
            f"step {step!r} does not exist: the trace has {steps} forward call(s), 0..{steps - 1}."
        )
    step_root = trace.steps[step]
    root = _find(step_root, focus) if focus is not None else step_root
    fold = _Folder(trace.fallbacks, enabled=not unfold)
    view = _View(root, depth, fold)
    auto_depth = False
    if depth is None and max_boxes is not None:
        limit = view.deepest
        while view.box_count > max_boxes and limit > 0:
            limit -= 1
            view = _View(root, limit, fold)
            auto_depth = True
    graph = nx.DiGraph(
        model_class=trace.meta.model_class,
        step=step % steps,
        steps=steps,
        calls=sum(1 for _ in step_root.walk()),
        strategy=trace.meta.strategy,
        depth=view.depth,
        auto_depth=auto_depth,
        max_boxes=max_boxes,
        focus=root.id if focus is not None else None,
        folded=not unfold,
    )
    view.fill(graph, step_root, trace.fallbacks)
    return graph


def boxes(graph: nx.DiGraph) -> list[Hashable]:
    """The nodes drawn as boxes (everything but clusters)."""
    return [node for node, cluster in graph.nodes(data="cluster") if not cluster]


def _check_options(depth: object, max_boxes: object, unfold: object) -> None:
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise InvalidOptionError(f"depth must be a whole number of levels, 0 or more, or None; got {depth!r}.")
    if max_boxes is not None and (not isinstance(max_boxes, int) or isinstance(max_boxes, bool) or max_boxes < 1):
        raise InvalidOptionError(f"max_boxes must be a positive whole number or None (no budget); got {max_boxes!r}.")
    if not isinstance(unfold, bool):
        raise InvalidOptionError(f"unfold must be True or False, got {unfold!r}.")


def _find(step: CallNode, focus: str) -> CallNode:
    """The call ``focus`` names: ``path`` or ``path@N``, the path with or without the model class in front."""
    try:
        return locate(step, focus)
    except CallNotFoundError as exc:
        raise InvalidOptionError(f"focus {focus!r}: {exc.detail}") from None


class _Folder:
    """Decides which consecutive sibling calls fold into one drawn block (signatures cached across depth limits)."""

    def __init__(self, fallbacks: Mapping[str, str], *, enabled: bool) -> None:
        self.fallbacks = fallbacks
        self.enabled = enabled
        self._signatures: dict[int, tuple[object, ...]] = {}

    def runs(self, children: tuple[CallNode, ...]) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` of each run of identical repeated blocks among ``children`` (runs of one included)."""
        start = 0
        for i in range(1, len(children) + 1):
            if i < len(children) and self.enabled and self._same_block(children[i - 1], children[i]):
                continue
            yield start, i
            start = i

    def _same_block(self, before: CallNode, after: CallNode) -> bool:
        return _follows(before, after) and self._block_signature(before) == self._block_signature(after)

    def _block_signature(self, block: CallNode) -> tuple[object, ...]:
        key = id(block)
        if key not in self._signatures:
            self._signatures[key] = self._signature(block, block.path)
        return self._signatures[key]

    def _signature(self, node: CallNode, base: str) -> tuple[object, ...]:
        return (
            node.path[len(base) :],
            node.type_name,
            node.kind,
            node.strategy,
            _output_tensors(node),
            node.error is not None,
            _nonfinite(node) > 0,
            node.path in self.fallbacks,
            tuple(self._signature(child, base) for child in node.children),
        )


def _follows(before: CallNode, after: CallNode) -> bool:
    """``after`` is the next block after ``before``: the next number of a numbered list, or the next call of the same
    module."""
    if before.path == after.path:
        return after.index == before.index + 1
    a, b = numbered(before.path), numbered(after.path)
    return a is not None and b is not None and a[0] == b[0] and b[1] == a[1] + 1


def _nonfinite(node: CallNode) -> int:
    return sum(record.nan_count + record.inf_count for _, record in node.output_tensors())


@dataclass(slots=True)
class _Drawn:
    """One drawn node: ``calls`` are the calls it stands for, the head (the first) and the ones folded into it."""

    calls: list[CallNode]
    last: CallNode
    repeat: int
    parent: str | None
    cluster: bool

    @property
    def head(self) -> CallNode:
        return self.calls[0]


class _View:
    """Which calls are drawn, how, and which drawn node stands for every call below the root."""

    def __init__(self, root: CallNode, depth: int | None, fold: _Folder) -> None:
        self.root = root
        self.depth = depth
        self.fold = fold
        self.drawn: dict[str, _Drawn] = {}
        self.drawn_of: dict[str, str] = {}
        self.deepest = 0
        self._add([root], root, 1, None, 0)

    @property
    def box_count(self) -> int:
        return sum(1 for drawn in self.drawn.values() if not drawn.cluster)

    def _add(self, calls: list[CallNode], last: CallNode, repeat: int, parent: str | None, level: int) -> None:
        head = calls[0]
        cluster = bool(head.children) and (self.depth is None or level < self.depth)
        self.drawn[head.id] = _Drawn(calls, last, repeat, parent, cluster)
        self.deepest = max(self.deepest, level)
        if not cluster:
            for call in calls:
                for inner in call.walk():
                    self.drawn_of[inner.id] = head.id
            return
        for call in calls:
            self.drawn_of[call.id] = head.id
        for start, stop in self.fold.runs(head.children):
            group = [call.children[i] for call in calls for i in range(start, stop)]
            self._add(group, head.children[stop - 1], stop - start, head.id, level + 1)

    def _is_drawn_ancestor(self, outer: str, inner: str) -> bool:
        parent = self.drawn[inner].parent if inner in self.drawn else None
        while parent is not None:
            if parent == outer:
                return True
            parent = self.drawn[parent].parent
        return False

    def fill(self, graph: nx.DiGraph, step: CallNode, fallbacks: Mapping[str, str]) -> None:
        """Add the drawn nodes, the context nodes of a focus, and the data flow between them to ``graph``."""
        for node_id, drawn in self.drawn.items():
            graph.add_node(node_id, **_attributes(drawn, fallbacks))
        outside = _Outside(step, self.root) if self.root is not step else None
        for flow in data_flow(step):
            tail, head = self.drawn_of.get(flow.producer), self.drawn_of.get(flow.consumer)
            if outside is not None and (tail is None) != (head is None):  # flow across the border of the focus
                if tail is None:
                    tail = outside.context(flow.producer, graph)
                else:
                    head = outside.context(flow.consumer, graph)
            if tail is None or head is None or tail == head:
                continue
            if self._is_drawn_ancestor(tail, head) or self._is_drawn_ancestor(head, tail):
                continue  # a cluster and its own contents: the nesting already says it
            if graph.has_edge(tail, head):
                graph.edges[tail, head]["inferred"] &= flow.inferred
            else:
                graph.add_edge(tail, head, inferred=flow.inferred)


def _attributes(drawn: _Drawn, fallbacks: Mapping[str, str]) -> dict[str, object]:
    """What a drawn node shows, taken from its head: the calls folded into it carry the same marks (see _Folder)."""
    head = drawn.head
    inside = [] if drawn.cluster else list(head.walk())[1:]
    return {
        "path": head.path,
        "name": _run_name(head, drawn.last),
        "type_name": head.type_name,
        "kind": head.kind,
        "strategy": head.strategy,
        "parent": drawn.parent,
        "cluster": drawn.cluster,
        "context": False,
        "repeat": drawn.repeat,
        "outputs": _output_tensors(head),
        "nan": sum(record.nan_count for _, record in head.output_tensors()),
        "inf": sum(record.inf_count for _, record in head.output_tensors()),
        "error": head.error,
        "fallback": fallbacks.get(head.path) if head.kind == "module" else None,
        "calls_inside": len(inside),
        "nonfinite_inside": sum(1 for call in inside if _nonfinite(call)),
        "fallbacks_inside": sum(1 for call in inside if call.kind == "module" and call.path in fallbacks),
    }


def _output_tensors(call: CallNode) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """``(key, shape, dtype)`` of every output tensor; ``key`` names the entry of a dict output (``logits``), else
    it is empty."""
    outputs = call.outputs
    if isinstance(outputs, Mapping):
        return tuple(
            (str(key), record.shape, record.dtype)
            for key, value in outputs.items()
            for _, record in iter_tensors(value)
        )
    return tuple(("", record.shape, record.dtype) for _, record in iter_tensors(outputs))


def _run_name(head: CallNode, last: CallNode) -> str:
    """``q_proj``; ``layers.0–15`` for a folded run; ``norm #2`` and ``norm #1–12`` for calls of a shared module."""
    if last is head:
        return head.name + (f" #{head.index + 1}" if head.index else "")
    if last.path == head.path:
        return f"{head.name} #{head.index + 1}–{last.index + 1}"
    return f"{head.name}–{last.path.rsplit('.', 1)[1]}"


class _Outside:
    """The calls outside a focused subtree, each represented by its outermost ancestor that does not contain it."""

    def __init__(self, step: CallNode, focus: CallNode) -> None:
        self.parent: dict[str, CallNode] = {}
        for node in step.walk():
            for child in node.children:
                self.parent[child.id] = node
        self.by_id = {node.id: node for node in step.walk()}
        self.enclosing = set()
        node_id: str | None = focus.id
        while node_id is not None:
            self.enclosing.add(node_id)
            above = self.parent.get(node_id)
            node_id = above.id if above is not None else None

    def context(self, call_id: str, graph: nx.DiGraph) -> str | None:
        """The context node standing for ``call_id`` (added to ``graph`` on first use); None for calls that enclose
        the focus."""
        if call_id in self.enclosing:
            return None
        node = self.by_id[call_id]
        while (above := self.parent.get(node.id)) is not None and above.id not in self.enclosing:
            node = above
        if node.id not in graph:
            graph.add_node(
                node.id,
                path=node.path,
                name=node.path.split(".", 1)[-1],
                type_name=node.type_name,
                kind=node.kind,
                parent=None,
                cluster=False,
                context=True,
            )
        return node.id
