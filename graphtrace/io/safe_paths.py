"""A trace directory is untrusted input: what a trace may name, and how its files are written.

A trace refers to its value files by relative paths (``./x.safetensors``, ``./X_tensors.safetensors#key``). Read
or copied, such a path must stay inside the trace's own directory once resolved (symlinks included): ``../x``, an
absolute path or a link leading out is refused. Names a trace supplies that become file names (the model's class)
must be plain names. Files are written whole or not at all (:func:`graphtrace.files.write_atomic`, re-exported here),
so a full disk or a killed process never leaves a truncated trace file behind.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from graphtrace.errors import TraceFormatError
from graphtrace.files import write_atomic

__all__ = ["check_model_class", "inside", "write_atomic"]

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,199}")


def inside(directory: str | os.PathLike[str], reference: str) -> Path:
    """The path ``reference`` names in ``directory``, checked to stay inside it; raises TraceFormatError else."""
    base = Path(directory).resolve()
    if not isinstance(reference, str) or not reference or "\x00" in reference or os.path.isabs(reference):
        raise TraceFormatError(
            f"the trace refers to a file {reference!r} that is not a relative path; a trace may reference only "
            "files inside its own directory."
        )
    target = (base / reference).resolve()
    if not target.is_relative_to(base):
        raise TraceFormatError(
            f"the trace refers to {reference!r}, which lies outside its directory {base}; a trace may reference "
            "only files inside its own directory (was it crafted or moved without its files?)."
        )
    return target


def check_model_class(name: object) -> str:
    """``name`` if it can be part of a file name (a class name: letters, digits, ``_ . -``), else TraceFormatError."""
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise TraceFormatError(
            f"the trace names its model class {str(name)[:80]!r}, which is not a class name; file names are made "
            "from it, so it must be letters, digits, '_', '.' or '-'."
        )
    return name
