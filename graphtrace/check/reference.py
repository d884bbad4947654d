"""The original's saved trace, checked to keep the full values the check gives the port's modules (torch-free)."""

from __future__ import annotations

import os

from graphtrace.conveniences import load
from graphtrace.errors import InvalidOptionError
from graphtrace.model import Trace

__all__ = ["reference_trace"]


def _has_values(trace: Trace) -> bool:
    return bool(trace.steps) and any(
        record.file for node in trace.steps[0].walk() for _, record in (*node.input_tensors(), *node.output_tensors())
    )


def reference_trace(reference: object) -> tuple[Trace, str]:
    """The original's saved trace (a directory or a :class:`~graphtrace.model.Trace`) with full values, and how the
    report names it; a trace that keeps none is an error that says how to capture one."""
    if isinstance(reference, (str, os.PathLike)):
        trace, label = load(reference), str(reference)
    elif isinstance(reference, Trace):
        trace, label = reference, reference.directory or reference.meta.model_class
    else:
        raise InvalidOptionError(
            "reference must be the original's saved trace (a directory captured with values='bundle' or "
            "'safetensors', on the command line --values bundle), a Trace, or an (original_model, original_inputs) "
            f"pair; got {type(reference).__name__}."
        )
    if trace.directory is None or not _has_values(trace):
        raise InvalidOptionError(
            f"the original's trace {label} keeps no full values (captured with values={trace.meta.values!r}); the "
            "check gives each module of the port the original's own inputs, so capture the original with "
            "values='bundle' or 'safetensors' (on the command line: graphtrace capture ... --values bundle), or "
            "pass reference=(original_model, original_inputs)."
        )
    return trace, label
