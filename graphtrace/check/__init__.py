"""Every module of a live port judged on the original's own inputs (``graphtrace.check``; docs/check.md).

A diff of two traces follows a departure downstream: after the first bug every later module's inputs already differ,
so a second bug stays hidden until the first is fixed. The check runs each module of the port alone, on the inputs
the original's module was given, and compares its output with the original's: every module whose own code departs
is named, however many there are.

This package's top is torch-free, so that ``import graphtrace`` stays cheap and the name ``graphtrace.check`` is the
function: the work is imported when a check runs. Modules: :mod:`~graphtrace.check.views` (how a value of the
original is laid out in the port: the seam with the diff's correspondence), :mod:`~graphtrace.check.live` (the
port's calls as they happened), :mod:`~graphtrace.check.alone` (one module run alone, safely),
:mod:`~graphtrace.check.memo` (calls answered from runs already made), :mod:`~graphtrace.check.values` (the
original's values), :mod:`~graphtrace.check.reference` (the original's saved trace), :mod:`~graphtrace.check.judge`
(the local verdicts), :mod:`~graphtrace.check.run` (end to end), :mod:`~graphtrace.check.report` and
:mod:`~graphtrace.check.text` (the result, its JSON and its table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from graphtrace.check.reference import reference_trace
from graphtrace.check.report import CheckReport, ModuleCheck, Verdict
from graphtrace.compare.rules import parse_rules
from graphtrace.errors import InvalidOptionError

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from graphtrace.check.run import Reference

__all__ = ["CheckReport", "ModuleCheck", "Verdict", "check", "checked_options", "reference_trace"]


def _tolerance(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidOptionError(
            f"{name} must be a finite number >= 0 (or None for the dtype's default), got {value!r}."
        )
    return float(value)


def check(
    port: nn.Module,
    inputs: Any,
    reference: Reference,
    *,
    rules: Sequence[str] = (),
    rtol: float | None = None,
    atol: float | None = None,
) -> CheckReport:
    """Run every module of ``port`` alone on the inputs the original's module was given, and name each one whose
    own code departs from the original.

    Args:
        port: the port, a live ``torch.nn.Module``; it is left exactly as it was (forwards, parameters, buffers,
            attributes, random generators).
        inputs: what its forward is given, as :func:`graphtrace.capture` takes it (a dict of keyword arguments, a
            tuple of positional ones, a tensor): the same input as the original's trace was captured on.
        reference: the original, as a saved trace with full values (a directory captured with
            ``values="bundle"`` or ``"safetensors"``, or such a :class:`~graphtrace.model.Trace`), or as an
            ``(original_model, original_inputs)`` pair, then captured into a temporary directory.
        rules: rename rules ``"LEFT=RIGHT"`` from the original's module names to the port's, as the diff takes them.
        rtol, atol: tolerance, ``|port - original| <= atol + rtol * |original|``; None takes
            ``torch.testing.assert_close``'s default for each tensor's dtype, as the diff does.

    Returns the :class:`CheckReport`: ``.departures`` (the modules that depart on their own, innermost first, in
    execution order), ``.equal``, ``.table()``, ``.to_json()``.
    """
    rules, rtol, atol = checked_options(rules, rtol, atol)  # a malformed rule is an error before the port runs
    from graphtrace.check.run import run_check

    return run_check(port, inputs, reference, rules=rules, rtol=rtol, atol=atol)


def checked_options(
    rules: Sequence[str] | str, rtol: float | None, atol: float | None
) -> tuple[tuple[str, ...], float | None, float | None]:
    """The rename rules and tolerances of :func:`check`, validated (a clear error naming the bad one): the command
    line validates them before it builds the port, which may take long."""
    if isinstance(rules, str):
        rules = [rules]
    parse_rules(rules)
    return tuple(rules), _tolerance("rtol", rtol), _tolerance("atol", atol)
