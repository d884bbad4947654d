"""Trace -> one self-contained HTML page: the call tree, each call's tensors, and the clickable call graph.
A trace whose outputs hold NaN or Inf opens on the first call that made them (its inputs finite), linked from the
header.

The page is a single file that works from ``file://`` with no network: the trace is embedded as JSON, the viewer's
script and style sheet (``assets/``) are inlined, and the call graph is Graphviz's SVG of :func:`call_graph`. The
script builds the tree lazily (a call's children become DOM nodes when it is expanded), so a trace of tens of
thousands of calls opens as fast as its JSON parses.

A :class:`~graphtrace.compare.Comparison` gets the same page with both traces side by side: matched calls coloured
by how they compare, unmatched calls marked, the first divergence selected on load. Only the comparison's public
surface is read (``calls``, ``first_divergence``, ``only_in_a``/``only_in_b``, ``to_json()``).

For notebooks, :func:`trace_summary_html` and :func:`comparison_summary_html` give compact, script-free fragments
(``Trace._repr_html_`` and ``Comparison._repr_html_`` delegate here).
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphtrace.errors import GraphvizFailedError, GraphvizNotFoundError, InvalidOptionError, OutputPathError
from graphtrace.files import write_atomic
from graphtrace.model import CallNode, TensorRecord, Trace, Value, fallback_in_words
from graphtrace.render.dot import render_dot_file, to_dot
from graphtrace.render.graph import DEFAULT_MAX_BOXES, _Folder, call_graph

if TYPE_CHECKING:  # pragma: no cover - compare is a sibling; only its public surface is read, at run time by duck
    from graphtrace.compare import Comparison

__all__ = [
    "comparison_summary_html",
    "diff_page",
    "graph_svg",
    "to_html",
    "trace_page",
    "trace_summary_html",
    "write_html",
]

_ASSETS = "assets"


# -- the embedded data ------------------------------------------------------------------------------------------------


def _number(x: float | None) -> float | str | None:
    """JSON has no NaN or Infinity: they travel as strings the script prints as they are."""
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")


def _tensor(name: str, record: TensorRecord) -> list[Any]:
    stats = record.stats
    row: list[Any] = [
        name.lstrip("_"),
        list(record.shape),
        record.dtype.removeprefix("torch."),
        *((_number(stats.mean), _number(stats.std), _number(stats.min), _number(stats.max)) if stats else [None] * 4),
        record.nan_count,
        record.inf_count,
    ]
    if record.dtensor is not None:
        row.append(f"local shard of {list(record.dtensor.global_shape)}, {record.dtensor.placements}")
    return row


def _plain_values(value: Value | None, name: str, out: list[list[str]]) -> None:
    """The non-tensor arguments (``use_cache=True``), by the same names as tensors."""
    if value is None or isinstance(value, TensorRecord):
        return
    if isinstance(value, str):
        out.append([name.lstrip("_"), value if len(value) <= 200 else value[:197] + "..."])
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            _plain_values(item, f"{name}_{i}", out)
    else:
        for key, item in value.items():
            _plain_values(item, f"{name}_{key}", out)


class _Calls:
    """A trace flattened for the page: calls in the order they started, children by index, folded runs marked."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.records: list[dict[str, Any]] = []
        self.index: dict[int, int] = {}  # id() of a CallNode of the trace -> position in records
        self.folder = _Folder(trace.fallbacks, enabled=True)
        self.steps = [self._add(step, number, -1) for number, step in enumerate(trace.steps)]

    def _add(self, node: CallNode, step: int, parent: int) -> int:
        k = len(self.records)
        record: dict[str, Any] = {"p": node.path, "n": node.name, "i": node.index, "t": node.type_name, "u": parent}
        self.records.append(record)
        self.index[id(node)] = k
        if node.kind != "module":
            record["k"] = node.kind
        if node.strategy != "eager":
            record["s"] = node.strategy
        if node.error is not None:
            record["e"] = node.error
        fallback = self.trace.fallbacks.get(node.path) if node.kind == "module" else None
        if fallback is not None:
            record["f"] = fallback
            record["fw"] = fallback_in_words(fallback, hooks=node.path in self.trace.hooks)
        hooks = self.trace.hooks.get(node.path) if node.kind == "module" else None
        if hooks:
            record["h"] = list(hooks)
        parameters = self.trace.parameters.get(node.path) if node.kind == "module" else None
        if parameters:
            record["w"] = parameters
        inputs = [_tensor(name, r) for name, r in node.input_tensors()]
        outputs = [_tensor(name or "output", r) for name, r in node.output_tensors()]
        if inputs:
            record["in"] = inputs
        if outputs:
            record["out"] = outputs
        plain: list[list[str]] = []
        _plain_values(node.args, "_args", plain)
        _plain_values(node.kwargs, "_kwargs", plain)
        if plain:
            record["v"] = plain
        if node.children:
            record["c"] = [self._add(child, step, k) for child in node.children]
            runs = [[start, stop] for start, stop in self.folder.runs(node.children) if stop - start > 1]
            if runs:
                record["r"] = runs
        return k

    def side(self, label: str, svg: str | None, note: str) -> dict[str, Any]:
        trace = self.trace
        info = []
        for number in range(len(trace.steps)):
            step = trace.step_info[number] if number < len(trace.step_info) else None
            info.append("" if step is None or step.phase == "forward" else step.phase)
        return {
            "label": label,
            "model": trace.meta.model_class,
            "strategy": trace.meta.strategy,
            "coverage": trace.coverage().in_words(),
            "coverage_why": trace.coverage().summary(),
            "calls": self.records,
            "steps": self.steps,
            "phases": info,
            "graph_step": len(trace.steps) - 1,
            "svg": svg is not None,
            "graph_note": note,
        }


