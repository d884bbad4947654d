"""A check as a compact table for the terminal, built as rich Text, in the diff's form (:mod:`graphtrace.compare.text`).

Modules are listed in the order the port's calls returned (innermost first). Runs of agreeing modules fold into one
line and only the first departing or skipped modules are listed, unless ``show_all``. Then the modules that depart
on their own, the skipped ones grouped by why, and the verdict.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text

from graphtrace.compare.text import rendered

if TYPE_CHECKING:  # pragma: no cover - report.py imports this module to draw its table
    from graphtrace.check.report import CheckReport, ModuleCheck

__all__ = ["render_report", "report_text"]

LOUD_ROWS = 12
"""Departing or skipped modules listed before the rest is summed up (without ``show_all``)."""

NAMES = 6

_HEADERS = (
    "",
    "module of the port (in the order calls returned)",
    "verdict",
    "output",
    "max |Δ|",
    "max rel",
    "cosine",
    "outside",
)
_STYLES = {"✓": "green", "✗": "red", "·": "dim"}


def _line(text: str = "", style: str = "") -> Text:
    return Text(text, style=style, no_wrap=True, overflow="ignore")


def _number(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _verdict(report: CheckReport, check: ModuleCheck) -> str:
    if check.verdict == "skipped":
        return f"skipped: {check.why}"
    if check.verdict == "agrees":
        return "agrees"
    if check.own:
        return "departs on its own"
    if check.misplaced:
        return "departs: called where the original calls another module"
    inner = ", ".join(report.port_path(node) for node in report.port_calls(check.explained_by)[:2])
    return f"departs (so does {inner})"


def _label(report: CheckReport, check: ModuleCheck) -> str:
    label = report.name(check) or check.port.path
    return label if check.port.index == 0 else f"{label} (call {check.port.index + 1})"


def _cells(report: CheckReport, check: ModuleCheck) -> list[str]:
    mark = {"agrees": "✓", "departs": "✗", "skipped": "·"}[check.verdict]
    worst = check.worst
    if worst is None:
        return [mark, _label(report, check), _verdict(report, check), "-", "-", "-", "-", "-"]
    output = str(list(worst.shape_a))
    if worst.shape_b != worst.shape_a:
        output += f"→{list(worst.shape_b)}"
    return [
        mark,
        _label(report, check),
        _verdict(report, check),
        output,
        _number(worst.largest, ".2e"),
        _number(worst.max_rel, ".2e"),
        _number(worst.cosine, ".6f"),
        "-" if worst.outside is None else f"{worst.outside}/{worst.numel}",
    ]


Row = list[str] | tuple[str, str]


def _rows(report: CheckReport, show_all: bool) -> Iterator[Row]:
    quiet = 0
    listed = 0
    for position, check in enumerate(report.modules):
        if not show_all and check.verdict == "agrees":
            quiet += 1
            continue
        if quiet:
            yield ("✓", f"… {quiet} modules agree") if quiet > 1 else _cells(report, report.modules[position - 1])
            quiet = 0
        if not show_all and listed == LOUD_ROWS:
            rest = report.modules[position:]
            bad = sum(1 for c in rest if c.verdict == "departs")
            yield ("", f"… {len(rest)} more modules, {bad} of them departing (--all lists every module)")
            return
        listed += 1
        yield _cells(report, check)
    if quiet:
        yield ("✓", f"… {quiet} modules agree") if quiet > 1 else _cells(report, report.modules[-1])


def _table(report: CheckReport, show_all: bool) -> list[Text]:
    rows = list(_rows(report, show_all))
    widths = [cell_len(h) for h in _HEADERS]
    for row in rows:
        if isinstance(row, list):
            widths = [max(w, cell_len(c)) for w, c in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c + " " * (w - cell_len(c)) for c, w in zip(cells, widths)).rstrip()

    out = [_line(line(_HEADERS), "bold")]
    for row in rows:
        if isinstance(row, tuple):
            mark, text = row
            out.append(_line(f"{mark}{' ' * (widths[0] - cell_len(mark))}  {text}", "dim"))
        elif row[2] == "departs on its own":
            out.append(_line(line(row) + "  ◀", "bold red"))
        else:
            out.append(_line(line(row), _STYLES[row[0]]))
    return out


def _names(names: Sequence[str], show_all: bool) -> str:
    if not show_all and len(names) > NAMES:
        return ", ".join(names[:NAMES]) + f", … (+{len(names) - NAMES} more)"
    return ", ".join(names)


def _departure(report: CheckReport, check: ModuleCheck) -> list[Text]:
    worst = check.worst
    assert worst is not None
    at = "" if check.where is None else f" at {worst.name_a}{list(check.where)}"
    kind = f" ({check.port.type_name})" if check.port.type_name else ""
    lines = [_line(f"  {_label(report, check)}{kind}: max |Δ| {_number(worst.largest, '.3g')}{at}", "red")]
    lines.append(_line(f"    {worst.reason}"))
    for node in report.port_calls(check.picked):
        twin = next(c for c in report.modules if c.port is node)
        where = report.original_path(twin.original)
        lines.append(_line(f"    it calls {report.port_path(node)} where the original calls {where}"))
    if check.kept:
        lines.append(_line(f"    given the port's own {', '.join(check.kept)} (no counterpart with a view)"))
    if check.unchecked_inside:
        names = [report.port_path(node) for node in report.port_calls(check.unchecked_inside)]
        lines.append(_line(f"    or in what it calls that was not judged: {_names(names, False)}"))
    return lines


def report_text(report: CheckReport, *, show_all: bool = False) -> Text:
    """The check as styled rich Text, one line per line: what was checked, the table, the departures, what was
    skipped and why, the verdict. Print it through a Console with ``soft_wrap=True``."""
    counts = report.counts()
    lines = [
        _line(f"original  {report.original_label}  {report.original.meta.model_class}"),
        _line(f"port      {report.port_label}, {counts['modules']} module calls"),
        _line(
            f"each module of the port run alone on the original's inputs: {counts['checked']} judged "
            f"({counts['agree']} agree, {counts['depart']} depart), {counts['skipped']} skipped, "
            f"{counts['unmatched']} without counterpart"
            + (
                f"; {counts['reused']} given their own inputs up to rounding (not run again)"
                if counts["reused"]
                else ""
            )
        ),
        _line(f"tolerance: {report.tolerance.describe()}"),
        _line(),
        *_table(report, show_all),
        _line(),
    ]
    departures = report.departures
    if departures:
        lines.append(_line(f"departs on its own ({len(departures)}), innermost first, in execution order:", "bold"))
        for check in departures:
            lines += _departure(report, check)
    for why, checks in report.skip_reasons():
        names = [_label(report, check) for check in checks]
        lines.append(_line(f"skipped ({len(checks)}), {why}: {_names(names, show_all)}", "dim"))
        if show_all:
            lines += [_line(f"  {_label(report, check)}: {check.reason}", "dim") for check in checks]
    if report.unmatched:
        names = [report.port_path(node) or node.path for node in report.unmatched]
        lines.append(_line(f"without counterpart in the original ({len(names)}): {_names(names, show_all)}", "dim"))
    if report.unused_rules:
        lines.append(_line("rules that renamed no call of the original: " + ", ".join(report.unused_rules), "yellow"))
    if departures:
        lines.append(_line(f"DEPARTS: {len(departures)} module(s) depart on their own", "bold red"))
    else:
        lines.append(_line(f"AGREES: all {counts['checked']} modules judged agree within tolerance", "bold green"))
    return _line("\n").join(lines)


def render_report(report: CheckReport, *, color: bool = False, show_all: bool = False) -> str:
    """:func:`report_text` as a string, ANSI-styled when ``color``."""
    return rendered(report_text(report, show_all=show_all), color=color)
