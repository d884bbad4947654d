"""graphtrace: record what happens inside a PyTorch model's forward pass, module by module.

Importing graphtrace is cheap: the data model is torch-free and everything that needs torch is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# `graphtrace.compare` and `graphtrace.check` are both a subpackage and a top-level function; importing the
# functions here, eagerly (their subpackages' tops are torch-free), makes each name mean the function whatever imports
# the subpackage's modules later. Importing graphtrace.conveniences also offers the data model its services.
from graphtrace.check import check
from graphtrace.conveniences import compare, first_nonfinite, load, save
from graphtrace.errors import GraphtraceError
from graphtrace.model import CallNode, TensorRecord, Trace
from graphtrace.version import __version__

__all__ = [
    "__version__",
    # capture
    "capture",
    "tracing",
    "model_addition_debugger_context",
    # the data model
    "Trace",
    "CallNode",
    "TensorRecord",
    "load",
    "save",
    # comparing traces, checking a port
    "compare",
    "first_nonfinite",
    "check",
    # drawing: graphtrace.render.call_graph / write_call_graph; the explorer page
    "render",
    "to_html",
    # errors
    "GraphtraceError",
]

_LAZY = {
    "capture": "graphtrace.api",
    "tracing": "graphtrace.api",
    "model_addition_debugger_context": "graphtrace.compat",
    "to_html": "graphtrace.render.html",
}

_SUBPACKAGES = frozenset({"render"})

if TYPE_CHECKING:  # pragma: no cover
    from graphtrace import render
    from graphtrace.api import capture, tracing
    from graphtrace.compat import model_addition_debugger_context
    from graphtrace.render.html import to_html


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:  # importing a subpackage binds it here as an attribute
        return importlib.import_module(f"graphtrace.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'graphtrace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
