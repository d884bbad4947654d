"""A comparison as a compact table for the terminal.

Calls are listed in the order they returned (so the first ``✗`` whose inputs agree is the culprit). Runs of
agreeing calls fold into one line and only the first diverging calls are listed, unless ``show_all``. Colour is
ANSI and optional: the caller decides (the CLI colours a terminal and leaves pipes plain).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from graphtrace.compare.align import relative_path
from graphtrace.compare.pairs import CallDiff
from graphtrace.model import Trace

if TYPE_CHECKING:  # pragma: no cover - report.py imports this module to draw its table
    from graphtrace.compare.report import Comparison, Unmatched

__all__ = ["render_table"]

DIVERGED_ROWS = 12
"""Diverging calls listed before the rest is summed up (without ``show_all``)."""

UNMATCHED_NAMES = 6

_RESET = "\033[0m"
_STYLES = {"ok": "\033[32m", "bad": "\033[31m", "warn": "\033[33m", "dim": "\033[2m", "bold": "\033[1m"}
_HEADERS = (
    "",
    "call (in the order calls returned)",
    "how",
    "output",
    "basis",
    "max |Δ|",
    "max rel",
    "cosine",
    "outside",
)
_PATH_WIDTH = 64


class _Painter:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles or not text:
            return text
        return "".join(_STYLES[s] for s in styles) + text + _RESET


def _number(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def _call_label(comparison: Comparison, call: CallDiff, steps: bool) -> str:
    a_name = relative_path(call.a, comparison.a.root) or call.a.path
    b_name = relative_path(call.b, comparison.b.root) or call.b.path
    label = a_name if call.a.index == 0 else f"{a_name}#{call.a.index + 1}"
    if b_name != a_name or call.b.index != call.a.index:
        label += f" ↔ {b_name}" + (f"#{call.b.index + 1}" if call.b.index else "")
    return f"[{call.step}] {label}" if steps else label


def _cells(comparison: Comparison, call: CallDiff, steps: bool) -> list[str]:
    mark = {"equal": "✓", "diverged": "✗", "unchecked": "·"}[call.status]
    if call.status != "diverged" and not call.inputs_agree:
        mark = "!"
    worst = call.worst
    if worst is None:
        return [mark, _call_label(comparison, call, steps), call.how, "-", "-", "-", "-", "-", call.error or "-"]
    output = str(list(worst.shape_a))
    if worst.shape_b != worst.shape_a:
        output += f"→{list(worst.shape_b)}"
    if worst.dtype_b != worst.dtype_a:
        output += f" {worst.dtype_a.removeprefix('torch.')}→{worst.dtype_b.removeprefix('torch.')}"
    outside = "-" if worst.outside is None else f"{worst.outside}/{worst.numel}"
    return [
        mark,
        _call_label(comparison, call, steps),
        call.how,
        output,
        worst.basis,
        _number(worst.largest, ".2e"),
        _number(worst.max_rel, ".2e"),
        _number(worst.cosine, ".6f"),
        outside,
    ]


Row = tuple[list[str] | tuple[str, str], CallDiff | None]


def _rows(comparison: Comparison, show_all: bool) -> Iterator[Row]:
    """Table rows (cells) and folded lines (a mark and a text), each with the call it shows."""
    first = comparison.first_divergence
    steps = len({call.step for call in comparison.calls}) > 1
    quiet: list[CallDiff] = []
    listed = 0
    for position, call in enumerate(comparison.calls):
        loud = call is first or call.status == "diverged" or not call.inputs_agree
        if show_all or loud:
            if quiet:
                yield from _fold(comparison, quiet, steps)
                quiet = []
            if not show_all and listed == DIVERGED_ROWS:
                rest = comparison.calls[position:]
                bad = sum(1 for c in rest if c.status == "diverged" or not c.inputs_agree)
                yield ("", f"… {len(rest)} more calls, {bad} of them diverging (--all lists every call)"), None
                return
            listed += 1
            yield _cells(comparison, call, steps), call
        else:
            quiet.append(call)
    if quiet:
        yield from _fold(comparison, quiet, steps)


def _fold(comparison: Comparison, quiet: Sequence[CallDiff], steps: bool) -> Iterator[Row]:
    if len(quiet) == 1:
        yield _cells(comparison, quiet[0], steps), None
        return
    unchecked = sum(1 for call in quiet if call.status == "unchecked")
    note = f" ({unchecked} without comparable outputs)" if unchecked else ""
    yield ("✓", f"… {len(quiet)} calls agree{note}"), None


def _table(comparison: Comparison, paint: _Painter, show_all: bool) -> list[str]:
    rows = list(_rows(comparison, show_all))
    cell_rows = [cells for cells, _ in rows if isinstance(cells, list)]
    widths = [len(h) for h in _HEADERS]
    for cells in cell_rows:
        cells[1] = _short(cells[1], _PATH_WIDTH)
        widths = [max(w, len(c)) for w, c in zip(widths, cells)]
    first = comparison.first_divergence

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    out = [paint(line(_HEADERS), "bold")]
    for row, call in rows:
        if isinstance(row, tuple):
            mark, text = row
            out.append(paint(f"{mark.ljust(widths[0])}  {text}", "dim"))
            continue
        text = line(row)
        style = {"✓": "ok", "✗": "bad", "!": "warn", "·": "dim"}[row[0]]
        if call is not None and call is first:
            out.append(paint(text + "  ◀ first divergence", style, "bold"))
        else:
            out.append(paint(text, style))
    return out


def _names(items: Sequence[Unmatched], comparison: Comparison, trace: Trace, show_all: bool) -> str:
    names = [relative_path(item.call, trace.root) or item.call.path for item in items]
    names = [n if item.call.index == 0 else f"{n}#{item.call.index + 1}" for n, item in zip(names, items)]
    if not show_all and len(names) > UNMATCHED_NAMES:
        return ", ".join(names[:UNMATCHED_NAMES]) + f", … (+{len(names) - UNMATCHED_NAMES} more)"
    return ", ".join(names)


def _verdict(comparison: Comparison, paint: _Painter) -> list[str]:
    found = comparison.divergence
    lines = []
    if found is not None:
        first = found.call
        a_name = relative_path(first.a, comparison.a.root) or first.a.path
        b_name = relative_path(first.b, comparison.b.root) or first.b.path
        names = a_name if a_name == b_name else f"{a_name} ↔ {b_name}"
        kind = f" ({first.a.type_name})" if first.a.type_name else ""
        if found.inside:
            why = "the departure lies in its own code"
        elif first.status == "diverged" and first.inputs_agree:
            why = "its inputs agree, its output does not"
        elif first.status == "diverged":
            why = "its inputs already differ: were the two traces given the same inputs?"
        else:
            why = "its inputs differ"
        lines.append(paint(f"first divergence: {names}{kind}: {why}", "bad", "bold"))
        lines.append(f"  {found.explanation if found.inside else first.reason}")
        if found.op_locus is not None:
            lines.append(f"  {found.op_locus}")
    notes = _equivalences(comparison)
    if notes:
        lines.append("equivalences applied (values equal once allowed for):")
        lines += [f"  {note} ({count} tensor{'s' if count > 1 else ''})" for note, count in notes]
    matched = len(comparison.calls)
    if comparison.equal:
        lines.append(paint(f"EQUAL: all {matched} matched calls agree within tolerance", "ok", "bold"))
    elif comparison.diverged:
        count = len(comparison.diverged)
        lines.append(paint(f"DIVERGED: {count} of {matched} matched calls differ", "bad", "bold"))
    else:
        lines.append(paint("DIVERGED: the calls match but some have no counterpart (strict)", "bad", "bold"))
    return lines


def _equivalences(comparison: Comparison) -> list[tuple[str, int]]:
    """What the comparison allowed for (a layout, a broadcast, a fused projection), with how often, most frequent
    first; a fused projection's slice position is left out so that its calls count together."""
    counts: dict[str, int] = {}
    for call in comparison.calls:
        for diff in (*call.inputs, *call.outputs):
            for note in filter(None, diff.equivalence.split("; ")):
                if note.startswith("a slice [") and " of the fused " in note:
                    note = "a slice" + note[note.index(" of the fused ") :]
                counts[note] = counts.get(note, 0) + 1
    return sorted(counts.items(), key=lambda item: -item[1])


