"""A background thread that writes tensor files while the forward goes on.

Creating a file costs a fraction of a millisecond (much more on some virtual disks), and writing a large tensor
into the page cache a good part of a second per gigabyte; the system calls release the GIL, so a second thread can
do both while the model computes. The caller hands over bytes it will not modify (a copy of a tensor that the model
might still change in place) and the queue holds a bounded number of bytes: when it is full the caller waits, so that
memory stays within a forward's plus about one module call's tensors. A write that fails is reported to the caller at
its next submission or at :meth:`BackgroundWriter.drain`, as the :class:`~graphtrace.errors.OutputPathError` it
raised; the jobs queued behind it are not run, and each one's ``abandon`` (which removes what the job would have
written, so that no stale or partial file is left under its name) runs instead.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

__all__ = ["QUEUE_BYTES", "BackgroundWriter"]

QUEUE_BYTES = 64 << 20
"""Bytes waiting to be written at most; a larger single write runs on the caller's thread once the queue is empty."""


class BackgroundWriter:
    """Runs write jobs on one daemon thread, in submission order."""

    def __init__(self, queue_bytes: int = QUEUE_BYTES) -> None:
        self.queue_bytes = queue_bytes
        self._jobs: collections.deque[tuple[Callable[[], None], int, Callable[[], None] | None]] = collections.deque()
        self._queued = 0
        self._error: BaseException | None = None
        self._closing = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None], nbytes: int, abandon: Callable[[], None] | None = None) -> None:
        """Run ``job`` (which writes about ``nbytes``) on the writer thread, or here when it is too large to queue;
        ``abandon`` runs instead if an earlier job failed."""
        try:
            self._raise_failure()
        except BaseException:
            _abandon(abandon)
            raise
        if nbytes >= self.queue_bytes:
            try:
                self.drain()
            except BaseException:
                _abandon(abandon)
                raise
            job()
            return
        with self._changed:
            while self._jobs and self._queued + nbytes > self.queue_bytes:
                self._changed.wait()
            self._jobs.append((job, nbytes, abandon))
            self._queued += nbytes
            self._changed.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="graphtrace-writer", daemon=True)
            self._thread.start()

    def drain(self) -> None:
        """Wait until every submitted job has run; raise the first failure, if any."""
        with self._changed:
            while self._jobs:
                self._changed.wait()
        self._raise_failure()

    def close(self) -> None:
        """Drain and stop the thread (it is started again by a later submission)."""
        try:
            self.drain()
        finally:
            thread = self._thread
            if thread is not None:
                with self._changed:
                    self._closing = True
                    self._changed.notify_all()
                thread.join()
                self._thread = None
                self._closing = False

    def _raise_failure(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._jobs and not self._closing:
                    self._changed.wait()
                if not self._jobs:
                    return
                job, nbytes, abandon = self._jobs[0]
            if self._error is None:
                try:
                    job()
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc
            else:  # after a failure the remaining jobs are dropped
                _abandon(abandon)
            with self._changed:
                self._jobs.popleft()
                self._queued -= nbytes
                self._changed.notify_all()


def _abandon(abandon: Callable[[], None] | None) -> None:
    if abandon is not None:
        try:
            abandon()
        except OSError:
            pass  # best effort: the failure already reported is what the caller must see
