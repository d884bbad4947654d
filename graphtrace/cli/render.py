"""``graphtrace render TRACE``: draw the call graph of a saved trace, without the model."""

from __future__ import annotations

import argparse
from pathlib import Path

from graphtrace.render import DEFAULT_MAX_BOXES, FORMATS, GRAPH_SUFFIX, boxes, call_graph, write_graph


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "render",
        help="draw the call graph of a saved trace (SVG, PNG, PDF or DOT)",
        description=(
            "Draw the call graph of a trace directory written by graphtrace or by transformers: calls as boxes, "
            "nesting as clusters, data flow as arrows. Identical repeated blocks are folded, and without --depth "
            "the graph is cut at the deepest level that fits --max-boxes. Needs Graphviz's dot for pictures; "
            "the .dot source is always written beside the picture."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (or one of its JSON files)")
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help=f"picture to write, by its suffix: {', '.join(FORMATS)} (default: TRACE/{{Class}}{GRAPH_SUFFIX}.svg)",
    )
    parser.add_argument("--depth", type=int, default=None, help="draw calls down to this depth (root = 0)")
    parser.add_argument(
        "--focus",
        metavar="PATH",
        default=None,
        help="draw only this call's subtree, e.g. model.layers.3 (add @N for its N-th call)",
    )
    parser.add_argument("--unfold", action="store_true", help="draw every repeated block instead of folding them")
    parser.add_argument("--step", type=int, default=-1, help="which top-level forward call to draw (default: last)")
    parser.add_argument(
        "--max-boxes",
        type=int,
        default=DEFAULT_MAX_BOXES,
        help=f"box budget when --depth is not given (default: {DEFAULT_MAX_BOXES}; 0: no budget)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphtrace.io import load_trace

    trace = load_trace(args.trace)
    graph = call_graph(
        trace,
        step=args.step,
        depth=args.depth,
        focus=args.focus,
        unfold=args.unfold,
        max_boxes=args.max_boxes or None,
    )
    assert trace.directory is not None
    output = Path(args.output) if args.output else Path(trace.directory) / f"{trace.meta.model_class}{GRAPH_SUFFIX}.svg"
    written = write_graph(graph, output)
    depth = graph.graph["depth"]
    cut = f", cut at depth {depth}" if depth is not None else ""
    print(f"graphtrace render: {len(boxes(graph))} boxes of {graph.graph['calls']} calls{cut}")
    for path in written:
        print(f"wrote {path}")
    return 0
