"""What the command prints when the user's own code raises (the model's forward, the factory that builds it): the
error itself and where the partial trace is, first; then the traceback of the user's code, without the frames of
graphtrace's wrappers and of ``nn.Module.__call__`` between every two module calls (``--traceback`` keeps them all).
"""

from __future__ import annotations

import argparse
import traceback
from pathlib import Path

__all__ = ["add_traceback_option", "describe_user_error", "raised_by_user_code"]

_PACKAGE = Path(__file__).resolve().parent.parent
_PLUMBING = ("/torch/nn/modules/module.py", "<frozen runpy>")  # nn.Module.__call__ (_call_impl), python -m
_NOTE = "graphtrace: "


def _in_package(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(_PACKAGE)


def add_traceback_option(parser: argparse.ArgumentParser) -> None:
    """``--traceback``, for the subcommands that run the user's model (capture, check)."""
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="when the model raises, print the whole traceback (graphtrace's own frames included)",
    )


def raised_by_user_code(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the user's code rather than from a fault of graphtrace's: the innermost frame that
    is not torch's (a torch function raising on the user's behalf) lies outside graphtrace."""
    frames = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    for filename in reversed(frames):
        if "/torch/" in filename.replace("\\", "/"):
            continue
        return not _in_package(filename)
    return False


def _kept(frame: traceback.FrameSummary) -> bool:
    name = frame.filename.replace("\\", "/")
    return not (_in_package(frame.filename) or any(part in name for part in _PLUMBING))


def describe_user_error(exc: BaseException, args: argparse.Namespace) -> str:
    """The report of ``exc``: who raised what, graphtrace's notes (the partial trace's location, the call that
    raised), then the user's frames."""
    notes = [note for note in getattr(exc, "__notes__", ()) if note.startswith(_NOTE)]
    who = "the model" if notes or hasattr(exc, "graphtrace_trace") else getattr(args, "target", "your code")
    message = str(exc).strip()
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    lines = [f"graphtrace {args.command}: {who} raised {head}", *notes, ""]
    lines.append(
        "Traceback of your code (graphtrace's frames and nn.Module.__call__'s left out; --traceback shows all):"
    )
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if _kept(frame)]
    lines += [line.rstrip("\n") for line in traceback.format_list(frames)]
    lines.append(head)
    return "\n".join(lines)
