"""A step's numbers: statistics, NaN/Inf counts and value fingerprints of its tensors, read back together.

On an accelerator, every read of a number (``.item()``, ``.tolist()``, ``float(t)``, a blocking copy to the host)
waits until every kernel queued before it has run: a read per recorded tensor would stall the forward thousands of
times per step. So off the CPU the recorder only queues the work on the tensor's own device as it records the
tensor (:func:`graphtrace.engine.stats.queued_reductions`, :func:`~graphtrace.engine.stats.nonfinite_counts`,
:func:`~graphtrace.engine.stats.fingerprint`), keeps the small results here, and :meth:`StepNumbers.read` reads them
all in one transfer per device when the step ends (or earlier, when more than :data:`MAX_QUEUED` wait).

Records are made during the step without these numbers and completed in place when they are read, before the step
leaves the recorder (nothing else has seen them yet). A copy of a pending record (with a value, a fingerprint, a
DTensor's facts) must be announced by :meth:`StepNumbers.derive` to be completed too.

On the CPU a read waits for nothing, and reading each tensor's numbers as it is recorded costs less there than
queueing them: NaN/Inf counts, which the immediate path computes only when the extremes are not finite, and the
queue's bookkeeping took the benchmarks' tiny Llama (456 small tensors a step) from 3.5x to 3.9x a plain forward
(docs/performance.md, "On a device"). Device types in :data:`READ_AT_ONCE` take that path. Emptying it runs a CPU
capture through the device path, which is how the host-read test counts what a device capture would wait for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from graphtrace.engine.stats import (
    SPEC_STAT_DTYPES,
    fingerprint,
    nonfinite_counts,
    queued_reductions,
    sketch_of,
    spec_format,
    summary_of,
)
from graphtrace.model import TensorRecord

__all__ = ["MAX_QUEUED", "READ_AT_ONCE", "StepNumbers"]

MAX_QUEUED = 1 << 16
"""Results (0-d tensors and fingerprint parts) queued before they are read early: a bound on device memory in small
blocks, far above a step of a 32-layer model (about 4,000)."""

READ_AT_ONCE = frozenset({"cpu"})
"""Device types whose tensors' numbers are read as they are recorded (see above)."""

_INT64 = torch.int64
_FLOAT64 = torch.float64
_OWN = SPEC_STAT_DTYPES | {torch.float64}  # reduced in their own dtype; every other floating dtype in float32


def _setter(field: str) -> Callable[[TensorRecord, Any], None]:
    """Sets ``field`` of a record through its slot's descriptor: the dataclass is frozen for everyone else."""
    descriptor: Any = TensorRecord.__dict__[field]
    return descriptor.__set__  # type: ignore[no-any-return]


_SET_STATS = _setter("stats")
_SET_SPEC = _setter("spec_stats")
_SET_NAN = _setter("nan_count")
_SET_INF = _setter("inf_count")
_SET_SKETCH = _setter("sketch")

_Group = tuple[torch.device, torch.dtype]

_KEEP = object()


