"""The call graph of a trace: calls as boxes, nesting as clusters, data flow as edges, drawn with Graphviz.

``call_graph(trace)`` builds the networkx DiGraph that is drawn, ``to_dot(graph)`` its DOT source, and
``write_call_graph(trace, "graph.svg")`` both, plus the picture through Graphviz's ``dot``. ``to_html(trace)`` /
``write_html(trace, "trace.html")`` make the interactive explorer page (of a trace, or of a comparison). Works on
saved traces, without torch and without the model.
"""

from __future__ import annotations

import os
from pathlib import Path

from graphtrace.model import Trace
from graphtrace.render.dot import FORMATS, INSTALL_HINT, Drawing, start_graph, to_dot, write_graph
from graphtrace.render.graph import DEFAULT_MAX_BOXES, boxes, call_graph
from graphtrace.render.html import to_html, write_html
from graphtrace.render.step_flow import Flow, data_flow

__all__ = [
    "DEFAULT_MAX_BOXES",
    "FORMATS",
    "Drawing",
    "GRAPH_SUFFIX",
    "INSTALL_HINT",
    "Flow",
    "boxes",
    "call_graph",
    "data_flow",
    "start_call_graph",
    "to_dot",
    "to_html",
    "write_call_graph",
    "write_graph",
    "write_html",
]

GRAPH_SUFFIX = "_call_graph"
"""A trace directory's call graph is ``{Class}_call_graph.svg``, with its source ``{Class}_call_graph.dot``."""


def write_call_graph(
    trace: Trace,
    path: str | os.PathLike[str],
    *,
    step: int = -1,
    depth: int | None = None,
    focus: str | None = None,
    unfold: bool = False,
    max_boxes: int | None = DEFAULT_MAX_BOXES,
) -> list[Path]:
    """Draw ``trace``'s call graph into ``path`` (``.svg``, ``.png``, ``.pdf``; the ``.dot`` source is written beside
    it). Options as :func:`call_graph`. Returns the files written."""
    graph = call_graph(trace, step=step, depth=depth, focus=focus, unfold=unfold, max_boxes=max_boxes)
    return write_graph(graph, path)


def start_call_graph(trace: Trace, path: str | os.PathLike[str]) -> Drawing:
    """Start drawing ``trace``'s default call graph into ``path``: the DOT source is written, Graphviz runs while the
    caller goes on, and :meth:`Drawing.finish` puts the picture in place."""
    return start_graph(call_graph(trace), path)
