"""The result of a check: every aligned module call of the port with its local verdict, the departures on their own,
what was skipped and why, and a JSON form of it all (torch-free: plain records, strings and numbers).

A module *departs on its own* when, run alone on the original's inputs, its output departs while every module
inside it that was judged agrees: the bug lies in its own code. A module whose departure a module inside it explains
(one that departs too) is reported, but not as a departure of its own.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from graphtrace.compare import CallDiff, Comparison, TensorDiff, Tolerance, Unmatched
from graphtrace.compare.align import MatchKind, relative_path
from graphtrace.model import CallNode, Trace, services

__all__ = ["REPORT_FORMAT", "REPORT_VERSION", "CheckReport", "ModuleCheck", "Verdict"]

REPORT_FORMAT = "graphtrace-check"
REPORT_VERSION = 1

Verdict = Literal["agrees", "departs", "skipped"]
"""A module's local verdict: its output agrees or departs when it is run alone on the original's inputs, or it was
not judged (``why`` says why)."""


@dataclass(frozen=True, slots=True)
class ModuleCheck:
    """One module call of the port (``port``), paired with ``original``, run alone on the original's inputs.

    ``outputs`` are its outputs measured against the original's (in the original's layout). ``given`` names the
    arguments that were given the original's value, ``kept`` those left the port's own (no counterpart, no view, a
    mask in another convention). ``reused``: every argument given the original's value was the port's own, bit for
    bit or up to rounding, so the port's own output was compared and the module was not run again. ``where`` is
    the index, in the original's layout, of the largest difference of the worst output. For a skipped module,
    ``why`` says why in a few words (the same for every module skipped for that reason) and ``reason`` in full.

    ``own`` is set for a module that departs on its own; ``explained_by`` lists the ids of the departing calls
    inside a module that departs because of them; ``unchecked_inside`` the ids of the calls inside it that were not
    judged (skipped, or without counterpart), in which a departure may lie as well. ``misplaced`` marks a call that
    departs only because its caller picked it where the original calls another module (the same module agrees
    where it is called for its own counterpart); ``picked`` lists such calls on the caller, whose own code departs.
    """

    port: CallNode
    original: CallNode
    how: MatchKind
    verdict: Verdict
    outputs: tuple[TensorDiff, ...] = ()
    given: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    reused: bool = False
    where: tuple[int, ...] | None = None
    why: str = ""
    reason: str = ""
    own: bool = False
    explained_by: tuple[str, ...] = ()
    picked: tuple[str, ...] = ()
    misplaced: bool = False
    unchecked_inside: tuple[str, ...] = ()

    @property
    def worst(self) -> TensorDiff | None:
        """The output that departs most (a departing one when there is one)."""
        ranked = sorted(self.outputs, key=lambda d: (d.status == "diverged", d.largest or 0.0))
        return ranked[-1] if ranked else None


@dataclass(frozen=True)
class CheckReport:
    """Every aligned module call of the port judged on the original's inputs (``modules``, in the order the port's
    calls returned: innermost first, in execution order), and the module calls of the port that have no counterpart
    in the original (``unmatched``)."""

    original: Trace
    port: Trace
    original_label: str
    port_label: str
    tolerance: Tolerance
    rules: tuple[str, ...]
    unused_rules: tuple[str, ...]
    modules: tuple[ModuleCheck, ...]
    unmatched: tuple[CallNode, ...]

    @property
    def departures(self) -> tuple[ModuleCheck, ...]:
        """The modules that depart on their own, innermost first, in execution order."""
        return tuple(check for check in self.modules if check.own)

    @property
    def skipped(self) -> tuple[ModuleCheck, ...]:
        return tuple(check for check in self.modules if check.verdict == "skipped")

    @property
    def equal(self) -> bool:
        """True when no module departs."""
        return not any(check.verdict == "departs" for check in self.modules)

    def counts(self) -> dict[str, int]:
        """How many module calls of the port there are, were matched, judged, agree, depart (on their own), were
        skipped, have no counterpart."""
        verdicts = Counter(check.verdict for check in self.modules)
        return {
            "modules": sum(1 for node in self.port.root.walk() if node.kind == "module"),
            "matched": len(self.modules),
            "checked": verdicts["agrees"] + verdicts["departs"],
            "agree": verdicts["agrees"],
            "depart": verdicts["departs"],
            "depart_on_their_own": len(self.departures),
            "skipped": verdicts["skipped"],
            "unmatched": len(self.unmatched),
            "reused": sum(1 for check in self.modules if check.reused),
        }

    def skip_reasons(self) -> list[tuple[str, list[ModuleCheck]]]:
        """The skipped modules grouped by why, the most frequent reason first."""
        groups: dict[str, list[ModuleCheck]] = {}
        for check in self.skipped:
            groups.setdefault(check.why, []).append(check)
        return sorted(groups.items(), key=lambda item: -len(item[1]))

    def name(self, check: ModuleCheck) -> str:
        """The port's module path (relative to the port), with ``↔`` and the original's when it is named otherwise."""
        port, original = self.port_path(check.port), self.original_path(check.original)
        return port if port == original else f"{port} ↔ {original}"

    def port_calls(self, ids: Sequence[str]) -> list[CallNode]:
        """The port's calls of ``ids`` (``Class.path@index``), in that order."""
        by_id = {node.id: node for node in self.port.root.walk()}
        return [by_id[i] for i in ids if i in by_id]

    def port_path(self, node: CallNode) -> str:
        return relative_path(node, self.port.root)

    def original_path(self, node: CallNode) -> str:
        return relative_path(node, self.original.root)

    def table(self, *, color: bool = False, show_all: bool = False) -> str:
        """The report as text for a terminal (see :mod:`graphtrace.check.text`)."""
        from graphtrace.check.text import render_report

        return render_report(self, color=color, show_all=show_all)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        """One line (``str()`` and :meth:`table` give the report): ``CheckReport(original='ref', port='Port', 45
        modules judged, 2 depart: h.0.attn.out, h.2.ln2)``."""
        named = ", ".join(self.port_path(check.port) or check.port.path for check in self.departures[:3])
        more = f" (+{len(self.departures) - 3} more)" if len(self.departures) > 3 else ""
        verdict = f"{len(self.departures)} depart: {named}{more}" if self.departures else "none departs"
        return (
            f"CheckReport(original={self.original_label!r}, port={self.port_label!r}, "
            f"{self.counts()['checked']} modules judged, {verdict})"
        )

    def _repr_html_(self) -> str:
        """Jupyter's view: the diff's notebook view of the modules' local verdicts."""
        return services().html(self.as_comparison())

    @functools.cached_property
    def _comparison(self) -> Comparison:
        return Comparison(
            a=self.original,
            b=self.port,
            a_label=self.original_label,
            b_label=self.port_label,
            tolerance=self.tolerance,
            align="auto",
            rules=self.rules,
            calls=tuple(_local_pair(self, check) for check in self.modules),
            only_in_a=(),
            only_in_b=tuple(Unmatched(0, node) for node in self.unmatched),
            unused_rules=self.unused_rules,
        )

    def as_comparison(self) -> Comparison:
        """The local verdicts as a :class:`~graphtrace.compare.Comparison`, for the diff's explorer page and
        notebook view: each pair's outputs are the module's, measured on the original's inputs (so its inputs
        agree), a skipped module's output unchecked with its reason."""
        return self._comparison

    def to_json(self) -> dict[str, Any]:
        """The whole report as a JSON-ready dict (non-finite numbers as ``"NaN"``, ``"Infinity"``); each module's
        outputs as the diff's JSON report writes a pair's."""
        pairs = self.as_comparison().to_json()["calls"]
        modules = [self._module_json(check, pair) for check, pair in zip(self.modules, pairs)]
        by_call = {entry["port_call"]: entry for entry in modules}
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "original": _trace_json(self.original, self.original_label),
            "port": _trace_json(self.port, self.port_label),
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "rules": list(self.rules),
            "unused_rules": list(self.unused_rules),
            "equal": self.equal,
            "counts": self.counts(),
            "departures": [_departure_json(by_call[check.port.id], check) for check in self.departures],
            "skipped": [
                {"why": why, "modules": [self._module_ref(check) | {"reason": check.reason} for check in checks]}
                for why, checks in self.skip_reasons()
            ],
            "modules": modules,
            "unmatched": [
                {"port": self.port_path(node), "port_call": node.id, "type": node.type_name} for node in self.unmatched
            ],
        }

    def _module_ref(self, check: ModuleCheck) -> dict[str, Any]:
        return {
            "port": self.port_path(check.port),
            "original": self.original_path(check.original),
            "port_call": check.port.id,
            "original_call": check.original.id,
        }

    def _module_json(self, check: ModuleCheck, pair: dict[str, Any]) -> dict[str, Any]:
        return {
            **self._module_ref(check),
            "port_type": check.port.type_name,
            "original_type": check.original.type_name,
            "how": check.how,
            "verdict": check.verdict,
            "own": check.own,
            "why": check.why,
            "reason": check.reason,
            "reused": check.reused,
            "given": list(check.given),
            "kept": list(check.kept),
            "where": None if check.where is None else list(check.where),
            "explained_by": list(check.explained_by),
            "picked": list(check.picked),
            "misplaced": check.misplaced,
            "unchecked_inside": list(check.unchecked_inside),
            "outputs": [] if check.verdict == "skipped" else pair["outputs"],
        }


