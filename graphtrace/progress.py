"""A progress line on stderr while a long capture or save runs: ``graphtrace: 1,234 calls recorded, 56.7 MB written``.

Only for a person watching: it appears when stderr is a terminal (or when asked for), after a delay so that quick
captures print nothing, and it is rewritten in place and erased when the work ends. A background thread polls a
callable for the text, so the code doing the work pays nothing per call (torch-free).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

__all__ = ["Progress", "directory_bytes", "human_bytes"]

DELAY = 1.0
"""Seconds of work before the line appears: a capture shorter than that shows nothing."""
INTERVAL = 0.25


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def directory_bytes(directory: Path) -> int:
    """Bytes in the files under ``directory`` now (files that vanish while it is read are skipped)."""
    total = 0
    stack = [str(directory)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


class Progress:
    """Shows ``describe()`` on ``stream`` every ``interval`` seconds after ``delay``, between :meth:`start` and
    :meth:`stop`. ``enabled=None`` shows it only when ``stream`` is a terminal."""

    def __init__(
        self,
        describe: Callable[[], str],
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        delay: float | None = None,
        interval: float = INTERVAL,
    ) -> None:
        self.describe = describe
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.delay = DELAY if delay is None else delay
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def start(self) -> Progress:
        if self.enabled and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="graphtrace-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and erase the line (the terminal is left as it was)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        if self._shown:
            self._write("\r\033[K")
            self._shown = False

    def _run(self) -> None:
        if self._stop.wait(self.delay):
            return
        while True:
            try:
                text = self.describe()
            except OSError:  # the directory's size, read while files come and go: skip this update
                text = ""
            if text:
                self._write(f"\r\033[K{text}")
                self._shown = True
            if self._stop.wait(self.interval):
                return

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream
            pass

    def __enter__(self) -> Progress:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
