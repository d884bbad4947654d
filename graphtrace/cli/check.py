"""``graphtrace check TARGET ORIGINAL``: every module of a live port run alone on the original's inputs.

TARGET builds the port as ``graphtrace capture`` takes it (``file.py:function`` returning ``(model, inputs)``);
ORIGINAL is the original's trace, captured with full values on the same inputs. Exit codes as ``diff``'s: 0 when no
module departs, 1 when one does, 2 on bad input; 3 as ``capture``'s when the port or its factory raises (its own
error first). The table is printed through rich as ``diff`` prints its own.
"""

from __future__ import annotations

import argparse
import json
import sys

from graphtrace.cli import EXIT_DIFFERENT, EXIT_OK
from graphtrace.cli.capture import built_by
from graphtrace.cli.diff import add_comparison_options, add_report_options, console
from graphtrace.cli.user_errors import add_traceback_option


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "check",
        help="run every module of a port alone on the original's inputs and name each one that departs",
        description=(
            "Run the port that TARGET builds once, pair its modules with the original's, then run each module "
            "alone on the inputs the original's module was given and compare its output with the original's: every "
            "module whose own code departs is named, however many there are. TARGET is 'package.module:function' or "
            "'path/to/file.py:function' returning (model, inputs), as for capture. ORIGINAL is the original's trace "
            "directory, captured with --values bundle or safetensors on the same inputs. Exit code 0: no module "
            "departs, 1: some module does, 2: bad input, 3: the port or its factory raised."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="module:function or file.py:function returning (port, inputs)")
    parser.add_argument("original", metavar="ORIGINAL", help="the original's trace, with full values")
    add_comparison_options(parser, a="the original's", b="the port's")
    add_report_options(
        parser,
        every="list every module and every reason a module was skipped",
        page="also write the modules' local verdicts as the diff's HTML page: both call trees side by side, "
        "departing modules coloured",
    )
    add_traceback_option(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphtrace.check import check, checked_options, reference_trace

    # a bad option, a missing trace or one without values: said before the port is built
    rules, rtol, atol = checked_options(args.rules, args.rtol, args.atol)
    original, _ = reference_trace(args.original)
    port, inputs = built_by(args.target)
    report = check(port, inputs, original, rules=rules, rtol=rtol, atol=atol)
    if args.html:
        from graphtrace.render.html import write_html

        page = write_html(report.as_comparison(), args.html)
        print(f"wrote {page}", file=sys.stderr)
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=1, allow_nan=False)
        print()
    else:
        from graphtrace.check.text import report_text

        console().print(report_text(report, show_all=args.show_all))
    return EXIT_OK if report.equal else EXIT_DIFFERENT
