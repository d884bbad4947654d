"""Saving a trace with its call graph: the files of :mod:`graphtrace.io`, then the picture of
:mod:`graphtrace.render` (two siblings that never import each other, joined here).

The call graph is a picture beside the trace, never a reason to lose it. Graphviz's ``dot`` (a process of tens of
milliseconds, most of it its start-up) draws it while the trace files are written, on another core: ``dot`` is
started first, then the trace files are written, then the graph's DOT source and picture are put in place once
``dot`` is done. What happened to the drawing is said only after the trace files are written: when Graphviz is
missing or fails, a :class:`~graphtrace.errors.GraphvizWarning` says so and how to get the picture, and everything
else is saved; an explicit ``graphtrace render`` raises instead. When a trace file cannot be written, ``dot`` is
stopped and neither the DOT source nor the picture is written.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from graphtrace.errors import GraphvizFailedError, GraphvizNotFoundError, GraphvizWarning
from graphtrace.io.trace_files import prepare_directory, save_trace
from graphtrace.model import Trace
from graphtrace.render import GRAPH_SUFFIX, Drawing, start_call_graph

__all__ = ["save", "save_call_graph"]


def save(trace: Trace, directory: str | os.PathLike[str], *, graph: bool = True) -> list[str]:
    """Write ``trace`` into ``directory`` (see :func:`graphtrace.io.save_trace`) and, with ``graph``, its call graph
    beside it as ``{Class}_call_graph.svg`` and ``.dot``; returns the paths written."""
    if not (graph and trace.steps):
        return save_trace(trace, directory)
    prepare_directory(directory)
    try:
        drawing = _start(trace, directory)
    except Exception:
        save_trace(trace, directory)  # the picture never costs the trace (an interrupt stops both)
        raise
    try:
        written = save_trace(trace, directory)
    except BaseException:
        drawing.abandon()
        raise
    return written + [str(path) for path in _finish(drawing, directory)]


def save_call_graph(trace: Trace, directory: str | os.PathLike[str]) -> list[Path]:
    """Draw the default call graph of ``trace``'s last step into ``directory``; warns instead of raising when
    Graphviz cannot draw it (the DOT source is written all the same)."""
    return _finish(_start(trace, directory), directory)


def _start(trace: Trace, directory: str | os.PathLike[str]) -> Drawing:
    """Start drawing the graph that the trace files hold."""
    target = Path(directory) / f"{trace.meta.model_class}{GRAPH_SUFFIX}.svg"
    saved = trace.with_pruned_layers() if trace.meta.prune_layers else trace  # draw what the trace files hold
    return start_call_graph(saved, target)


def _finish(drawing: Drawing, directory: str | os.PathLike[str]) -> list[Path]:
    """The files drawn, once ``dot`` is done; a warning instead of an error when it could not draw."""
    try:
        return drawing.finish()
    except (GraphvizNotFoundError, GraphvizFailedError) as exc:
        warnings.warn(f"{exc} The trace itself is saved in {directory}.", GraphvizWarning, stacklevel=3)
        return [drawing.source]
