"""Comparing two traces: which calls correspond, how far apart their tensors are, and where they first diverge.

``compare(a, b)`` takes two :class:`~graphtrace.model.Trace` objects; A is the reference (the original
implementation), B the candidate (the port, the changed model). Full values are read through ``open_values``, which
the caller hands in (``graphtrace.compare``, the package's top-level function, loads saved traces from their
directories and opens their values through :mod:`graphtrace.io`; this package reads no file itself).

Modules: :mod:`~graphtrace.compare.rules` (rename rules), :mod:`~graphtrace.compare.align` (matching calls),
:mod:`~graphtrace.compare.measure` (tensor differences), :mod:`~graphtrace.compare.pairs` (one matched pair),
:mod:`~graphtrace.compare.report` (the result), :mod:`~graphtrace.compare.text` (the terminal table),
:mod:`~graphtrace.compare.nonfinite` (the first NaN/Inf).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypedDict, get_args

from graphtrace.compare.align import AlignMode, align_calls, relative_path, returned_order
from graphtrace.compare.fused import FusedMatch
from graphtrace.compare.measure import TensorDiff, Tolerance
from graphtrace.compare.nonfinite import first_nonfinite
from graphtrace.compare.ops import OpLocus, locate_op
from graphtrace.compare.pairs import (
    CallDiff,
    OpenValues,
    StoredValues,
    ValueFiles,
    diff_call,
    diff_fused,
    given,
    taught_layouts,
    unread_padding,
)
from graphtrace.compare.report import Comparison, Unmatched
from graphtrace.compare.rules import RenameRule, check_rules, parse_rules
from graphtrace.errors import InvalidOptionError
from graphtrace.model import CallNode, Trace

__all__ = [
    "AlignMode",
    "CallDiff",
    "CompareOptions",
    "Comparison",
    "RenameRule",
    "TensorDiff",
    "Tolerance",
    "Unmatched",
    "compare",
    "first_nonfinite",
]


def _trace(trace: object, which: str, label: str | None) -> tuple[Trace, str]:
    if not isinstance(trace, Trace):
        raise InvalidOptionError(
            f"trace {which} must be a Trace, got {type(trace).__name__}; graphtrace.compare also takes the path of "
            "a saved trace."
        )
    return trace, label or trace.directory or trace.meta.model_class


def _opener(open_values: OpenValues | None, trace: Trace, step: int) -> Callable[[], ValueFiles | None]:
    if open_values is None:
        return lambda: None
    return lambda: open_values(trace, step)


def _check_tolerance(name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidOptionError(
            f"{name} must be a finite number >= 0 (or None for the dtype's default), got {value!r}."
        )


def _step_pairs(a: Trace, b: Trace, step: int | None) -> list[tuple[int | None, int | None]]:
    if step is None:
        return [
            (i if i < len(a.steps) else None, i if i < len(b.steps) else None)
            for i in range(max(len(a.steps), len(b.steps)))
        ]
    for trace, which in ((a, "A"), (b, "B")):
        if not -len(trace.steps) <= step < len(trace.steps):
            raise InvalidOptionError(
                f"step {step} does not exist in trace {which}, which has {len(trace.steps)} forward call(s); "
                f"choose a step from 0 to {len(trace.steps) - 1}."
            )
    return [(step % len(a.steps), step % len(b.steps))]


class CompareOptions(TypedDict, total=False):
    """The options of :func:`compare`, as ``graphtrace.compare`` passes them on."""

    rtol: float | None
    atol: float | None
    rules: Sequence[str]
    align: AlignMode
    step: int | None
    strict: bool


def _caller(root_a: CallNode, calls: Sequence[CallDiff]) -> Callable[[CallNode], CallDiff | None]:
    """The pair of the nearest matched caller of a call of A."""
    diffs = {id(call.a): call for call in calls}
    parents = {id(child): node for node in root_a.walk() for child in node.children}

    def caller(call: CallNode) -> CallDiff | None:
        node = parents.get(id(call))
        while node is not None and id(node) not in diffs:
            node = parents.get(id(node))
        return diffs.get(id(node)) if node is not None else None

    return caller


def _fused_caller(caller: Callable[[CallNode], CallDiff | None]) -> Callable[[FusedMatch], CallDiff | None]:
    """The pair of the nearest matched caller of a fused projection (of its side in A)."""
    return lambda fused: caller(fused.fused if fused.fused_in_a else fused.parts[0])


def compare(
    a: Trace,
    b: Trace,
    *,
    open_values: OpenValues | None = None,
    labels: tuple[str | None, str | None] = (None, None),
    rtol: float | None = None,
    atol: float | None = None,
    rules: Sequence[str] = (),
    align: AlignMode = "auto",
    step: int | None = None,
    strict: bool = False,
) -> Comparison:
    """Compare trace ``b`` against the reference ``a``, call by call.

    Args:
        a, b: the traces (``graphtrace.load`` reads saved ones; ``graphtrace.compare`` takes paths too).
        open_values: opens the stored values of a trace's step (see :data:`~graphtrace.compare.pairs.OpenValues`);
            None compares statistics only.
        labels: how the report names A and B (default: each trace's directory, or its model class).
        rtol, atol: tolerance, ``|b - a| <= atol + rtol * |a|``; None takes ``torch.testing.assert_close``'s
            default for each tensor's dtype.
        rules: rename rules ``"LEFT=RIGHT"`` mapping A's module names to B's, e.g.
            ``"transformer.h.{i}=model.layers.{i}"`` (see :mod:`graphtrace.compare.rules`).
        align: ``"auto"`` (paths, rules, then structure for the rest), ``"path"`` (paths and rules only) or
            ``"structure"`` (execution order, module kinds and shapes only).
        step: compare only this top-level call of each trace (default: every step, pairwise).
        strict: calls without a counterpart make the traces unequal too.

    Returns the :class:`Comparison`; ``.equal``, ``.first_divergence``, ``.table()`` and ``.to_json()`` report it.
    """
    _check_tolerance("rtol", rtol)
    _check_tolerance("atol", atol)
    if align not in get_args(AlignMode):
        raise InvalidOptionError(f"align={align!r} is not one of {', '.join(map(repr, get_args(AlignMode)))}.")
    if isinstance(rules, str):
        rules = [rules]
    compiled = parse_rules(rules)
    trace_a, label_a = _trace(a, "A", labels[0])
    trace_b, label_b = _trace(b, "B", labels[1])
    for root in trace_a.steps:
        check_rules(compiled, (relative_path(node, root) for node in root.walk() if node.kind == "module"))
    tolerance = Tolerance(rtol, atol)
    calls: list[CallDiff] = []
    only_a: list[Unmatched] = []
    only_b: list[Unmatched] = []
    used: set[RenameRule] = set()
    stores: dict[int, StoredValues] = {}
    for step_a, step_b in _step_pairs(trace_a, trace_b, step):
        if step_a is None or step_b is None:
            lone, number, into = (trace_a, step_a, only_a) if step_b is None else (trace_b, step_b, only_b)
            assert number is not None
            into += [Unmatched(number, node) for node in lone.steps[number].walk()]
            continue
        root_a, root_b = trace_a.steps[step_a], trace_b.steps[step_b]
        alignment = align_calls(root_a, root_b, rules=compiled, mode=align, tolerance=tolerance, used_rules=used)
        stored = stores[step_a] = StoredValues(
            _opener(open_values, trace_a, step_a), _opener(open_values, trace_b, step_b)
        )
        order = {id(node): k for k, node in enumerate(returned_order(root_a))}
        matches = sorted(alignment.matches, key=lambda match: order[id(match.a)])
        reads = given(root_a), given(root_b)
        step_calls = [diff_call(step_a, match, tolerance, stored, reads) for match in matches]
        step_calls = taught_layouts(step_calls, _caller(root_a, step_calls), tolerance, stored, reads)
        step_calls = unread_padding(step_calls, _caller(root_a, step_calls))
        if alignment.fused:
            caller = _fused_caller(_caller(root_a, step_calls))
            step_calls += diff_fused(step_a, alignment.fused, caller, tolerance, stored)
            step_calls.sort(key=lambda call: order[id(call.a)])
        calls += step_calls
        only_a += [Unmatched(step_a, node) for node in alignment.only_a]
        only_b += [Unmatched(step_b, node) for node in alignment.only_b]
    tolerance_ = tolerance

    def op_locator(call: CallDiff) -> OpLocus | None:
        stored = stores.get(call.step)
        if stored is None:
            return None
        return locate_op(call.a, call.b, tolerance_, stored.both)

    return Comparison(
        op_locator=op_locator,
        a=trace_a,
        b=trace_b,
        a_label=label_a,
        b_label=label_b,
        tolerance=tolerance,
        align=align,
        rules=tuple(rule.text for rule in compiled),
        calls=tuple(calls),
        only_in_a=tuple(only_a),
        only_in_b=tuple(only_b),
        unused_rules=tuple(rule.text for rule in compiled if rule not in used),
        strict=strict,
    )
