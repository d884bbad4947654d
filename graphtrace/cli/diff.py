"""``graphtrace diff A B``: compare two saved traces and name the first call where they diverge.

Exit codes: 0 when every matched call agrees within tolerance, 1 when they diverge, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from graphtrace.cli import EXIT_DIFFERENT, EXIT_OK


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="compare two saved traces and name the first call where they diverge",
        description=(
            "Compare trace B against the reference trace A, call by call, and name the first divergent call: the "
            "earliest call whose output diverges while its inputs still agree. A and B are trace directories "
            "written by graphtrace or by transformers' model_addition_debugger_context, with statistics only or "
            "with safetensors files (then full values are compared). Exit code 0: equal within tolerance, "
            "1: they diverge, 2: bad input."
        ),
    )
    parser.add_argument("a", metavar="A", help="the reference trace (directory or one of its JSON files)")
    parser.add_argument("b", metavar="B", help="the trace to check against it")
    parser.add_argument(
        "--rtol", type=float, default=None, help="relative tolerance (default: torch.testing.assert_close's per dtype)"
    )
    parser.add_argument(
        "--atol", type=float, default=None, help="absolute tolerance (default: torch.testing.assert_close's per dtype)"
    )
    parser.add_argument(
        "--map",
        dest="rules",
        metavar="RULE",
        action="append",
        default=[],
        help="rename A's modules into B's names, e.g. 'transformer.h.{i}=model.layers.{i}' (repeatable, applied "
        "in order; names are relative to the model)",
    )
    parser.add_argument(
        "--align",
        choices=("auto", "path", "structure"),
        default="auto",
        help="match calls by path and rules, then by structure for the rest (auto, the default); by path and "
        "rules only; or by execution order, module kinds and shapes only",
    )
    parser.add_argument("--step", type=int, default=None, help="compare only this top-level call of each trace")
    parser.add_argument("--strict", action="store_true", help="calls without a counterpart count as a divergence")
    parser.add_argument("--all", dest="show_all", action="store_true", help="list every matched and unmatched call")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON instead of a table")
    parser.add_argument(
        "--html",
        metavar="PAGE",
        default=None,
        help="also write the comparison as one HTML page: both call trees side by side, diverging calls coloured, "
        "the first divergence selected",
    )
    parser.set_defaults(run=run)


def use_color(stream: object) -> bool:
    """Colour for a terminal, unless NO_COLOR is set (https://no-color.org); plain text for pipes and files."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


def run(args: argparse.Namespace) -> int:
    from graphtrace.conveniences import compare

    comparison = compare(
        args.a,
        args.b,
        rtol=args.rtol,
        atol=args.atol,
        rules=args.rules,
        align=args.align,
        step=args.step,
        strict=args.strict,
    )
    if args.html:
        from graphtrace.render.html import write_html

        page = write_html(comparison, args.html)
        print(f"wrote {page}", file=sys.stderr)
    if args.json:
        json.dump(comparison.to_json(), sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        print(comparison.table(color=use_color(sys.stdout), show_all=args.show_all))
    return EXIT_OK if comparison.equal else EXIT_DIFFERENT