# -- the call graph ---------------------------------------------------------------------------------------------------

_XML_PROLOGUE = re.compile(r"^.*?(?=<svg\b)", re.S)
_LINKS = re.compile(r"</?a\b[^>]*>")


def graph_svg(trace: Trace, *, max_boxes: int | None = DEFAULT_MAX_BOXES) -> str:
    """The SVG of ``trace``'s default call graph (its last step), as an inline ``<svg>`` element: Graphviz's output
    without its XML prologue. Raises :class:`GraphvizNotFoundError` / :class:`GraphvizFailedError` like
    :func:`write_call_graph`."""
    shown = trace.with_pruned_layers() if trace.meta.prune_layers else trace
    source = to_dot(call_graph(shown, max_boxes=max_boxes))
    with tempfile.TemporaryDirectory(prefix="graphtrace-html-") as folder:
        dot_file, svg_file = Path(folder, "graph.dot"), Path(folder, "graph.svg")
        dot_file.write_text(source, encoding="utf-8")
        render_dot_file(dot_file, svg_file, "svg")
        svg = svg_file.read_text(encoding="utf-8")
    svg = _XML_PROLOGUE.sub("", svg, count=1)
    if re.search(
        r"<script|<[^>]*\son[a-z]+\s*=|javascript:", svg, re.I
    ):  # Graphviz escapes labels; never trust that blindly
        raise GraphvizFailedError("the call graph's SVG holds script; it is left out of the page.")
    return svg


def _graph_or_note(trace: Trace, graph: bool, max_boxes: int | None) -> tuple[str | None, str]:
    if not graph:
        return None, "the call graph was not drawn (graph=False)."
    if not trace.steps:
        return None, "this trace recorded no forward call."
    try:
        return graph_svg(trace, max_boxes=max_boxes), ""
    except (GraphvizNotFoundError, GraphvizFailedError) as exc:
        return None, str(exc)


