"""The house's layers: which room lies on which floor, what each owns, and the picture of it in docs/.

``LAYERS`` is what tests/test_architecture.py enforces; ``python -m tests.layers`` draws the rooms and the imports
between them (read from the source) into docs/layers.dot and docs/layers.svg, through graphtrace's own Graphviz
runner. tests/test_architecture.py checks that the committed DOT is the one the source draws today.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ROOMS: tuple[tuple[tuple[str, str], ...], ...] = (
    (
        ("graphtrace.errors", "the error types, each naming the problem and the remedy"),
        ("graphtrace.version", "the version string"),
    ),
    (
        ("graphtrace.reprs", "torch-free text rules shared by every layer (names, sizes, print options)"),
        ("graphtrace.files", "files written whole or not at all"),
        ("graphtrace.progress", "the progress line on a terminal"),
    ),
    (("graphtrace.model", "the data model: calls, tensors, traces, fx coverage; torch-free, imports nothing above"),),
    (
        ("graphtrace.engine", "capture: the recorder, eager and fx engines, the op tier, statistics"),
        ("graphtrace.io", "trace files: the transformers format, graphtrace's own, tensor values"),
        ("graphtrace.render", "pictures: the call graph (Graphviz) and the explorer page"),
        ("graphtrace.compare", "two traces apart: alignment, measures, the divergence, the report"),
        ("graphtrace.coverage", "fallback reasons worded for messages"),
    ),
    (
        ("graphtrace.demo", "the built-in demo transformer"),
        ("graphtrace.saving", "a trace's files, then its call graph beside them (io + render)"),
    ),
    (
        ("graphtrace.conveniences", "save, load, compare, first_nonfinite at the top; the data model's services"),
        ("graphtrace.api", "capture() and tracing(): options checked, engine, sinks and writers wired"),
    ),
    (
        ("graphtrace.compat", "model_addition_debugger_context, transformers' files exactly"),
        ("graphtrace.check", "every module of a live port run alone on the original's inputs"),
    ),
    (("graphtrace.cli", "the graphtrace command: demo, capture, show, render, view, diff, check"),),
    (
        ("graphtrace", "the public names, imported lazily"),
        ("graphtrace.__main__", "python -m graphtrace"),
    ),
)
"""Floors, lowest first; each room with the one line of what it owns."""

LAYERS: tuple[tuple[str, ...], ...] = tuple(tuple(room for room, _ in floor) for floor in ROOMS)


def room_graph() -> dict[str, set[str]]:
    """Room -> the rooms it imports (module imports folded into their rooms)."""
    from tests.test_architecture import GRAPH, room_of

    edges: dict[str, set[str]] = {room: set() for floor in LAYERS for room in floor}
    for module, targets in GRAPH.items():
        source = room_of(module)[1]
        edges[source].update(room_of(target)[1] for target in targets if room_of(target)[1] != source)
    return edges


def to_dot() -> str:
    """The picture's DOT source: one row per floor (top floor first), a box per room with what it owns."""
    owns = {room: text for floor in ROOMS for room, text in floor}
    lines = [
        "digraph layers {",
        '  graph [rankdir=TB, nodesep=0.25, ranksep=0.45, fontname="Helvetica", fontsize=11, labelloc=b, '
        'label="Imports point down. The two bottom floors serve every room: their arrows are left out."];',
        '  node [shape=box, style="rounded,filled", fillcolor="#f5f7fa", color="#8090a0", fontname="Helvetica", '
        "fontsize=10];",
        '  edge [color="#9aa8b8", arrowsize=0.6];',
    ]
    for level, floor in reversed(list(enumerate(LAYERS))):
        lines.append(f"  subgraph floor_{level} {{ rank=same;")
        for room in floor:
            name = room.removeprefix("graphtrace.") if room != "graphtrace" else "graphtrace (package)"
            label = f"{name}\\n{owns[room]}".replace('"', "'")
            lines.append(f'    "{room}" [label="{label}"];')
        lines.append("  }")
    foundation = {room for floor in LAYERS[:2] for room in floor}  # every room may use these: their edges are left out
    for source, targets in sorted(room_graph().items()):
        lines += [f'  "{source}" -> "{target}";' for target in sorted(targets - foundation)]
    for upper, lower in ((LAYERS[2], LAYERS[1]), (LAYERS[1], LAYERS[0])):  # keep the foundation at the bottom
        lines += [f'  "{upper[0]}" -> "{room}" [style=invis];' for room in lower]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    from graphtrace.files import write_atomic
    from graphtrace.render.dot import render_dot_file

    source = write_atomic(ROOT / "docs" / "layers.dot", to_dot())
    render_dot_file(source, ROOT / "docs" / "layers.svg", "svg")
    print(f"wrote {source} and docs/layers.svg")
    return 0


if __name__ == "__main__":
    sys.exit(main())