class StepNumbers:
    """The numbers of one step's records, queued on their devices (see the module docstring).

    A queued summary is a number, its place in a list of ``(group, position, dtype, print format, counts)``: its
    (device, dtype) group and the position of its mean there (std, min and max follow), and the position of its NaN
    count in the device's int64 group (the infinity count follows). A queued fingerprint is a
    ``(group, start, length)`` tuple."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Drop what waits (a step that never ended: its records are nobody's)."""
        self._scalars: dict[_Group, list[torch.Tensor]] = {}
        self._flats: dict[_Group, list[torch.Tensor]] = {}
        self._flat_sizes: dict[_Group, int] = {}
        self._fills: dict[int, tuple[TensorRecord, int, tuple[_Group, int, int] | None]] = {}
        self._summaries: list[tuple[_Group, int, torch.dtype, Any, int]] = []
        self._queued = 0

    @staticmethod
    def at_once(tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s numbers are read as it is recorded (its device type is in :data:`READ_AT_ONCE`)."""
        if tensor.is_cpu:
            return "cpu" in READ_AT_ONCE
        return tensor.device.type in READ_AT_ONCE

    def summary(self, tensor: torch.Tensor) -> int:
        """Queue the statistics and NaN/Inf counts of ``tensor``, one that
        :func:`~graphtrace.engine.stats.stats_path` queues; returns the summary's number."""
        dtype = tensor.dtype
        device = tensor.device
        group = (device, dtype if dtype in _OWN else torch.float32)
        scalars = self._scalars.get(group)
        if scalars is None:
            scalars = self._scalars[group] = []
        counts_group = (device, _INT64)
        tallies = self._scalars.get(counts_group)
        if tallies is None:
            tallies = self._scalars[counts_group] = []
        summary = (group, len(scalars), dtype, spec_format(tensor) if dtype in SPEC_STAT_DTYPES else None, len(tallies))
        scalars += queued_reductions(tensor)
        tallies += nonfinite_counts(tensor)
        self._queued += 6
        self._summaries.append(summary)
        return len(self._summaries) - 1

    def fingerprint(self, tensor: torch.Tensor) -> tuple[_Group, int, int] | None:
        """Queue the value fingerprint of ``tensor`` (None when it has none)."""
        parts = fingerprint(tensor)
        if parts is None:
            return None
        first = parts[0]
        group = (first.device, first.dtype)
        flats = self._flats.get(group)
        if flats is None:
            flats = self._flats[group] = []
            self._flat_sizes[group] = 0
        start = self._flat_sizes[group]
        length = 0
        for part in parts:
            length += part.numel()
        flats += parts
        self._flat_sizes[group] = start + length
        self._queued += len(parts)
        return group, start, length

    def pending(self, record: TensorRecord, summary: int, sketch: tuple[_Group, int, int] | None) -> None:
        """``record`` is completed with these numbers when they are read (``summary`` -1: none)."""
        self._fills[id(record)] = (record, summary, sketch)
        if self._queued > MAX_QUEUED:
            self.read()

    def derive(self, old: TensorRecord, new: TensorRecord, sketch: Any = _KEEP) -> TensorRecord:
        """``new`` is a copy of ``old`` (with ``sketch``'s fingerprint instead when given): it is completed with the
        numbers ``old`` waits for. Returns ``new``."""
        if not self._fills and sketch is _KEEP:
            return new  # nothing waits (the CPU reads at once)
        fill = self._fills.get(id(old))
        summary, kept_sketch = (fill[1], fill[2]) if fill is not None and fill[0] is old else (-1, None)
        if sketch is not _KEEP:
            kept_sketch = sketch
        if summary >= 0 or kept_sketch is not None:
            self.pending(new, summary, kept_sketch)
        return new

    def read(self) -> None:
        """Read every number queued, one transfer per device, and complete the records waiting for them."""
        fills = self._fills
        if not fills:
            self.clear()
            return
        scalars, flats, queued = self._scalars, self._flats, self._summaries
        self.clear()
        numbers = _read(scalars, flats)
        summaries = _summaries(numbers, queued)
        sketches: dict[tuple[_Group, int, int], tuple[float, ...]] = {}
        for record, summary, sketch in fills.values():
            if summary >= 0:
                stats, spec, nan, inf = summaries[summary]
                _SET_STATS(record, stats)
                _SET_SPEC(record, spec)
                _SET_NAN(record, nan)
                _SET_INF(record, inf)
            if sketch is not None:
                values = sketches.get(sketch)
                if values is None:
                    group, start, length = sketch
                    at = len(scalars.get(group, ())) + start  # the group's fingerprints follow its 0-d results
                    values = sketches[sketch] = sketch_of(numbers[group][at : at + length])
                _SET_SKETCH(record, values)


def _read(
    scalars: dict[_Group, list[torch.Tensor]], flats: dict[_Group, list[torch.Tensor]]
) -> dict[_Group, list[float]]:
    """Every group's numbers as floats (exact: every dtype queued converts to float64 exactly), one ``tolist()``
    per device."""
    parts: dict[torch.device, list[tuple[_Group, torch.Tensor]]] = {}
    for group in {*scalars, *flats}:
        pieces = []
        if group in scalars:
            pieces.append(torch.stack(scalars[group]))
        if group in flats:
            pieces += flats[group]
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        parts.setdefault(group[0], []).append((group, joined))
    numbers: dict[_Group, list[float]] = {}
    for device_parts in parts.values():
        joined = torch.cat([part.to(_FLOAT64) for _, part in device_parts])
        values = joined.tolist()  # the one read of this device's numbers
        at = 0
        for group, part in device_parts:
            size = part.numel()
            numbers[group] = values[at : at + size]
            at += size
    return numbers


def _summaries(
    numbers: dict[_Group, list[float]], queued: list[tuple[_Group, int, torch.dtype, Any, int]]
) -> list[tuple[Any, Any, int, int]]:
    """Each queued summary's (stats, strings, NaN count, infinity count)."""
    results: list[tuple[Any, Any, int, int]] = []
    for group, index, dtype, form, counts in queued:
        mean, std, low, high = numbers[group][index : index + 4]
        stats, spec = summary_of(mean, std, low, high, dtype, form)
        counted = numbers[(group[0], _INT64)]
        results.append((stats, spec, int(counted[counts]), int(counted[counts + 1])))
    return results