# -- pages ------------------------------------------------------------------------------------------------------------


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(_ASSETS, name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    """JSON that cannot end its ``<script>`` element early, whatever module paths and reprs the trace holds."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _page(title: str, data: Mapping[str, Any], svgs: list[str | None]) -> str:
    graphs = "".join(
        f'<div class="svg-holder" data-side="{i}"{"" if i == 0 else " hidden"}>{svg}</div>'
        for i, svg in enumerate(svgs)
        if svg is not None
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="graphtrace"><title>{html.escape(title)}</title>'
        f"<style>{_asset('viewer.css')}</style></head>"
        f'<body><div id="app"></div><div id="graphs" hidden>{graphs}</div>'
        f'<script type="application/json" id="graphtrace-data">{_script_json(data)}</script>'
        f"<script>{_asset('viewer.js')}</script></body></html>\n"
    )


def trace_page(trace: Trace, *, graph: bool = True, max_boxes: int | None = DEFAULT_MAX_BOXES) -> str:
    """The explorer page of one trace (see the module docstring). Without Graphviz the page says so where the graph
    would be; everything else works."""
    calls = _Calls(trace)
    svg, note = _graph_or_note(trace, graph, max_boxes)
    label = trace.directory or trace.meta.model_class
    data: dict[str, Any] = {
        "kind": "trace",
        "title": f"{trace.meta.model_class} trace",
        "sides": [calls.side(label, svg, note)],
    }
    bad = trace.first_nonfinite() if trace.steps else None
    if bad is not None:  # the page opens there, as `show --nonfinite` and the notebook view name it
        data["nonfinite"] = calls.index[id(bad)]
    return _page(f"{trace.meta.model_class} — graphtrace", data, [svg])


def diff_page(comparison: Comparison, *, graph: bool = True, max_boxes: int | None = DEFAULT_MAX_BOXES) -> str:
    """The explorer page of a comparison: trace A and trace B side by side, matched calls coloured by status."""
    report = comparison.to_json()
    sides = [_Calls(comparison.a), _Calls(comparison.b)]
    pairs: list[dict[str, Any]] = []
    # The report lists the comparison's calls in order; its CallNodes are the traces' own, found by identity.
    for call, pair in zip(comparison.calls, report["calls"], strict=True):
        a, b = sides[0].index.get(id(call.a)), sides[1].index.get(id(call.b))
        if a is None or b is None:
            continue
        sides[0].records[a]["d"] = sides[1].records[b]["d"] = len(pairs)
        _with_statistics(pair, call.a, call.b)
        pairs.append({**pair, "ka": a, "kb": b})
    for side, unmatched in ((sides[0], comparison.only_in_a), (sides[1], comparison.only_in_b)):
        for item in unmatched:
            k = side.index.get(id(item.call))
            if k is not None:
                side.records[k]["x"] = 1
    for side in sides:
        _unfold_departures(side.records, pairs)
    first = report["first_divergence"]
    first_index = next(
        (i for i, pair in enumerate(pairs) if first and (pair["step"], pair["a"]) == (first["step"], first["a"])),
        None,
    )
    svgs, rendered = [], []
    for side, trace, label in (
        (sides[0], comparison.a, report["a"]["trace"]),
        (sides[1], comparison.b, report["b"]["trace"]),
    ):
        svg, note = _graph_or_note(trace, graph, max_boxes)
        svgs.append(svg)
        rendered.append(side.side(label, svg, note))
    data = {
        "kind": "diff",
        "title": " vs ".join(_distinct_names(report["a"]["trace"], report["b"]["trace"])),
        "sides": rendered,
        "pairs": pairs,
        "first": first_index,
        "equal": report["equal"],
        "tolerance": report["tolerance"],
        "matched": report["matched"],
        "only": [len(report["only_in_a"]), len(report["only_in_b"])],
    }
    return _page(f"{data['title']} — graphtrace diff", data, svgs)


def _statistics(node: CallNode) -> dict[str, list[float | str | None]]:
    """Each tensor of a call by the name a comparison gives it (``inputs_args_0``, ``outputs``): mean, std, min, max."""
    named = [("inputs" + name, record) for name, record in node.input_tensors()]
    named += [("outputs" + name, record) for name, record in node.output_tensors()]
    return {
        name: [
            _number(record.stats.mean),
            _number(record.stats.std),
            _number(record.stats.min),
            _number(record.stats.max),
        ]
        for name, record in named
        if record.stats is not None
    }


def _with_statistics(pair: dict[str, Any], a: CallNode, b: CallNode) -> None:
    """A's and B's statistics beside each pair of tensors of a pair's report (``sa``, ``sb``), in full precision: the
    page prints them with as many digits as it takes to tell them apart."""
    stats_a, stats_b = _statistics(a), _statistics(b)
    for diff in (*pair["inputs"], *pair["outputs"]):
        if diff["name_a"] in stats_a and diff["name_b"] in stats_b:
            diff["sa"], diff["sb"] = stats_a[diff["name_a"]], stats_b[diff["name_b"]]


def _unfold_departures(records: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> None:
    """Folded runs of identical blocks (``r``) keep only blocks in which every call agrees and has a counterpart: a
    block holding a departure (or a call only one trace has) stands alone, never under "identical blocks"."""
    troubled = [False] * len(records)
    for k in range(len(records) - 1, -1, -1):  # children come after their parent: bottom up
        record = records[k]
        pair = pairs[record["d"]] if "d" in record else None
        own = "x" in record or (pair is not None and (pair["status"] == "diverged" or not pair["inputs_agree"]))
        troubled[k] = troubled[k] or own
        if record["u"] >= 0 and troubled[k]:
            troubled[record["u"]] = True
    for record in records:
        runs = record.get("r")
        if not runs:
            continue
        quiet = []
        for start, stop in runs:
            begin = start
            for position in range(start, stop + 1):
                if position == stop or troubled[record["c"][position]]:
                    if position - begin > 1:
                        quiet.append([begin, position])
                    begin = position + 1
        if quiet:
            record["r"] = quiet
        else:
            del record["r"]


def _distinct_names(a: str, b: str) -> tuple[str, str]:
    """The two labels (trace directories) by as few of their last path components as tell them apart:
    ``original vs port`` for ``runs/original`` and ``runs/port``; ``a/trace vs b/trace``."""
    parts_a, parts_b = a.replace("\\", "/").rstrip("/").split("/"), b.replace("\\", "/").rstrip("/").split("/")
    for count in range(1, max(len(parts_a), len(parts_b)) + 1):
        short_a, short_b = "/".join(parts_a[-count:]), "/".join(parts_b[-count:])
        if short_a != short_b:
            return short_a, short_b
    return a, b


def to_html(subject: Trace | Comparison, *, graph: bool = True, max_boxes: int | None = DEFAULT_MAX_BOXES) -> str:
    """The explorer page of a :class:`Trace` or a :class:`~graphtrace.compare.Comparison`, as a string."""
    if isinstance(subject, Trace):
        return trace_page(subject, graph=graph, max_boxes=max_boxes)
    if not all(hasattr(subject, name) for name in ("a", "b", "calls", "only_in_a", "only_in_b", "to_json")):
        raise InvalidOptionError(
            f"to_html takes a Trace or a Comparison, got {type(subject).__name__}. Load a saved trace first "
            "(graphtrace.load(path)), or compare two (graphtrace.compare(a, b))."
        )
    return diff_page(subject, graph=graph, max_boxes=max_boxes)


def write_html(
    subject: Trace | Comparison,
    path: str | os.PathLike[str],
    *,
    graph: bool = True,
    max_boxes: int | None = DEFAULT_MAX_BOXES,
) -> Path:
    """Write :func:`to_html` of ``subject`` to ``path``, whole or not at all (:func:`graphtrace.files.write_atomic`)."""
    target = Path(path)
    text = to_html(subject, graph=graph, max_boxes=max_boxes)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(
            f"cannot write the page to {str(target)!r}: {exc.strerror or exc}. Choose a path you can write to."
        ) from exc
    return write_atomic(target, text)


# -- notebooks --------------------------------------------------------------------------------------------------------

_NOTEBOOK_STYLE = (
    "font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:13px;line-height:1.45;color:#222"
)


def _row(key: str, value: str) -> str:
    return f'<tr><th style="text-align:left;padding-right:1em;font-weight:600">{key}</th><td>{value}</td></tr>'


def trace_summary_html(trace: Trace, *, graph: bool = True) -> str:
    """A compact notebook view of ``trace``: what it holds, fx coverage, and the call graph inline (no links, no
    script)."""
    meta = trace.meta
    calls = sum(1 for _ in trace.walk())
    modules = sum(1 for node in trace.walk() if node.kind == "module")
    coverage = trace.coverage()
    rows = [
        _row("model", html.escape(meta.model_class)),
        _row("forward calls", str(len(trace.steps))),
        _row("calls", f"{calls} ({modules} module calls)"),
        _row("captured with", html.escape(meta.strategy) + (", ops recorded" if meta.ops else "")),
        _row(
            "coverage",
            f'<span title="{html.escape(coverage.summary())}">{html.escape(coverage.in_words())}</span>',
        ),
        _row("values", html.escape(meta.values)),
    ]
    if trace.directory:
        rows.append(_row("saved in", f"<code>{html.escape(trace.directory)}</code>"))
    failed = trace.failed_call()
    if failed is not None:
        rows.append(
            _row(
                "raised",
                f'<span style="color:#8b0000">{html.escape(failed.id)}: {html.escape(failed.error or "")}</span>',
            )
        )
    bad = trace.first_nonfinite()
    if bad is not None:
        rows.append(_row("first NaN/Inf", f'<span style="color:#d62728">{html.escape(bad.id)}</span>'))
    picture = ""
    if graph and trace.steps:
        svg, note = _graph_or_note(trace, True, DEFAULT_MAX_BOXES)
        if svg is not None:
            svg = _LINKS.sub("", svg)
            picture = f'<div style="max-height:560px;overflow:auto;border:1px solid #ddd;margin-top:6px">{svg}</div>'
        else:
            picture = f'<div style="color:#6b6b6b">{html.escape(note)}</div>'
    return (
        f'<div class="graphtrace-trace" style="{_NOTEBOOK_STYLE}"><b>graphtrace Trace</b>'
        f"<table>{''.join(rows)}</table>{picture}</div>"
    )


def comparison_summary_html(comparison: Comparison, *, limit: int = 20) -> str:
    """A compact notebook view of a comparison: the verdict, the first divergence, the diverging calls."""
    first = comparison.first_divergence
    diverged = [call for call in comparison.calls if call.status == "diverged" or not call.inputs_agree]
    verdict = (
        '<span style="color:#2b7a2b;font-weight:600">equal within tolerance</span>'
        if not diverged
        else f'<span style="color:#d62728;font-weight:600">{len(diverged)} matched calls diverge</span>'
    )
    rows = [
        _row("A (reference)", f"<code>{html.escape(comparison.a_label)}</code>"),
        _row("B", f"<code>{html.escape(comparison.b_label)}</code>"),
        _row("verdict", verdict),
        _row(
            "calls",
            f"{len(comparison.calls)} matched, {len(comparison.only_in_a)} only in A, "
            f"{len(comparison.only_in_b)} only in B",
        ),
    ]
    if first is not None:
        rows.append(
            _row(
                "first divergence",
                f"<code>{html.escape(first.a.id)}</code> ↔ <code>{html.escape(first.b.id)}</code>"
                f"<br>{html.escape(first.reason)}",
            )
        )
    table = ""
    if diverged:
        head = "".join(f'<th style="text-align:left;padding:2px 8px">{h}</th>' for h in ("A", "B", "status", "why"))
        body = "".join(
            "<tr"
            + (' style="background:#fde2e1"' if call is first else "")
            + ">"
            + "".join(
                f'<td style="padding:2px 8px">{html.escape(cell)}</td>'
                for cell in (
                    call.a.id,
                    call.b.id,
                    call.status if call.inputs_agree else f"{call.status} (inputs differ)",
                    call.reason,
                )
            )
            + "</tr>"
            for call in diverged[:limit]
        )
        more = f"<div>... and {len(diverged) - limit} more</div>" if len(diverged) > limit else ""
        table = f'<table style="margin-top:6px;border-collapse:collapse"><tr>{head}</tr>{body}</table>{more}'
    return (
        f'<div class="graphtrace-comparison" style="{_NOTEBOOK_STYLE}"><b>graphtrace Comparison</b>'
        f"<table>{''.join(rows)}</table>{table}</div>"
    )