def render_table(comparison: Comparison, *, color: bool = False, show_all: bool = False) -> str:
    """The comparison as lines of text: what was compared, the table, unmatched calls, the verdict."""
    paint = _Painter(color)
    lines = []
    for side, trace, label in (("A", comparison.a, comparison.a_label), ("B", comparison.b, comparison.b_label)):
        calls = sum(1 for _ in trace.walk())
        lines.append(f"{side}  {label}  {trace.meta.model_class}, {calls} calls")
    counts = ", ".join(f"{n} by {how}" for how, n in comparison.matched_by().items() if n)
    lines.append(
        f"matched {len(comparison.calls)} calls ({counts or 'none'}); "
        f"only in A: {len(comparison.only_in_a)}, only in B: {len(comparison.only_in_b)}"
    )
    lines.append(f"tolerance: {comparison.tolerance.describe()}")
    lines.append("")
    lines += _table(comparison, paint, show_all)
    lines.append("")
    for side, items, trace in (("A", comparison.only_in_a, comparison.a), ("B", comparison.only_in_b, comparison.b)):
        if items:
            lines.append(f"only in {side} ({len(items)}): {_names(items, comparison, trace, show_all)}")
    if comparison.unused_rules:
        lines.append(paint("rules that renamed no call of A: " + ", ".join(comparison.unused_rules), "warn"))
    lines += _verdict(comparison, paint)
    return "\n".join(lines)
