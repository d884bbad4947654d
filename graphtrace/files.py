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

__all__ = ["replacing", "write_atomic"]


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller (or a program it runs) to write; renamed over ``path`` when
    the block ends without an error, removed when it raises."""
    target = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{target.name[:50]}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        os.chmod(temporary, 0o666 & ~_UMASK)  # as open() would have made it, not mkstemp's owner-only mode
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


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
        raise OutputPathError(
            f"cannot write {target} ({len(data):,} bytes): {exc.strerror or exc}. Free some space or choose "
            "another directory; the file was left as it was."
        ) from exc
    return target
