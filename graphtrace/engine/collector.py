"""Python's cyclic garbage collector, held off while a capture records.

A step's records stay alive until it ends, so a collection during the step scans them in vain and promotes them to
older generations; after a dozen captures that triggers a full collection, which walks every object of the process
(transformers alone brings about 400,000) for 150-450 ms, more than the tiny benchmark Llama's whole capture. Holding
the collector off while a step records (as ``timeit`` does for its runs) avoids both; collection resumes when the
step ends, raises or is abandoned. The pause is process-wide (the collector has no other switch): another thread's
cyclic garbage waits for the step too; reference counting still frees everything else at once.
"""

from __future__ import annotations

import gc

__all__ = ["CollectorPause"]


class CollectorPause:
    """Nested holds on automatic collection: the first :meth:`hold` turns it off when it was on (a user who turned
    it off keeps it off), the last :meth:`release` turns it back on; :meth:`release_all` ends every hold."""

    __slots__ = ("_disabled", "_holds")

    def __init__(self) -> None:
        self._holds = 0
        self._disabled = False

    def hold(self) -> None:
        self._holds += 1
        if self._holds == 1 and gc.isenabled():
            gc.disable()
            self._disabled = True

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds == 0 and self._disabled:
            self._disabled = False
            gc.enable()

    def release_all(self) -> None:
        if self._holds:
            self._holds = 1
            self.release()
