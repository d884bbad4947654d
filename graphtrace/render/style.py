"""How the call graph looks: labels, colours, marks and the caption with its legend, as Graphviz HTML-like labels.

A box shows a call's short name, module class, output shape and dtype; marks (NaN/Inf, an error) add a line and
colour the border. A call torch.fx did not serve is no fault: it is recorded by wrapping forward, as transformers
records every call, and says so in a muted line and a dashed grey border, the reason in its tooltip. Clusters carry
the same heading on one line. The caption under the graph says what is drawn (step, depth, focus, folding) and how
calls are marked.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from graphtrace.model import WRAPPED, fallback_in_words

__all__ = [
    "BOX_DEFAULTS",
    "EDGE_DEFAULTS",
    "GRAPH_STYLE",
    "INFERRED_EDGE",
    "box_style",
    "caption",
    "cluster_style",
]

FONT = "Helvetica"
INK, MUTED, FAINT = "#333333", "#6b6b6b", "#9a9a9a"
RED, RED_FILL, DARK_RED = "#d62728", "#fde2e1", "#8b0000"
COLLAPSED_FILL, FOLDED_FILL, FOLDED_BORDER = "#ececec", "#e3edf9", "#4a78b0"
CLUSTER_FILLS = ("#f7f7f7", "#eeeeee")
_LEFT_BREAK = '<BR ALIGN="LEFT"/>'  # ends a left-aligned line of a cluster label

GRAPH_STYLE = {
    "rankdir": "TB",
    "newrank": "true",  # rank across clusters: without it dot set 16 unfolded layers side by side, edges upwards
    "nslimit": "2",  # bounds the placement's network simplex: 324 boxes took 3.0 s unbounded, 0.17 s so
    "nodesep": "0.25",
    "ranksep": "0.3",
    "fontname": FONT,
    "fontsize": "12",
    "fontcolor": INK,
    "labelloc": "b",  # the caption: below the graph, where its height costs no room between calls
    "labeljust": "l",
}
BOX_DEFAULTS = {
    "shape": "box",
    "style": "rounded,filled",
    "fillcolor": "white",
    "color": INK,
    "fontname": FONT,
    "fontsize": "10",
    "fontcolor": INK,
    "margin": "0.1,0.04",
    "height": "0.3",
}
EDGE_DEFAULTS = {"color": "#555555", "arrowsize": "0.6", "penwidth": "0.9"}
INFERRED_EDGE = {"style": "dashed", "color": FAINT}


def _escape(text: str) -> str:
    """``text`` inside an HTML-like label: markup escaped, and backslashes doubled, since Graphviz still expands
    ``\\N``, ``\\G``, ``\\L`` ... there (a module named ``\\N`` would show another name)."""
    return html.escape(text, quote=False).replace("\\", "\\\\")


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
        lines.append(f'<FONT COLOR="{MUTED}">wrapped forward</FONT>')
    if data["fallbacks_inside"]:
        lines.append(f'<FONT COLOR="{MUTED}">{data["fallbacks_inside"]} wrapped inside</FONT>')
    return lines


def _tooltip(data: Mapping[str, Any]) -> str:
    lines = [data["path"]]
    if data.get("context"):
        return "\\n".join([*lines, "outside the focus"])
    if data["repeat"] > 1:
        lines.append(f"{data['repeat']} identical blocks drawn as one")
    lines.append(f"captured: {data['strategy']}")
    if data["fallback"] is not None:
        lines.append(f"{WRAPPED}: {fallback_in_words(data['fallback'])} (why: {data['fallback']})")
    if data["error"]:
        lines.append(f"raised {data['error']}")
    return "\\n".join(line.replace("\\", "\\\\").replace('"', "'").replace("\n", " ") for line in lines)


def _type_text(data: Mapping[str, Any]) -> str:
    return str(data["type_name"]) + (f" ×{data['repeat']}" if data["repeat"] > 1 else "")


def box_style(data: Mapping[str, Any]) -> dict[str, str]:
    """DOT attributes of a box, from the attributes of its node in the call graph."""
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
    """Border and fill for a flagged call; an error outranks NaN/Inf, which outranks a call recorded by wrapping
    forward (a grey dashed border: a note, not an alarm)."""
    if data["error"]:
        return {"color": DARK_RED, "penwidth": "2.5"}
    if data["nan"] or data["inf"] or data["nonfinite_inside"]:
        return {"color": RED, "fillcolor": RED_FILL, "penwidth": "2"}
    if data["fallback"] is not None or data["fallbacks_inside"]:
        return {"color": FAINT, "style": "rounded,filled,dashed"}
    return {}


def cluster_style(data: Mapping[str, Any], level: int) -> dict[str, str]:
    """DOT attributes of a cluster; nested clusters alternate two greys so that their borders stay visible."""
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


def caption(meta: Mapping[str, Any]) -> str:
    """What is drawn and how calls are marked, below the graph (a label takes no room between the calls)."""
    step = f"step {meta['step']} of {meta['steps']}" if meta["steps"] > 1 else "one forward call"
    title = f"<B>{_escape(meta['model_class'])}</B>  ·  {step}  ·  {meta['calls']} calls"
    title += f"  ·  capture: {_escape(meta['strategy'])}"
    notes = []
    if meta["focus"]:
        notes.append(f"focus on {_escape(meta['focus'])}")
    if meta["depth"] is not None:
        why = f" (the deepest that fits {meta['max_boxes']} boxes)" if meta["auto_depth"] else ""
        notes.append(f"depth ≤ {meta['depth']}{why}")
    notes.append("identical repeated blocks folded" if meta["folded"] else "every block drawn")
    legend = [
        (
            "<B>name</B><BR/>Class<BR/>[shape] dtype",
            f"a call: short name, module class,{_LEFT_BREAK}output shape and dtype{_LEFT_BREAK}",
            {"bgcolor": "white"},
        ),
        ("<I>+N calls inside</I>", "calls below the depth limit", {"bgcolor": COLLAPSED_FILL}),
        ("Class ×N", "N identical repeated blocks drawn once", {"bgcolor": FOLDED_FILL, "color": FOLDED_BORDER}),
        (
            f'<FONT COLOR="{RED}"><B>NaN · Inf</B></FONT>',
            "output holds NaN or Inf",
            {"bgcolor": RED_FILL, "color": RED},
        ),
        (
            f'<FONT COLOR="{MUTED}">wrapped forward</FONT>',
            f"recorded by wrapping forward,{_LEFT_BREAK}not verified by torch.fx (hover: why){_LEFT_BREAK}",
            {"color": FAINT},
        ),
        (f'<FONT COLOR="{DARK_RED}"><B>raised</B></FONT>', "the call raised an exception", {"color": DARK_RED}),
        ("───▶", "data flow: an output fed an input", {}),
        (
            f'<FONT COLOR="{FAINT}">- - -▶</FONT>',
            f"inferred from call order:{_LEFT_BREAK}computed between module calls{_LEFT_BREAK}",
            {},
        ),
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
        f"{'  ·  '.join(notes)}</FONT></TD></TR>"
        f"{rows}</TABLE></FONT>>"
    )
