"""Where NaN and Inf first appear in a trace.

The first call, in the order calls returned, whose output holds NaN or Inf while every one of its input tensors is
finite: the module that made them (later calls merely pass them on). Counts come from capture
(``TensorRecord.nan_count`` / ``inf_count``); in a trace written by transformers they are lower bounds inferred from
the statistics, which still tell finite from non-finite.
"""

from __future__ import annotations

from collections.abc import Iterator

from graphtrace.compare.align import returned_order
from graphtrace.model import CallNode, Trace

__all__ = ["describe_nonfinite", "first_nonfinite", "nonfinite_outputs"]


def _outputs_nonfinite(node: CallNode) -> bool:
    return any(not record.is_finite for _, record in node.output_tensors())


def _inputs_finite(node: CallNode) -> bool:
    return all(record.is_finite for _, record in node.input_tensors())


def nonfinite_outputs(trace: Trace) -> Iterator[tuple[int, CallNode]]:
    """``(step, call)`` for every call whose output holds NaN or Inf, in the order calls returned."""
    for number, step in enumerate(trace.steps):
        for node in returned_order(step):
            if _outputs_nonfinite(node):
                yield number, node


def first_nonfinite(trace: Trace) -> CallNode | None:
    """The first call whose output holds NaN or Inf while its inputs are finite; None when there is none."""
    return next((node for _, node in nonfinite_outputs(trace) if _inputs_finite(node)), None)


def _counts(node: CallNode) -> str:
    parts = []
    for name, record in node.output_tensors():
        if not record.is_finite:
            parts.append(f"outputs{name} {list(record.shape)}: nan {record.nan_count}, inf {record.inf_count}")
    return "; ".join(parts)


def describe_nonfinite(trace: Trace) -> str:
    """Where NaN/Inf first appear, in words (``graphtrace show --nonfinite``)."""
    found = list(nonfinite_outputs(trace))
    steps = len(trace.steps) > 1
    lines = []
    culprit = next(((step, node) for step, node in found if _inputs_finite(node)), None)
    if culprit is not None:
        step, node = culprit
        kind = f" ({node.type_name})" if node.type_name else ""
        where = f" in step {step}" if steps else ""
        lines.append(f"first non-finite output: {node.id}{kind}{where}; its inputs are finite")
        lines.append(f"  {_counts(node)}")
        lines.append(f"{len(found)} call(s) in all return NaN or Inf")
    elif found:
        step, node = found[0]
        lines.append(
            f"every call that returns NaN or Inf already received them; the first is {node.id}: "
            "the model's own inputs hold NaN or Inf"
        )
    else:
        lines.append("no call returns NaN or Inf")
    if trace.meta.strategy == "unknown":
        lines.append(
            "(a trace written by transformers holds no counts: NaN/Inf are inferred from the statistics of "
            "float16, bfloat16 and float32 tensors, and counts are lower bounds)"
        )
    return "\n".join(lines)
