"""DiGraph -> Graphviz: DOT source with pydot (pure, so it can be golden-tested), and files through Graphviz's ``dot``.

Clusters are the calls whose children are drawn; boxes are the rest. An edge into or out of a cluster is anchored on
the cluster's first or last box and clipped at the cluster's border (``lhead``/``ltail``), and is left out where a
more specific edge already shows the same flow (``embed -> layers.0`` when ``embed -> layers.0.input_norm`` is
drawn). A legend says how calls are marked.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import networkx as nx
import pydot

from graphtrace.errors import GraphvizFailedError, GraphvizNotFoundError, InvalidOptionError

__all__ = ["FORMATS", "INSTALL_HINT", "render_dot_file", "to_dot", "write_graph"]

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": None}
"""Output suffixes and the Graphviz format each is rendered in (``.dot``: the source only)."""

INSTALL_HINT = (
    "install Graphviz (Debian/Ubuntu: `sudo apt-get install -y graphviz`; macOS: `brew install graphviz`; "
    "conda: `conda install graphviz`)"
)

FONT = "Helvetica"
INK, MUTED, FAINT = "#333333", "#6b6b6b", "#9a9a9a"
RED, RED_FILL, DARK_RED, ORANGE = "#d62728", "#fde2e1", "#8b0000", "#e07b00"
COLLAPSED_FILL, FOLDED_FILL, FOLDED_BORDER = "#ececec", "#e3edf9", "#4a78b0"
CLUSTER_FILLS = ("#f7f7f7", "#eeeeee")
_LEFT_BREAK = '<BR ALIGN="LEFT"/>'  # ends a left-aligned line of a cluster label


def to_dot(graph: nx.DiGraph) -> str:
    """The DOT source of a graph made by :func:`graphtrace.render.call_graph`."""
    dot = pydot.Dot(
        "call_graph",
        graph_type="digraph",
        compound="true",
        rankdir="TB",
        nodesep="0.25",
        ranksep="0.3",
        fontname=FONT,
        fontsize="12",
        fontcolor=INK,
        labelloc="b",
        labeljust="l",
        label=_caption(graph.graph),
    )
    dot.set_node_defaults(
        shape="box", style="rounded,filled", fillcolor="white", color=INK, fontname=FONT, fontsize="10",
        fontcolor=INK, margin="0.1,0.04", height="0.3",
    )
    dot.set_edge_defaults(color="#555555", arrowsize="0.6", penwidth="0.9")
    members: dict[Hashable, list[Hashable]] = {}
    for node, parent in graph.nodes(data="parent"):
        members.setdefault(parent, []).append(node)
    _add_members(dot, graph, members, None, 0)
    first, last = _anchors(graph)
    for tail, head, data in _drawn_edges(graph):
        attributes: dict[str, str] = {}
        if data["inferred"]:
            attributes.update(style="dashed", color=FAINT)
        if graph.nodes[tail]["cluster"]:
            attributes["ltail"] = f"cluster_{tail}"
        if graph.nodes[head]["cluster"]:
            attributes["lhead"] = f"cluster_{head}"
        dot.add_edge(pydot.Edge(str(last.get(tail, tail)), str(first.get(head, head)), **attributes))
    return dot.to_string()


def _add_members(
    container: pydot.Dot | pydot.Cluster,
    graph: nx.DiGraph,
    members: Mapping[Hashable, list[Hashable]],
    parent: Hashable,
    level: int,
) -> None:
    """Declare the nodes and clusters inside ``parent``, in reverse call order: dot lays out a cluster's members
    right to left in the order they are declared (Graphviz 2.43), so that calls read left to right."""
    for node in reversed(members.get(parent, [])):
        data = graph.nodes[node]
        if data["cluster"]:
            cluster = pydot.Cluster(str(node), **_cluster_style(data, level))
            container.add_subgraph(cluster)
            _add_members(cluster, graph, members, node, level + 1)
        else:
            container.add_node(pydot.Node(str(node), **_box_style(data)))


def write_graph(graph: nx.DiGraph, path: str | os.PathLike[str]) -> list[Path]:
    """Write ``graph`` to ``path`` (``.svg``, ``.png``, ``.pdf`` or ``.dot``); the DOT source is always written too,
    beside it, first. Returns the files written. Raises :class:`GraphvizNotFoundError` when ``dot`` is missing (the
    DOT source is there by then)."""
    target = Path(path)
    output_format = _output_format(target)
    source = target.with_suffix(".dot")
    source.write_text(to_dot(graph), encoding="utf-8")
    if output_format is None:
        return [source]
    render_dot_file(source, target, output_format)
    return [source, target]


def render_dot_file(source: Path, target: Path, output_format: str) -> None:
    """Run Graphviz's ``dot`` on the DOT file ``source``, writing ``target`` in ``output_format``."""
    program = shutil.which("dot")
    if program is None:
        raise GraphvizNotFoundError(
            f"Graphviz's `dot` program is not on PATH, so {target.name} could not be drawn; its DOT source is in "
            f"{source}. To get the picture, {INSTALL_HINT}, then run `graphtrace render` on the trace again."
        )
    result = subprocess.run(
        [program, f"-T{output_format}", str(source), "-o", str(target)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()
        raise GraphvizFailedError(
            f"Graphviz's dot could not draw {source} (exit code {result.returncode}: "
            f"{message[-1] if message else 'no message'}); the DOT source is kept for inspection."
        )


def _output_format(target: Path) -> str | None:
    suffix = target.suffix.lower()
    if suffix not in FORMATS:
        raise InvalidOptionError(
            f"cannot tell the picture format from {target.name!r}: end the file name with "
            f"{', '.join(FORMATS)}."
        )
    return FORMATS[suffix]


# -- what is drawn ----------------------------------------------------------------------------------------------------


def _parents(graph: nx.DiGraph, node: Hashable) -> Iterator[Hashable]:
    """``node`` and the clusters around it, innermost first."""
    while node is not None:
        yield node
        node = graph.nodes[node]["parent"]


def _anchors(graph: nx.DiGraph) -> tuple[dict[Hashable, Hashable], dict[Hashable, Hashable]]:
    """Each cluster's first and last box in call order: where edges into and out of it are attached."""
    first: dict[Hashable, Hashable] = {}
    last: dict[Hashable, Hashable] = {}
    for node, cluster in graph.nodes(data="cluster"):
        if cluster:
            continue
        for enclosing in _parents(graph, graph.nodes[node]["parent"]):
            first.setdefault(enclosing, node)
            last[enclosing] = node
    return first, last


def _drawn_edges(graph: nx.DiGraph) -> list[tuple[Hashable, Hashable, Mapping[str, Any]]]:
    """The edges worth drawing: an edge is left out when an edge between the same clusters' contents (or one of the
    two ends itself) already shows it; recorded flow is only ever replaced by recorded flow."""
    covered: set[tuple[Hashable, Hashable, bool]] = set()
    for tail, head, inferred in graph.edges(data="inferred"):
        for outer_tail in _parents(graph, tail):
            for outer_head in _parents(graph, head):
                if (outer_tail, outer_head) != (tail, head):
                    covered.add((outer_tail, outer_head, True))
                    if not inferred:
                        covered.add((outer_tail, outer_head, False))
    return [(t, h, data) for t, h, data in graph.edges(data=True) if (t, h, data["inferred"]) not in covered]


# -- labels and styles ------------------------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _tensor_text(outputs: tuple[tuple[str, tuple[int, ...], str], ...]) -> str:
    """``[1, 12, 64] float32``; ``2 × [1, 7, 8] float32`` for equal tensors; ``logits: [...] ... +1 more``."""
    if not outputs:
        return ""
    key, shape, dtype = outputs[0]
    text = f"[{', '.join(map(str, shape))}] {dtype.removeprefix('torch.')}"
    if len(outputs) > 1 and all(other[1:] == (shape, dtype) for other in outputs):
        return f"{len(outputs)} × {text}"
    if key:
        text = f"{key}: {text}"
    return text + (f" +{len(outputs) - 1} more" if len(outputs) > 1 else "")


def _marks(data: Mapping[str, Any]) -> list[str]:
    """The lines that flag a call: non-finite outputs, an error, an eager fallback (own or inside)."""
    lines = []
    if data["nan"] or data["inf"]:
        lines.append(f'<FONT COLOR="{RED}"><B>NaN {data["nan"]} · Inf {data["inf"]}</B></FONT>')
    if data["nonfinite_inside"]:
        lines.append(f'<FONT COLOR="{RED}">NaN/Inf in {data["nonfinite_inside"]} calls inside</FONT>')
    if data["error"]:
        error = data["error"] if len(data["error"]) <= 48 else data["error"][:45] + "..."
        lines.append(f'<FONT COLOR="{DARK_RED}"><B>raised</B> {_escape(error)}</FONT>')
    if data["fallback"] is not None:
        lines.append(f'<FONT COLOR="{ORANGE}">eager fallback</FONT>')
    if data["fallbacks_inside"]:
        lines.append(f'<FONT COLOR="{ORANGE}">{data["fallbacks_inside"]} eager fallbacks inside</FONT>')
    return lines


def _tooltip(data: Mapping[str, Any]) -> str:
    lines = [data["path"]]
    if data.get("context"):
        return "\\n".join([*lines, "outside the focus"])
    if data["repeat"] > 1:
        lines.append(f"{data['repeat']} identical blocks drawn as one")
    lines.append(f"captured: {data['strategy']}")
    if data["fallback"] is not None:
        lines.append(f"eager fallback: {data['fallback']}")
    if data["error"]:
        lines.append(f"raised {data['error']}")
    return "\\n".join(line.replace("\\", "\\\\").replace('"', "'") for line in lines)


def _type_text(data: Mapping[str, Any]) -> str:
    return data["type_name"] + (f" ×{data['repeat']}" if data["repeat"] > 1 else "")


def _box_style(data: Mapping[str, Any]) -> dict[str, str]:
    if data["context"]:
        type_line = f"<BR/>{_escape(data['type_name'])}" if data["type_name"] else ""
        return {
            "label": f"<{_escape(data['name'])}{type_line}>",
            "style": "rounded,dashed",
            "color": FAINT,
            "fontcolor": MUTED,
            "tooltip": _tooltip(data),
        }
    lines = [f"<B>{_escape(data['name'])}</B>"]
    if data["type_name"]:
        lines.append(f'<FONT COLOR="{MUTED}">{_escape(_type_text(data))}</FONT>')
    if data["outputs"]:
        lines.append(_escape(_tensor_text(data["outputs"])))
    if data["calls_inside"]:
        lines.append(f'<FONT COLOR="{MUTED}"><I>+{data["calls_inside"]} calls inside</I></FONT>')
    lines += _marks(data)
    style: dict[str, str] = {"label": f"<{'<BR/>'.join(lines)}>", "tooltip": _tooltip(data)}
    if data["kind"] == "op":
        style["shape"] = "ellipse"
        style["style"] = "filled"
    if data["calls_inside"]:
        style["fillcolor"] = COLLAPSED_FILL
    if data["repeat"] > 1:
        style.update(fillcolor=FOLDED_FILL, color=FOLDED_BORDER, penwidth="1.5")
    style.update(_mark_style(data))
    return style


def _mark_style(data: Mapping[str, Any]) -> dict[str, str]:
    """Border and fill for a flagged call; an error outranks NaN/Inf, which outranks a fallback."""
    if data["error"]:
        return {"color": DARK_RED, "penwidth": "2.5"}
    if data["nan"] or data["inf"] or data["nonfinite_inside"]:
        return {"color": RED, "fillcolor": RED_FILL, "penwidth": "2"}
    if data["fallback"] is not None or data["fallbacks_inside"]:
        return {"color": ORANGE, "penwidth": "2", "style": "rounded,filled,dashed"}
    return {}


def _cluster_style(data: Mapping[str, Any], level: int) -> dict[str, str]:
    heading = f"<B>{_escape(data['name'])}</B>"
    if data["type_name"] and data["type_name"] != data["name"]:
        heading += f'  <FONT COLOR="{MUTED}">{_escape(_type_text(data))}</FONT>'
    if data["outputs"]:
        heading += f"  → {_escape(_tensor_text(data['outputs']))}"
    lines = [heading, *_marks(data)]
    style = {
        "label": f"<{_LEFT_BREAK.join(lines)}>",
        "tooltip": _tooltip(data),
        "style": "rounded,filled",
        "fillcolor": CLUSTER_FILLS[level % 2],
        "color": "#b3b3b3",
        "fontsize": "10",
        "labeljust": "l",
        "labelloc": "t",
        "margin": "8",
    }
    if data["repeat"] > 1:
        style.update(fillcolor=FOLDED_FILL, color=FOLDED_BORDER, penwidth="1.5")
    style.update(_mark_style(data))
    return style


def _caption(meta: Mapping[str, Any]) -> str:
    """What is drawn and how calls are marked, below the graph (a label takes no room between the calls)."""
    step = f"step {meta['step']} of {meta['steps']}" if meta["steps"] > 1 else "one forward call"
    title = f"<B>{_escape(meta['model_class'])}</B>  ·  {step}  ·  {meta['calls']} calls  ·  capture: {meta['strategy']}"
    notes = []
    if meta["focus"]:
        notes.append(f"focus on {_escape(meta['focus'])}")
    if meta["depth"] is not None:
        why = f" (the deepest that fits {meta['max_boxes']} boxes)" if meta["auto_depth"] else ""
        notes.append(f"depth ≤ {meta['depth']}{why}")
    notes.append("identical repeated blocks folded" if meta["folded"] else "every block drawn")
    legend = [
        ("<B>name</B><BR/>Class<BR/>[shape] dtype", f"a call: short name, module class,{_LEFT_BREAK}output shape and dtype{_LEFT_BREAK}",
         {"bgcolor": "white"}),
        ("<I>+N calls inside</I>", "calls below the depth limit", {"bgcolor": COLLAPSED_FILL}),
        ("Class ×N", "N identical repeated blocks drawn once", {"bgcolor": FOLDED_FILL, "color": FOLDED_BORDER}),
        (f'<FONT COLOR="{RED}"><B>NaN · Inf</B></FONT>', "output holds NaN or Inf", {"bgcolor": RED_FILL, "color": RED}),
        (f'<FONT COLOR="{ORANGE}">eager fallback</FONT>', "torch.fx could not trace it", {"color": ORANGE}),
        (f'<FONT COLOR="{DARK_RED}"><B>raised</B></FONT>', "the call raised an exception", {"color": DARK_RED}),
        ("───▶", "data flow: an output fed an input", {}),
        (f'<FONT COLOR="{FAINT}">- - -▶</FONT>', f"inferred from call order:{_LEFT_BREAK}computed between module calls{_LEFT_BREAK}", {}),
    ]
    cells = []
    for sample, meaning, attributes in legend:
        extra = "".join(f' {key.upper()}="{value}"' for key, value in attributes.items())
        cells.append(f'<TD{extra}>{sample}</TD><TD BORDER="0" ALIGN="LEFT">{meaning}</TD>')
    half = (len(cells) + 1) // 2
    rows = "".join(f"<TR>{left}{right}</TR>" for left, right in zip(cells[:half], cells[half:] + [""]))
    return (
        '<<FONT POINT-SIZE="10"><TABLE BORDER="0" CELLBORDER="1" CELLSPACING="3" CELLPADDING="3">'
        f'<TR><TD COLSPAN="4" BORDER="0" ALIGN="LEFT"><FONT POINT-SIZE="12">{title}</FONT></TD></TR>'
        f'<TR><TD COLSPAN="4" BORDER="0" ALIGN="LEFT"><FONT POINT-SIZE="10" COLOR="{MUTED}">'
        f'{"  ·  ".join(notes)}</FONT></TD></TR>'
        f"{rows}</TABLE></FONT>>"
    )
