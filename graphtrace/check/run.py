"""The check from end to end: the original's values found (or captured), the port run once under capture with its
calls kept, the two aligned by the diff, every aligned module of the port judged alone, the verdicts settled.

The port is left as it was: its forwards are put back (capture's patches and the check's own); what its own forward
changes (attributes its code sets, buffers it writes into) is put back after it, and so are the random generators'
states; no module run alone may write into its tensors or draw random numbers, and attributes it sets are put back.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from graphtrace.api import capture, check_model
from graphtrace.check.alone import Guard, state_kept
from graphtrace.check.judge import Judge, settle
from graphtrace.check.live import LiveCalls
from graphtrace.check.reference import reference_trace
from graphtrace.check.report import CheckReport
from graphtrace.check.values import OriginalValues
from graphtrace.compare import CallDiff, Comparison, Tolerance
from graphtrace.compare import compare as compare_traces
from graphtrace.compare.align import returned_order
from graphtrace.conveniences import open_values
from graphtrace.engine.eager import module_paths
from graphtrace.model import Trace

__all__ = ["run_check"]

Reference = Trace | str | os.PathLike[str] | tuple[nn.Module, Any]


@contextmanager
def _generators_kept(model: nn.Module) -> Iterator[None]:
    """The random generators' states (CPU, and each CUDA device the model lives on) put back on exit: the port's
    own forward draws from them in training mode."""
    devices = sorted({t.device.index or 0 for t in (*model.parameters(), *model.buffers()) if t.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        yield


def _reference(reference: Any, stack: ExitStack) -> tuple[Trace, str]:
    """The original's trace with full values, and how the report names it; a live original is captured into a
    temporary directory that lasts as long as ``stack``."""
    if isinstance(reference, tuple) and len(reference) == 2 and isinstance(reference[0], nn.Module):
        model, inputs = reference
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="graphtrace-check-"))
        with _generators_kept(model), state_kept(model):
            trace = capture(model, inputs, path=Path(folder) / "original", values="bundle", strategy="eager")
        return trace, f"{type(model).__name__} (captured for the check)"
    return reference_trace(reference)


def _grouped(comparison: Comparison) -> dict[int, list[CallDiff]]:
    """The pairs of the first step by the port's call (several for a fused projection), module calls only."""
    pairs: dict[int, list[CallDiff]] = {}
    for call in comparison.calls:
        if call.step == 0 and call.b.kind == "module":
            pairs.setdefault(id(call.b), []).append(call)
    return pairs


def run_check(
    port: nn.Module, inputs: Any, reference: Reference, *, rules: Sequence[str], rtol: float | None, atol: float | None
) -> CheckReport:
    """See :func:`graphtrace.check.check`."""
    check_model(port)
    with ExitStack() as stack:
        original, label = _reference(reference, stack)
        temporary = isinstance(reference, tuple)
        with _generators_kept(port), state_kept(port), LiveCalls(port) as live:
            port_trace = capture(port, inputs, values="none", strategy="eager")
        comparison = compare_traces(
            original, port_trace, labels=(label, None), rules=rules, rtol=rtol, atol=atol, step=0
        )
        files = open_values(original, 0)
        assert files is not None  # _reference checked that the trace is saved
        judge = Judge(
            calls=live.calls,
            values=OriginalValues(original.steps[0], files),
            tolerance=Tolerance(rtol, atol),
            guard=Guard(port),
            root=port_trace.steps[0],
            paths={id(module): path for path, module in module_paths(port)},
        )
        pairs = _grouped(comparison)
        order = [node for node in returned_order(port_trace.steps[0]) if node.kind == "module"]
        unmatched = [node for node in order if id(node) not in pairs]
        with _generators_kept(port):
            checks = [judge.module(node, pairs[id(node)]) for node in order if id(node) in pairs]
        if temporary:  # its directory is gone with the check: the report names none
            original = dataclasses.replace(original, directory=None)
        return CheckReport(
            original=original,
            port=port_trace,
            original_label=label,
            port_label=type(port).__name__,
            tolerance=Tolerance(rtol, atol),
            rules=comparison.rules,
            unused_rules=comparison.unused_rules,
            modules=tuple(settle(checks, port_trace.steps[0], unmatched)),
            unmatched=tuple(unmatched),
        )
