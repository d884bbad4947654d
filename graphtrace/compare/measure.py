"""How far apart two recorded tensors are: from their full values when both traces hold them, else from statistics.

A is the reference: an element of B is within tolerance when ``|b - a| <= atol + rtol * |a|`` (``torch.isclose``
with ``a`` as ``other``). NaN against NaN and an infinity against the same infinity count as equal: both
implementations produced them. Without explicit tolerances each dtype gets ``torch.testing.assert_close``'s
defaults (the looser of the two dtypes when they differ).

Statistics read from transformers' files are 5-digit strings (``"tensor(-8.1495e-04)"``); their rounding is added to
the tolerance, so a transformers-written trace and a graphtrace trace of the same forward agree.

This module never imports torch: full values arrive as tensors loaded by :mod:`graphtrace.io.tensors`, and only
their methods are used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from graphtrace.model import Stats, TensorRecord

__all__ = ["STAT_NAMES", "Basis", "StatPoint", "Status", "TensorDiff", "Tolerance", "measure", "stats_close"]

Basis = Literal["values", "stats", "none"]
"""What a difference was computed from: both full tensors, both sets of statistics, or nothing comparable."""

Status = Literal["equal", "diverged", "unchecked"]

STAT_NAMES = ("mean", "std", "min", "max")

# torch.testing.assert_close's defaults per dtype: (rtol, atol)
_DTYPE_TOLERANCE = {
    "torch.float16": (1e-3, 1e-5),
    "torch.bfloat16": (1.6e-2, 1e-5),
    "torch.float32": (1.3e-6, 1e-5),
    "torch.float64": (1e-7, 1e-7),
    "torch.complex32": (1e-3, 1e-5),
    "torch.complex64": (1.3e-6, 1e-5),
    "torch.complex128": (1e-7, 1e-7),
}
_FLOAT8_TOLERANCE = (1.25e-1, 1e-5)  # float8 variants: one step of a 3-bit mantissa


@dataclass(frozen=True, slots=True)
class Tolerance:
    """``rtol`` and ``atol``; None means the dtype's default (see the module docstring)."""

    rtol: float | None = None
    atol: float | None = None

    def for_dtypes(self, a: str, b: str) -> tuple[float, float]:
        default = tuple(max(pair) for pair in zip(_dtype_default(a), _dtype_default(b)))
        return (
            default[0] if self.rtol is None else self.rtol,
            default[1] if self.atol is None else self.atol,
        )

    def describe(self) -> str:
        if self.rtol is not None and self.atol is not None:
            return f"rtol {self.rtol:g}, atol {self.atol:g}"
        given = [f"{name} {value:g}" for name, value in (("rtol", self.rtol), ("atol", self.atol)) if value is not None]
        rtol, atol = _DTYPE_TOLERANCE["torch.float32"]
        default = f"per dtype as torch.testing.assert_close (float32: rtol {rtol:g}, atol {atol:g})"
        return ", ".join([*given, default])


def _dtype_default(dtype: str) -> tuple[float, float]:
    if dtype in _DTYPE_TOLERANCE:
        return _DTYPE_TOLERANCE[dtype]
    if dtype.startswith("torch.float8"):
        return _FLOAT8_TOLERANCE
    return (0.0, 0.0)  # integers and booleans: exact


@dataclass(frozen=True, slots=True)
class TensorDiff:
    """One pair of tensors at the same place in a matched pair of calls (``name_a`` in A, ``name_b`` in B).

    With full values: ``max_abs``, ``max_rel`` (``|b - a| / |a|``), ``cosine`` (of the flattened tensors, over the
    elements finite in both) and ``outside`` (how many of ``numel`` elements are not within tolerance). With
    statistics only: ``stat_deltas``, ``|b - a|`` of mean, std, min and max. ``reason`` says in words why the pair
    diverged.
    """

    name_a: str
    name_b: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    basis: Basis
    status: Status
    rtol: float
    atol: float
    max_abs: float | None = None
    max_rel: float | None = None
    cosine: float | None = None
    outside: int | None = None
    stat_deltas: tuple[float, float, float, float] | None = None
    reason: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape_a)

    @property
    def largest(self) -> float | None:
        """The largest absolute difference known: of the values, else of the statistics."""
        if self.max_abs is not None:
            return self.max_abs
        if self.stat_deltas is not None:
            return max(self.stat_deltas, key=lambda x: -1.0 if math.isnan(x) else x)
        return None


# -- statistics ----------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"tensor\(\s*(-?)(\d*)\.?(\d*)(?:e([+-]?\d+))?")


def _printed_resolution(text: str, value: float) -> float:
    """Half a unit in the last printed digit of ``text`` when ``value`` was read from it, else 0 (exact)."""
    match = _NUMBER.match(text)
    if match is None or not math.isfinite(value):
        return 0.0
    try:
        if float(text[len("tensor(") : match.end()]) != value:
            return 0.0  # the number is exact, not read from this string
    except ValueError:
        return 0.0
    decimals, exponent = len(match.group(3)), match.group(4)
    if exponent is None and not decimals:
        return 0.0  # printed in integer mode ("tensor(0.)", "tensor(3.)"): the value is exact
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(b - a) <= atol + rtol * abs(a)


def _stat_values(stats: Stats) -> tuple[float, float, float, float]:
    return (stats.mean, stats.std, stats.min, stats.max)


