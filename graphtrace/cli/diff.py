"""``graphtrace diff A B``: compare two saved traces and name the first call where they diverge.

Exit codes: 0 when every matched call agrees within tolerance, 1 when they diverge, 2 on bad input. The table is
printed through rich, as ``show`` prints its tree: coloured on a terminal (rich also honours ``FORCE_COLOR``), plain
text with the same lines for pipes and files and when ``NO_COLOR`` is set; lines are never wrapped or cut by rich.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from rich.console import Console

from graphtrace.cli import EXIT_DIFFERENT, EXIT_OK
from graphtrace.cli.show import LINE_WIDTH


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
    add_comparison_options(parser, a="A's", b="B's")
    parser.add_argument(
        "--align",
        choices=("auto", "path", "structure"),
        default="auto",
        help="match calls by path and rules, then by structure for the rest (auto, the default); by path and "
        "rules only; or by execution order, module kinds and shapes only",
    )
    parser.add_argument("--step", type=int, default=None, help="compare only this top-level call of each trace")
    parser.add_argument("--strict", action="store_true", help="calls without a counterpart count as a divergence")
    add_report_options(
        parser,
        every="list every matched and unmatched call",
        page="also write the comparison as one HTML page: both call trees side by side, diverging calls coloured, "
        "the first divergence selected",
    )
    parser.set_defaults(run=run)


def add_report_options(parser: argparse.ArgumentParser, *, every: str, page: str) -> None:
    """--all, --json and --html, shared by diff and check; ``every`` and ``page`` say what --all and --html do."""
    parser.add_argument("--all", dest="show_all", action="store_true", help=every)
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON instead of a table")
    parser.add_argument("--html", metavar="PAGE", default=None, help=page)


def add_comparison_options(parser: argparse.ArgumentParser, *, a: str, b: str) -> None:
    """--rtol, --atol and --map, shared by diff and check; ``a`` and ``b`` name whose modules a rule renames."""
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
        help=f"rename {a} modules into {b} names, e.g. 'transformer.h.{{i}}=model.layers.{{i}}' (repeatable, "
        "applied in order; names are relative to the model)",
    )


def console(stream: TextIO | None = None) -> Console:
    """A console for ``stream`` (stdout): rich decides whether it is a terminal (FORCE_COLOR makes it one). With
    NO_COLOR set (https://no-color.org) it writes no escape code at all, bold included: the text a pipe gets."""
    plain = os.environ.get("NO_COLOR", "") != ""
    return Console(
        file=stream or sys.stdout,
        markup=False,
        highlight=False,
        emoji=False,
        soft_wrap=True,
        width=LINE_WIDTH,
        color_system=None if plain else "auto",
    )


def run(args: argparse.Namespace) -> int:
    from graphtrace.compare.text import report_text
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
        console().print(report_text(comparison, show_all=args.show_all))
    return EXIT_OK if comparison.equal else EXIT_DIFFERENT
