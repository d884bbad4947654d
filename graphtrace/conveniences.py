"""What users do with a trace, offered at the top of the package: each function lives in the layer that owns it
(io reads and writes, render draws, compare compares) and is joined here, where importing every layer is allowed.

The same functions serve the data model's convenience methods (``trace.save(...)``, ``Trace.load(...)``,
``trace.first_nonfinite()``, ``trace.to_graph()``, ``_repr_html_``): :func:`graphtrace.model.offer_services` hands
them down once, when the package is imported, so that the data model imports nothing above it. Every layer is
imported on first use, keeping ``import graphtrace`` cheap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, TextIO, Unpack

import graphtrace.compare as compare_package
from graphtrace.errors import InvalidOptionError
from graphtrace.model import CallNode, Trace, offer_services

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from graphtrace.compare import CompareOptions, Comparison
    from graphtrace.compare.pairs import ValueFiles

__all__ = ["compare", "first_nonfinite", "load", "save"]

TraceLike = Trace | str | os.PathLike[str]


def save(trace: Trace, directory: str | os.PathLike[str], *, graph: bool = True) -> list[str]:
    """Write ``trace`` into ``directory`` (its JSON files and, with ``graph``, its call graph as
    ``{Class}_call_graph.svg`` and ``.dot``); returns the files written."""
    from graphtrace.saving import save as save_with_graph

    return save_with_graph(trace, directory, graph=graph)


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a saved trace: a directory or file written by graphtrace or by transformers' debugger."""
    from graphtrace.io.trace_files import load_trace

    return load_trace(path)


def first_nonfinite(trace: Trace) -> CallNode | None:
    """The first call, in the order calls returned, whose output holds NaN or Inf while its inputs are finite (see
    :mod:`graphtrace.compare.nonfinite`)."""
    from graphtrace.compare.nonfinite import first_nonfinite as find

    return find(trace)


def compare(a: TraceLike, b: TraceLike, **options: Unpack[CompareOptions]) -> Comparison:
    """Compare trace ``b`` against the reference ``a``, call by call: saved trace directories (or files) or Trace
    objects; full values are read from the traces' safetensors files when both hold them. The options are
    :func:`graphtrace.compare.compare`'s: ``rtol``, ``atol``, ``rules``, ``align``, ``step``, ``strict``."""
    return compare_package.compare(
        _loaded(a, "A"), _loaded(b, "B"), open_values=open_values, labels=(_label(a), _label(b)), **options
    )


def _loaded(trace: TraceLike, which: str) -> Trace:
    if isinstance(trace, Trace):
        return trace
    if not isinstance(trace, (str, os.PathLike)):
        raise InvalidOptionError(
            f"trace {which} must be a Trace or the path of a saved trace, got {type(trace).__name__}."
        )
    return load(trace)


def _label(trace: TraceLike) -> str | None:
    return None if isinstance(trace, Trace) else str(trace)


def open_values(trace: Trace, step: int) -> ValueFiles | None:
    """The stored values of ``trace``'s step ``step`` (None when the trace was never saved): torch is imported only
    here, when full values are compared."""
    if trace.directory is None:
        return None
    from graphtrace.io.tensors import TensorFiles
    from graphtrace.io.trace_files import stored_step_directory

    return TensorFiles(stored_step_directory(trace.directory, step, len(trace.steps)))


class _Services:
    """The data model's convenience methods, served by the layers above it."""

    save = staticmethod(save)
    load = staticmethod(load)
    first_nonfinite = staticmethod(first_nonfinite)

    @staticmethod
    def call_graph(trace: Trace, **options: Any) -> nx.DiGraph:
        from graphtrace.render import call_graph

        return call_graph(trace, **options)

    @staticmethod
    def show(trace: Trace, *, file: TextIO | None, **options: Any) -> None:
        from graphtrace.render.text_tree import print_trace

        print_trace(trace, file=file, **options)

    @staticmethod
    def html(value: Any) -> str:
        from graphtrace.render.html import comparison_summary_html, trace_summary_html

        return trace_summary_html(value) if isinstance(value, Trace) else comparison_summary_html(value)


offer_services(_Services())