@dataclass(frozen=True, slots=True)
class StatPoint:
    """A tensor's mean, std, min and max, each with how precisely it is known: half a unit in the last printed
    digit when it was read from transformers' strings, 0 when exact."""

    values: tuple[float, float, float, float]
    slack: tuple[float, ...]
    dtype: str

    @classmethod
    def of(cls, record: TensorRecord) -> StatPoint | None:
        if record.stats is None:
            return None
        values = _stat_values(record.stats)
        if record.spec_stats is None:
            slack: tuple[float, ...] = (0.0,) * 4
        else:
            slack = tuple(_printed_resolution(text, value) for text, value in zip(record.spec_stats, values))
        return cls(values, slack, record.dtype)

    def close_to(self, other: StatPoint, rtol: float, atol: float) -> bool:
        """Every statistic within tolerance, widened by the rounding of both sides."""
        for x, y, sx, sy in zip(self.values, other.values, self.slack, other.slack):
            if not _close(x, y, rtol, atol + sx + sy):
                return False
        return True


def stats_close(a: TensorRecord, b: TensorRecord, rtol: float, atol: float) -> bool | None:
    """Whether the statistics of ``a`` and ``b`` agree within tolerance (None when one has none)."""
    point_a, point_b = StatPoint.of(a), StatPoint.of(b)
    if point_a is None or point_b is None:
        return None
    return point_a.close_to(point_b, rtol, atol)


def _stat_deltas(a: Stats, b: Stats) -> tuple[float, float, float, float]:
    deltas = []
    for x, y in zip(_stat_values(a), _stat_values(b)):
        if _close(x, y, 0.0, 0.0):
            deltas.append(0.0)
        else:
            deltas.append(abs(y - x) if math.isfinite(x) and math.isfinite(y) else math.inf)
    return deltas[0], deltas[1], deltas[2], deltas[3]


def _from_stats(a: TensorRecord, b: TensorRecord, base: dict[str, Any]) -> TensorDiff:
    assert a.stats is not None and b.stats is not None
    deltas = _stat_deltas(a.stats, b.stats)
    if stats_close(a, b, base["rtol"], base["atol"]):
        return TensorDiff(**base, basis="stats", status="equal", stat_deltas=deltas)
    worst = max(range(4), key=lambda i: deltas[i])
    x, y = _stat_values(a.stats)[worst], _stat_values(b.stats)[worst]
    reason = f"{STAT_NAMES[worst]} {x:.6g} vs {y:.6g}"
    if a.nan_count != b.nan_count or a.inf_count != b.inf_count:
        reason += f" (nan/inf {a.nan_count}/{a.inf_count} vs {b.nan_count}/{b.inf_count})"
    return TensorDiff(**base, basis="stats", status="diverged", stat_deltas=deltas, reason=reason)


# -- full values ---------------------------------------------------------------------------------------------------


def _from_values(ta: Any, tb: Any, base: dict[str, Any]) -> TensorDiff:
    """Differences of two tensors of the same shape, in float64, using tensor methods only."""
    rtol, atol = base["rtol"], base["atol"]
    a = ta.detach().reshape(-1).double()
    b = tb.detach().reshape(-1).double()
    same = (a == b) | (a.isnan() & b.isnan())  # equal, or NaN in both, or the same infinity
    finite = a.isfinite() & b.isfinite()
    diff = (b - a).abs().masked_fill(same, 0.0).nan_to_num(nan=math.inf, posinf=math.inf)
    scale = a.abs()
    rel = (diff / scale).masked_fill(diff == 0, 0.0).nan_to_num(nan=math.inf, posinf=math.inf)
    within = same | (finite & (diff <= atol + rtol * scale))  # a non-finite element is close only to itself
    outside = int((~within).sum().item())
    # over the elements finite in both; elementwise products and sums only (BLAS dot and boolean indexing stall
    # on a busy machine's thread pool)
    if not bool(diff.any().item()):
        cosine = 1.0  # identical (the common case): exactly 1, not 1 up to rounding, and no norms to compute
    else:
        fa, fb = a.masked_fill(~finite, 0.0), b.masked_fill(~finite, 0.0)
        norms = math.sqrt(float((fa * fa).sum().item())) * math.sqrt(float((fb * fb).sum().item()))
        if norms > 0:
            cosine = max(-1.0, min(1.0, float((fa * fb).sum().item()) / norms))
        else:
            cosine = 1.0 if bool((fa == fb).all().item()) else 0.0
    max_abs = float(diff.max().item()) if diff.numel() else 0.0
    max_rel = float(rel.max().item()) if rel.numel() else 0.0
    status: Status = "equal" if outside == 0 else "diverged"
    reason = "" if outside == 0 else f"{outside} of {diff.numel()} elements outside tolerance, max |Δ| {max_abs:.3g}"
    return TensorDiff(
        **base,
        basis="values",
        status=status,
        max_abs=max_abs,
        max_rel=max_rel,
        cosine=cosine,
        outside=outside,
        reason=reason,
    )


def measure(
    name_a: str,
    a: TensorRecord,
    name_b: str,
    b: TensorRecord,
    tolerance: Tolerance,
    values: tuple[Any, Any] | None = None,
) -> TensorDiff:
    """Compare two tensor records; ``values`` holds both full tensors when they are available."""
    rtol, atol = tolerance.for_dtypes(a.dtype, b.dtype)
    base: dict[str, Any] = {
        "name_a": name_a,
        "name_b": name_b,
        "shape_a": a.shape,
        "shape_b": b.shape,
        "dtype_a": a.dtype,
        "dtype_b": b.dtype,
        "rtol": rtol,
        "atol": atol,
    }
    if a.shape != b.shape:
        return TensorDiff(**base, basis="none", status="diverged", reason=f"shape {list(a.shape)} vs {list(b.shape)}")
    if values is not None:
        return _from_values(values[0], values[1], base)
    if a.stats is not None and b.stats is not None:
        return _from_stats(a, b, base)
    reason = "" if a.stats is None and b.stats is None else f"no statistics in {'A' if a.stats is None else 'B'}"
    return TensorDiff(**base, basis="none", status="unchecked", reason=reason)
