"""A trace directory is untrusted input: what a trace may name, and how its files are written.

A trace refers to its value files by relative paths (``./x.safetensors``, ``./X_tensors.safetensors#key``). Read
or copied, such a path must stay inside the trace's own directory once resolved (symlinks included): ``../x``, an
absolute path or a link leading out is refused. Names a trace supplies that become file names (the model's class)
must be plain names. Files are written whole or not at all (:func:`graphtrace.files.write_atomic`, re-exported here),
so a full disk or a killed process never leaves a truncated trace file behind. A file read must be a regular file
(opening a FIFO blocks forever, a device never ends) of a bounded size (:func:`read_json_file`). Writing into a
directory someone else can write to, a name may hold a link planted there: a file is created anew in place of
whatever holds its name (:func:`create_new`), and a folder inside is never a link (:func:`make_subdirectory`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from graphtrace.errors import OutputPathError, TraceFormatError
from graphtrace.files import write_atomic

__all__ = [
    "MAX_JSON_BYTES",
    "check_model_class",
    "check_regular_file",
    "create_new",
    "inside",
    "make_subdirectory",
    "read_json_file",
    "resolved",
    "write_atomic",
]

MAX_JSON_BYTES = 1 << 30
"""The largest trace JSON file read (1 GiB): parsed, a JSON file takes several times its size in memory, and the
files graphtrace and transformers write stay far below this (full values beyond a few elements live in safetensors
files, which are mapped, not parsed)."""

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,199}")


def inside(directory: str | os.PathLike[str], reference: str) -> Path:
    """The path ``reference`` names in ``directory``, checked to stay inside it; raises TraceFormatError else."""
    base = Path(directory).resolve()
    if not isinstance(reference, str) or not reference or "\x00" in reference or os.path.isabs(reference):
        raise TraceFormatError(
            f"the trace refers to a file {reference!r} that is not a relative path; a trace may reference only "
            "files inside its own directory."
        )
    target = resolved(base / reference)
    if not target.is_relative_to(base):
        raise TraceFormatError(
            f"the trace refers to {reference!r}, which lies outside its directory {base}; a trace may reference "
            "only files inside its own directory (was it crafted or moved without its files?)."
        )
    return target


def resolved(path: Path) -> Path:
    """``path`` with its links resolved; a loop of links (``x -> x``, on which ``Path.resolve`` raises RuntimeError)
    is a TraceFormatError naming it."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        raise TraceFormatError(
            f"{path} is a loop of symbolic links ({exc}); replace it with the file graphtrace wrote."
        ) from exc


def check_model_class(name: object) -> str:
    """``name`` if it can be part of a file name (a class name: letters, digits, ``_ . -``), else TraceFormatError."""
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or ".." in name:
        raise TraceFormatError(
            f"the trace names its model class {str(name)[:80]!r}, which is not a class name; file names are made "
            "from it, so it must be letters, digits, '_', '.' or '-'."
        )
    return name


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_regular_file(path: str | os.PathLike[str], fd: int | None = None) -> os.stat_result:
    """``path``'s status (of the open descriptor ``fd`` when given) if it is a regular file (symlinks followed), else
    TraceFormatError: reading a FIFO blocks until a writer comes, a device may never end, and a directory is no file."""
    try:
        info = os.stat(path) if fd is None else os.fstat(fd)
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace file {path}: {exc.strerror or exc}.") from exc
    if not stat.S_ISREG(info.st_mode):
        raise TraceFormatError(
            f"cannot read trace file {path}: it is {_kind(info.st_mode)}, not a regular file; replace it with the "
            "file graphtrace wrote."
        )
    return info


def read_json_file(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in the trace file ``path`` (UTF-8, a byte order mark allowed), read without blocking and
    within ``limit`` bytes; TraceFormatError names the file and what is wrong with it. Its strings hold no control
    characters but newlines and tabs: each other one is kept as the text of its escape (``\\u001b``), so that no
    name or value printed by show or diff can drive the terminal.

    The file is opened non-blocking and checked on the open descriptor, so that a FIFO or device put in its place
    (also between a check and the open) is refused instead of read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace file {path}: {exc.strerror or exc}.") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TraceFormatError(
                f"cannot read trace file {path}: it is {_kind(info.st_mode)}, not a regular file; replace it with "
                "the file graphtrace wrote."
            )
        if info.st_size > limit:
            raise _too_large(path, info.st_size, limit)
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)  # the size said may be a lie (a file still growing)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(path, len(data), limit)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); trace files are "
            "UTF-8 JSON: was it written by another program or damaged?"
        ) from exc
    try:
        return json.loads(_CONTROL.sub(_shown, text))
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path} is not valid JSON ({exc}); was it written completely?") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path} is not a trace graphtrace can read (too deeply nested).") from exc


_CONTROL = re.compile(r"\\\\|\\u00(?:[01][0-9a-fA-F]|7[fF]|[89][0-9a-fA-F])|\\[bfr]|[\x80-\x9f]")
"""What in JSON text decodes to a control character (escaped C0, DEL and C1 characters, ``\\b \\f \\r``, raw C1
characters), and an escaped backslash, matched whole so that the backslash it escapes starts nothing."""


def _shown(match: re.Match[str]) -> str:
    """A control character as the text of its escape: printed, ``ESC [ 2 J`` or ``ESC ] 52`` from a crafted name
    would clear the terminal or set its clipboard. Newlines and tabs stay (repr lines of values hold them)."""
    escape = match.group()
    if escape == "\\\\" or escape.lower() in ("\\u000a", "\\u0009"):
        return escape
    if len(escape) == 1:  # a raw C1 character
        return f"\\\\u{ord(escape):04x}"
    return "\\" + escape


def _too_large(path: str | os.PathLike[str], size: int, limit: int) -> TraceFormatError:
    return TraceFormatError(
        f"{path} holds {size:,} bytes, more than the {limit:,} a trace JSON file may hold; it is not a file "
        "graphtrace or transformers wrote (full values belong in .safetensors files)."
    )


def create_new(path: str | os.PathLike[str]) -> int:
    """A descriptor of the new empty file ``path``, opened for writing, after removing whatever held its name: a
    link planted under the name is replaced, never followed (``O_EXCL`` refuses one put back in between)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o666)


def make_subdirectory(path: Path) -> Path:
    """The folder ``path`` (a step's or a rank's, inside a directory being written), created if needed; a link or a
    file in its place is an OutputPathError, since writing through a planted link would write outside."""
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {str(path)!r}: {exc.strerror or exc}. Choose another directory.") from exc
    if path.is_symlink() or not path.is_dir():
        raise OutputPathError(
            f"{str(path)!r} is {'a link' if path.is_symlink() else 'not a directory'}, where graphtrace writes a "
            "folder of the trace; writing through it could write outside the trace directory. Remove it, or save "
            "into another directory."
        )
    return path
