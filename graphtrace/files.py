"""Files written whole or not at all, for every layer that writes (io's trace files, render's call graph).

A file is written to a temporary name beside its target, then renamed over it: a full disk, a killed process or
two processes saving to the same path never leave a truncated or interleaved file, only the old file or one whole
new one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from graphtrace.errors import OutputPathError

__all__ = ["put_in_place", "replacing", "temporary_beside", "write_atomic", "write_beside"]


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller (or a program it runs) to write; renamed over ``path`` when
    the block ends without an error, removed when it raises."""
    target = Path(path)
    temporary = temporary_beside(target)
    try:
        yield temporary
        put_in_place(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def temporary_beside(target: Path) -> Path:
    """A new empty file beside ``target`` (same file system, so that a rename replaces ``target`` atomically)."""
    fd, name = tempfile.mkstemp(prefix=f".{target.name[:50]}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(name)


def put_in_place(temporary: Path, target: Path) -> None:
    """Rename the finished ``temporary`` over ``target``, with the mode ``open()`` would have given it."""
    os.chmod(temporary, 0o666 & ~_UMASK)  # not mkstemp's owner-only mode
    os.replace(temporary, target)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once, at import: reading it means setting it, which is not safe while threads create files


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (utf-8) to ``path`` whole or not at all; OutputPathError names the path and the size."""
    target = Path(path)
    data = text.encode("utf-8")
    try:
        with replacing(target) as temporary:
            temporary.write_bytes(data)
    except OSError as exc:
        raise _unwritable(target, data, exc) from exc
    return target


def write_beside(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (utf-8) into a new temporary file beside ``path``, for :func:`put_in_place` later (the caller
    removes it if it never gets there); OutputPathError as :func:`write_atomic`."""
    target = Path(path)
    data = text.encode("utf-8")
    try:
        temporary = temporary_beside(target)
        try:
            temporary.write_bytes(data)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _unwritable(target, data, exc) from exc
    return temporary


def _unwritable(target: Path, data: bytes, exc: OSError) -> OutputPathError:
    return OutputPathError(
        f"cannot write {target} ({len(data):,} bytes): {exc.strerror or exc}. Free some space or choose "
        "another directory; the file was left as it was."
    )
