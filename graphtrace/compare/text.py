"""A comparison as a compact table for the terminal, built as rich Text.

Calls are listed in the order they returned (so the first ``✗`` whose inputs agree is the culprit). Runs of
agreeing calls fold into one line and only the first diverging calls are listed, unless ``show_all``. The lines are
styled rich Text (:func:`report_text`): the CLI prints them through its console, which decides on colour; and
:func:`render_table` renders them to a string, plain or ANSI-styled as its caller asks. Whether coloured or not, the
lines are the same, and none is ever wrapped or cut: a long module path widens its column.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from graphtrace.compare.align import relative_path
from graphtrace.compare.pairs import CallDiff
from graphtrace.model import Trace

if TYPE_CHECKING:  # pragma: no cover - report.py imports this module to draw its table
    from graphtrace.compare.report import Comparison, Unmatched

__all__ = ["little_in_common", "render_table", "rendered", "report_text"]

DIVERGED_ROWS = 12
"""Diverging calls listed before the rest is summed up (without ``show_all``)."""

UNMATCHED_NAMES = 6

LINE_WIDTH = 1_000_000
"""rich's width when rendering to a string: wide enough that no line is ever cut or wrapped by rich itself."""

_ROW_STYLES = {"✓": "green", "✗": "red", "!": "yellow", "·": "dim"}
"""A row's style by its mark: agree, diverge, an input already differs, nothing comparable."""
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


def _line(text: str = "", style: str = "") -> Text:
    return Text(text, style=style, no_wrap=True, overflow="ignore")


def _number(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


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


def _marked(comparison: Comparison) -> CallDiff | None:
    """The row the first divergence points at: its pair, or, when the culprit is a module of B without counterpart
    (not a row of its own), the first call inside it whose inputs differ."""
    found = comparison.divergence
    if found is None:
        return None
    if any(call is found.call for call in comparison.calls):
        return found.call
    return found.before


def _rows(comparison: Comparison, show_all: bool) -> Iterator[Row]:
    """Table rows (cells) and folded lines (a mark and a text), each with the call it shows."""
    first = _marked(comparison)
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


def _headers(rows: Sequence[Row]) -> tuple[str, ...]:
    """The table's headers; the largest difference's column says what it holds: of the values (``max |Δ|``), of the
    statistics (``max |Δstat|``: the largest of the deltas of mean, std, min and max), or of either, as the basis
    column says row by row."""
    bases = {cells[4] for cells, _ in rows if isinstance(cells, list) and cells[4] in ("values", "stats")}
    label = "max |Δstat|" if bases == {"stats"} else "max |Δ| / |Δstat|" if "stats" in bases else "max |Δ|"
    return tuple(label if header == "max |Δ|" else header for header in _HEADERS)


def _table(comparison: Comparison, show_all: bool) -> list[Text]:
    rows = list(_rows(comparison, show_all))
    headers = _headers(rows)
    widths = [cell_len(h) for h in headers]
    for cells, _ in rows:
        if isinstance(cells, list):
            widths = [max(w, cell_len(c)) for w, c in zip(widths, cells)]
    first = _marked(comparison)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c + " " * (w - cell_len(c)) for c, w in zip(cells, widths)).rstrip()

    out = [_line(line(headers), "bold")]
    for row, call in rows:
        if isinstance(row, tuple):
            mark, text = row
            out.append(_line(f"{mark}{' ' * (widths[0] - cell_len(mark))}  {text}", "dim"))
            continue
        style = _ROW_STYLES[row[0]]
        if call is not None and call is first:
            out.append(_line(line(row) + "  ◀ first divergence", f"bold {style}"))
        else:
            out.append(_line(line(row), style))
    return out


def _names(items: Sequence[Unmatched], comparison: Comparison, trace: Trace, show_all: bool) -> str:
    names = [relative_path(item.call, trace.root) or item.call.path for item in items]
    names = [n if item.call.index == 0 else f"{n}#{item.call.index + 1}" for n, item in zip(names, items)]
    if not show_all and len(names) > UNMATCHED_NAMES:
        return ", ".join(names[:UNMATCHED_NAMES]) + f", … (+{len(names) - UNMATCHED_NAMES} more)"
    return ", ".join(names)


def _verdict(comparison: Comparison) -> list[Text]:
    found = comparison.divergence
    lines = []
    if found is not None:
        first = found.call
        a_name = relative_path(first.a, comparison.a.root) or first.a.path
        b_name = relative_path(first.b, comparison.b.root) or first.b.path
        names = a_name if a_name == b_name else f"{a_name} ↔ {b_name}"
        own = not any(call is first for call in comparison.calls)  # a module of B without counterpart
        type_name = first.b.type_name if own else first.a.type_name
        kind = f" ({type_name})" if type_name else ""
        if found.parts:
            why = f"one of the {len(found.parts)} projections it calls in place of A's fused one departs"
        elif found.inside:
            why = "the departure lies in its own code"
        elif first.status == "diverged" and first.inputs_agree:
            why = "its inputs agree, its output does not"
        elif first.status == "diverged":
            why = "its inputs already differ: were the two traces given the same inputs?"
        else:
            why = "its inputs differ"
        lines.append(_line(f"first divergence: {names}{kind}: {why}", "bold red"))
        lines.append(_line(f"  {found.explanation if found.inside or found.parts else first.reason}"))
        if found.unchecked:
            names = ", ".join(node.path.partition(".")[2] or node.path for node in found.unchecked[:4])
            more = f" (+{len(found.unchecked) - 4} more)" if len(found.unchecked) > 4 else ""
            lines.append(_line(f"  or in what it called that A has no counterpart for (not compared): {names}{more}"))
        if found.op_locus is not None:
            lines.append(_line(f"  {found.op_locus}"))
    notes = _equivalences(comparison)
    if notes:
        lines.append(_line("equivalences applied (values equal once allowed for):"))
        lines += [_line(f"  {note} ({count} tensor{'s' if count > 1 else ''})") for note, count in notes]
    matched = len(comparison.calls)
    if comparison.equal:
        lines.append(_line(f"EQUAL: all {matched} matched calls agree within tolerance", "bold green"))
    elif comparison.diverged:
        count = len(comparison.diverged)
        lines.append(_line(f"DIVERGED: {count} of {matched} matched calls differ", "bold red"))
    else:
        lines.append(_line("DIVERGED: the calls match but some have no counterpart (strict)", "bold red"))
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


