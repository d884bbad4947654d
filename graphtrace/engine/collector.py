"""Python's cyclic garbage collector kept from promoting a step's records while the step records.

A step's records stay alive until it ends. Each collection of the middle generation during the step moves them to
the oldest one, and every object moved there counts toward the next full collection, which walks every object of
the process (transformers alone brings about 400,000) for 150-450 ms: one every dozen captures of the tiny
benchmark Llama, more than its whole capture, also when the user drops every trace at once. While a step records,
the middle generation's threshold is raised out of reach: the youngest generation is still collected as usual (a
forward's short-lived reference cycles, holding activations, are freed as promptly as without graphtrace), but
nothing is promoted and no full collection starts. The thresholds are put back when the step ends, raises or is
abandoned. They are process-wide (the collector has no other switch): another thread's collections wait too.
"""

from __future__ import annotations

import gc

__all__ = ["CollectorPause"]

_OUT_OF_REACH = 1 << 30


class CollectorPause:
    """Nested holds on promotions: the first :meth:`hold` raises the middle generation's threshold when automatic
    collection is on (a user who turned it off keeps it off), the last :meth:`release` puts the thresholds back as
    they were; :meth:`release_all` ends every hold."""

    __slots__ = ("_holds", "_thresholds")

    def __init__(self) -> None:
        self._holds = 0
        self._thresholds: tuple[int, int, int] | None = None

    def hold(self) -> None:
        self._holds += 1
        if self._holds == 1 and gc.isenabled():
            self._thresholds = gc.get_threshold()
            youngest, _, oldest = self._thresholds
            gc.set_threshold(youngest, _OUT_OF_REACH, oldest)

    def release(self) -> None:
        if self._holds == 0:
            return
        self._holds -= 1
        if self._holds == 0 and self._thresholds is not None:
            thresholds, self._thresholds = self._thresholds, None
            gc.set_threshold(*thresholds)

    def release_all(self) -> None:
        if self._holds:
            self._holds = 1
            self.release()