def _departure_json(module: dict[str, Any], check: ModuleCheck) -> dict[str, Any]:
    """A departure on its own: the module and the figures of its worst output."""
    worst = check.worst
    assert worst is not None
    figures = next(entry for entry in module["outputs"] if entry["name_a"] == worst.name_a)
    return {
        **{key: module[key] for key in ("port", "original", "port_call", "original_call", "port_type")},
        "output": worst.name_b,
        **{key: figures[key] for key in ("max_abs", "max_rel", "cosine", "outside", "numel", "rtol", "atol")},
        "where": module["where"],
        "reason": worst.reason,
        "kept": module["kept"],
        "picked": module["picked"],
        "unchecked_inside": module["unchecked_inside"],
    }


def _trace_json(trace: Trace, label: str) -> dict[str, Any]:
    return {"trace": label, "model_class": trace.meta.model_class, "calls": sum(1 for _ in trace.walk())}


def _local_pair(report: CheckReport, check: ModuleCheck) -> CallDiff:
    """``check`` as a pair of the diff: its outputs measured on the original's inputs."""
    outputs = check.outputs
    if check.verdict == "skipped":
        outputs = (_note(check, "unchecked", check.reason),)
    elif check.explained_by:
        inner = ", ".join(report.port_path(node) for node in report.port_calls(check.explained_by))
        outputs = tuple(
            dataclasses.replace(d, reason=f"explained by {inner}, which departs too; {d.reason}")
            if d.status == "diverged"
            else d
            for d in outputs
        )
    return CallDiff(step=0, a=check.original, b=check.port, how=check.how, inputs=(), outputs=outputs)


def _note(check: ModuleCheck, status: Literal["unchecked"], reason: str) -> TensorDiff:
    return TensorDiff(
        name_a="outputs",
        name_b="outputs",
        shape_a=(),
        shape_b=(),
        dtype_a="",
        dtype_b="",
        basis="none",
        status=status,
        rtol=0.0,
        atol=0.0,
        reason=reason,
    )