_KINDS = {
    "norm": "norm",
    "embed": "embedding",
    "linear": "projection",
    "conv": "projection",  # GPT-2's Conv1D is a linear layer
    "dense": "projection",
    "attention": "attention",
    "mlp": "mlp",
    "dropout": "dropout",
    "act": "activation",
}
"""Words of module class names that say what kind of module it is, for naming an unlikely pair."""


def _kind(type_name: str) -> str | None:
    name = type_name.lower()
    return next((kind for word, kind in _KINDS.items() if word in name), None)


def little_in_common(comparison: Comparison) -> str | None:
    """A warning when the two traces share little: fewer than half of A's module calls and fewer than half of B's
    found a counterpart (GPT-2 against Llama, not a port of it). Pairs made by structure alone are then likely
    coincidences of shape; one is named (a norm paired with a projection, where there is one). None otherwise."""
    pairs = [call for call in comparison.calls if call.a.kind == "module"]
    sizes = [sum(1 for node in trace.walk() if node.kind == "module") for trace in (comparison.a, comparison.b)]
    matched = len({id(call.a) for call in pairs})
    if not pairs or any(2 * matched >= size for size in sizes):
        return None
    by_structure = [call for call in pairs if call.how == "structure" and call.a.leaf and call.b.leaf]
    unlike = [call for call in by_structure if call.a.type_name != call.b.type_name]
    odd = next(
        (
            call
            for call in unlike
            if None not in (_kind(call.a.type_name), _kind(call.b.type_name))
            and _kind(call.a.type_name) != _kind(call.b.type_name)
        ),
        unlike[0] if unlike else None,
    )
    example = ""
    if odd is not None:
        names = _call_label(comparison, odd, False)
        example = f"; pairs such as {names} ({odd.a.type_name} ↔ {odd.b.type_name}) may be coincidences of shape"
    structure = comparison.matched_by()["structure"]
    return (
        f"warning: A and B share little: only {matched} of A's {sizes[0]} module calls and of B's {sizes[1]} have a "
        f"counterpart ({structure} of them by structure alone){example}. Are they the same architecture? "
        "--map names how A's modules are called in B."
    )


def report_text(comparison: Comparison, *, show_all: bool = False) -> Text:
    """The comparison as styled rich Text, one line per line: what was compared, the table, unmatched calls, the
    verdict. Print it through a Console with ``soft_wrap=True`` so that no line is wrapped or cut."""
    lines = []
    for side, trace, label in (("A", comparison.a, comparison.a_label), ("B", comparison.b, comparison.b_label)):
        calls = sum(1 for _ in trace.walk())
        lines.append(_line(f"{side}  {label}  {trace.meta.model_class}, {calls} calls"))
    counts = ", ".join(f"{n} by {how}" for how, n in comparison.matched_by().items() if n)
    lines.append(
        _line(
            f"matched {len(comparison.calls)} calls ({counts or 'none'}); "
            f"only in A: {len(comparison.only_in_a)}, only in B: {len(comparison.only_in_b)}"
        )
    )
    lines.append(_line(f"tolerance: {comparison.tolerance.describe()}"))
    warning = little_in_common(comparison)
    if warning is not None:
        lines.append(_line(warning, "bold yellow"))
    lines.append(_line())
    lines += _table(comparison, show_all)
    lines.append(_line())
    for side, items, trace in (("A", comparison.only_in_a, comparison.a), ("B", comparison.only_in_b, comparison.b)):
        if items:
            lines.append(_line(f"only in {side} ({len(items)}): {_names(items, comparison, trace, show_all)}"))
    if comparison.unused_rules:
        lines.append(_line("rules that renamed no call of A: " + ", ".join(comparison.unused_rules), "yellow"))
    lines += _verdict(comparison)
    return _line("\n").join(lines)


def render_table(comparison: Comparison, *, color: bool = False, show_all: bool = False) -> str:
    """:func:`report_text` as a string: ANSI-styled when ``color``, plain text otherwise, whatever the environment
    (NO_COLOR and FORCE_COLOR are for the CLI's console; here the caller decides)."""
    return rendered(report_text(comparison, show_all=show_all), color=color)


def rendered(text: Text, *, color: bool) -> str:
    """Styled ``text`` as a string, ANSI-styled when ``color``, plain otherwise; no line wrapped or cut."""
    out = io.StringIO()
    console = Console(
        file=out,
        width=LINE_WIDTH,
        soft_wrap=True,
        markup=False,
        highlight=False,
        emoji=False,
        force_terminal=color,
        force_jupyter=False,
        legacy_windows=False,
        no_color=False,
        color_system="standard" if color else None,
    )
    console.print(text)
    return out.getvalue().removesuffix("\n")
