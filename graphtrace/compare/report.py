"""The result of comparing two traces: matched calls in the order they returned, unmatched calls, the first
divergence, and a JSON form of it all.

The first divergence is the culprit rule of porting work: the earliest call, in the order calls *returned*, whose
output diverges while its inputs still agree. Calls return before the calls that contain them, so the innermost
module at fault is named rather than the layer around it; later calls diverge because their inputs already do.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from graphtrace.compare.measure import STAT_NAMES, TensorDiff, Tolerance
from graphtrace.compare.pairs import CallDiff
from graphtrace.model import CallNode, Trace

__all__ = ["REPORT_FORMAT", "Comparison", "Unmatched", "first_divergence"]

REPORT_FORMAT = "graphtrace-diff"
REPORT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A call of one trace with no counterpart in the other."""

    step: int
    call: CallNode


def first_divergence(calls: tuple[CallDiff, ...]) -> CallDiff | None:
    """The culprit (see the module docstring). When every diverging call already had diverging inputs (the traces
    were given different inputs), the first diverging call; when only inputs diverge, the first such call."""
    diverged = [call for call in calls if call.status == "diverged"]
    for call in diverged:
        if call.inputs_agree:
            return call
    if diverged:
        return diverged[0]
    return next((call for call in calls if not call.inputs_agree), None)


@dataclass(frozen=True)
class Comparison:
    """Two traces compared: ``a`` is the reference, ``b`` the candidate (a port, a changed model)."""

    a: Trace
    b: Trace
    a_label: str
    b_label: str
    tolerance: Tolerance
    align: str
    rules: tuple[str, ...]
    calls: tuple[CallDiff, ...]
    only_in_a: tuple[Unmatched, ...]
    only_in_b: tuple[Unmatched, ...]
    unused_rules: tuple[str, ...] = ()
    strict: bool = False

    @property
    def first_divergence(self) -> CallDiff | None:
        return first_divergence(self.calls)

    @property
    def diverged(self) -> tuple[CallDiff, ...]:
        """The matched calls whose outputs or inputs diverge."""
        return tuple(call for call in self.calls if call.status == "diverged" or not call.inputs_agree)

    @property
    def equal(self) -> bool:
        """True when every matched call agrees within tolerance (and, when ``strict``, every call matched)."""
        if self.strict and (self.only_in_a or self.only_in_b):
            return False
        return not self.diverged

    def matched_by(self) -> dict[str, int]:
        """How many calls were matched each way: ``{"path": 40, "rule": 0, "structure": 3}``."""
        counts = Counter(call.how for call in self.calls)
        return {how: counts.get(how, 0) for how in ("path", "rule", "structure")}

    def table(self, *, color: bool = False, show_all: bool = False) -> str:
        """The report as text for a terminal (see :mod:`graphtrace.compare.text`)."""
        from graphtrace.compare.text import render_table

        return render_table(self, color=color, show_all=show_all)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        """Jupyter's view: the verdict, the first divergence and the diverging calls (imported lazily from
        :mod:`graphtrace.render.html`, which also makes the full page: ``graphtrace.to_html(comparison)``)."""
        from graphtrace.render.html import comparison_summary_html

        return comparison_summary_html(self)

    def to_json(self) -> dict[str, Any]:
        """The whole report as a JSON-ready dict (non-finite numbers as ``"NaN"``, ``"Infinity"``)."""
        first = self.first_divergence
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "a": _trace_json(self.a, self.a_label),
            "b": _trace_json(self.b, self.b_label),
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "align": self.align,
            "rules": list(self.rules),
            "unused_rules": list(self.unused_rules),
            "strict": self.strict,
            "equal": self.equal,
            "first_divergence": None if first is None else _pair_json(first),
            "matched": self.matched_by(),
            "calls": [_call_json(call) for call in self.calls],
            "only_in_a": [_unmatched_json(item) for item in self.only_in_a],
            "only_in_b": [_unmatched_json(item) for item in self.only_in_b],
        }


def _number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _trace_json(trace: Trace, label: str) -> dict[str, Any]:
    return {
        "trace": label,
        "model_class": trace.meta.model_class,
        "steps": len(trace.steps),
        "calls": sum(1 for _ in trace.walk()),
    }


def _tensor_json(diff: TensorDiff) -> dict[str, Any]:
    out = {field.name: getattr(diff, field.name) for field in dataclasses.fields(diff)}
    out["shape_a"], out["shape_b"] = list(diff.shape_a), list(diff.shape_b)
    for key in ("max_abs", "max_rel", "cosine"):
        out[key] = _number(out[key])
    if diff.stat_deltas is not None:
        out["stat_deltas"] = {name: _number(x) for name, x in zip(STAT_NAMES, diff.stat_deltas)}
    out["numel"] = diff.numel
    return out


def _pair_json(call: CallDiff) -> dict[str, Any]:
    return {
        "step": call.step,
        "a": call.a.id,
        "b": call.b.id,
        "how": call.how,
        "inputs_agree": call.inputs_agree,
        "reason": call.reason,
    }


def _call_json(call: CallDiff) -> dict[str, Any]:
    return {
        **_pair_json(call),
        "a_type": call.a.type_name,
        "b_type": call.b.type_name,
        "status": call.status,
        "error": call.error,
        "inputs": [_tensor_json(diff) for diff in call.inputs],
        "outputs": [_tensor_json(diff) for diff in call.outputs],
        "only_in_a": list(call.only_in_a),
        "only_in_b": list(call.only_in_b),
    }


def _unmatched_json(item: Unmatched) -> dict[str, Any]:
    return {"step": item.step, "call": item.call.id, "type": item.call.type_name}
