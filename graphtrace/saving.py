"""Saving a trace with its call graph: the files of :mod:`graphtrace.io`, then the picture of
:mod:`graphtrace.render` (two siblings that never import each other, joined here).

The call graph is a picture beside the trace, never a reason to lose it: the trace files are written first, then the
graph's DOT source, then the SVG. When Graphviz is missing or fails, a :class:`~graphtrace.errors.GraphvizWarning`
says so and how to get the picture, and everything else is saved; an explicit ``graphtrace render`` raises instead.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from graphtrace.errors import GraphvizFailedError, GraphvizNotFoundError, GraphvizWarning
from graphtrace.io.trace_files import save_trace
from graphtrace.model import Trace
from graphtrace.render import GRAPH_SUFFIX, write_call_graph

__all__ = ["save", "save_call_graph"]


def save(trace: Trace, directory: str | os.PathLike[str], *, graph: bool = True) -> list[str]:
    """Write ``trace`` into ``directory`` (see :func:`graphtrace.io.save_trace`) and, with ``graph``, its call graph
    beside it as ``{Class}_call_graph.svg`` and ``.dot``; returns the paths written."""
    written = save_trace(trace, directory)
    if graph and trace.steps:
        written += [str(path) for path in save_call_graph(trace, directory)]
    return written


def save_call_graph(trace: Trace, directory: str | os.PathLike[str]) -> list[Path]:
    """Draw the default call graph of ``trace``'s last step into ``directory``; warns instead of raising when
    Graphviz cannot draw it (the DOT source is written all the same)."""
    target = Path(directory) / f"{trace.meta.model_class}{GRAPH_SUFFIX}.svg"
    saved = trace.with_pruned_layers() if trace.meta.prune_layers else trace  # draw what the trace files hold
    try:
        return write_call_graph(saved, target)
    except (GraphvizNotFoundError, GraphvizFailedError) as exc:
        warnings.warn(f"{exc} The trace itself is saved in {directory}.", GraphvizWarning, stacklevel=3)
        return [target.with_suffix(".dot")]
