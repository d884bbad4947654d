"""How far apart two recorded tensors are: from their full values when both traces hold them, else from statistics.

A is the reference: an element of B is within tolerance when ``|b - a| <= atol + rtol * |a|`` (``torch.isclose``
with ``a`` as ``other``). NaN against NaN and an infinity against the same infinity count as equal: both
implementations produced them. Without explicit tolerances each dtype gets ``torch.testing.assert_close``'s
defaults (the looser of the two dtypes when they differ), and ``atol`` is at least ``rtol`` times the largest
magnitude among the elements that differ: an element computed from others (a sum, an attention's weighted values) is
off by rounding relative to *their* magnitudes, not its own, so in bfloat16 an element near zero may honestly differ
by a unit of rounding of the tensor's large elements. In float32 this matters only for elements beyond about 8.

Statistics read from transformers' files are 5-digit strings (``"tensor(-8.1495e-04)"``); their rounding is added to
the tolerance, so a transformers-written trace and a graphtrace trace of the same forward agree.

This module never imports torch: full values arrive as tensors loaded by :mod:`graphtrace.io.tensors`, and only
their methods are used.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from graphtrace.model import Stats, TensorRecord

__all__ = [
    "STAT_NAMES",
    "Basis",
    "StatPoint",
    "Status",
    "TensorDiff",
    "Tolerance",
    "broadcastable",
    "mask_record",
    "measure",
    "measure_masks",
    "stats_close",
]

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

# Machine epsilon per dtype: an aggregate (a mean of many elements) is known no better than a few units of rounding
# of its elements, whatever the number of elements, since rounding can be systematic.
_EPSILON = {
    "torch.float16": 9.77e-4,
    "torch.bfloat16": 7.81e-3,
    "torch.float32": 1.19e-7,
    "torch.float64": 2.22e-16,
    "torch.complex64": 1.19e-7,
    "torch.complex128": 2.22e-16,
}
_ROUNDING_UNITS = 4.0
_LEANING_T = 8.0
"""How many standard errors a mean difference must lie from zero to count as a lean rather than scatter."""


def _epsilon(a: str, b: str) -> float:
    return max(_EPSILON.get(a, 0.125 if a.startswith("torch.float8") else 0.0), _EPSILON.get(b, 0.0))


def aggregate_tolerance(n: int, scale: float, rtol: float, atol: float, epsilon: float) -> float:
    """How far a mean of ``n`` elements of typical magnitude ``scale`` may move when each element may move by
    ``atol + rtol * |a|`` at random: the element tolerance over sqrt(n), but never below a few units of rounding
    of the magnitude (rounding differences between two implementations can be systematic), nor above the element
    tolerance (exact elements, exact aggregates)."""
    element = atol + rtol * scale
    return max(element / math.sqrt(max(n, 1)), min(element, _ROUNDING_UNITS * epsilon * scale))


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` without its size-1 dimensions: tensors whose shapes squeeze alike hold their values in the same
    order (``[1, T, D]`` and ``[T, D]``)."""
    return tuple(size for size in shape if size != 1)


def split_alike(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether ``a`` and ``b`` (squeezed) hold the same elements in the same order, one with its last dimension
    split into several: a projection written as an einsum returns ``[B, T, H, Dh]`` where ``nn.Linear`` returns
    ``[B, T, H*Dh]``. The coarser shape's other dimensions must be the finer one's first (at least one of them),
    so a flattened tensor does not fit whatever else has as many elements."""
    a, b = squeezed(a), squeezed(b)
    coarse, fine = (a, b) if len(a) < len(b) else (b, a)
    if len(coarse) < 2 or len(fine) == len(coarse):
        return False
    lead = len(coarse) - 1
    return fine[:lead] == coarse[:lead] and math.prod(fine[lead:]) == coarse[-1]


class ShapeKey:
    """A shape as alignment sets shapes side by side: up to size-1 dimensions, to the order of the dimensions (a
    Megatron or fairseq style port keeps activations ``[T, B, D]`` where the original keeps ``[B, T, D]``, a
    convolutional one ``[B, C, T]`` for ``[B, T, C]``; see :func:`dims_orders`) and to a split last dimension
    (:func:`split_alike`). Keys hash by their number of elements, which every such equivalent shares."""

    __slots__ = ("order", "sizes")

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.order = squeezed(shape)
        self.sizes = tuple(sorted(self.order))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShapeKey):
            return NotImplemented
        return self.sizes == other.sizes or split_alike(self.order, other.order)

    def __hash__(self) -> int:
        return hash(math.prod(self.sizes))

    def __repr__(self) -> str:
        return f"ShapeKey({list(self.order)})"


def shape_key(shape: tuple[int, ...]) -> ShapeKey:
    """``shape`` as alignment sets shapes side by side (:class:`ShapeKey`)."""
    return ShapeKey(shape)


def dims_orders(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The ways to take the dimensions of ``b`` (squeezed) to lay its values out as ``a`` (squeezed) holds them, when
    the two differ only in the order of their dimensions; none when they need no re-ordering. One when every size is
    distinct (which dimension is which is then certain); several when two have the same size (``[B, H, W, C]`` for
    ``[B, C, H, W]`` with ``H == W``), the first keeping dimensions of the same size in their order."""
    a, b = squeezed(a), squeezed(b)
    if a == b or sorted(a) != sorted(b):
        return []
    return list(itertools.islice(_orders(a, b), MAX_DIMS_ORDERS))


def _orders(a: tuple[int, ...], b: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Every order of ``b``'s dims that gives ``a``, generated size by size (never the permutations of all dims),
    dims of one size in their own order first."""
    places: dict[int, list[int]] = {}
    for index, size in enumerate(b):
        places.setdefault(size, []).append(index)

    def assign(position: int, used: frozenset[int]) -> Iterator[tuple[int, ...]]:
        if position == len(a):
            yield ()
            return
        for index in places[a[position]]:  # lazily: eight dims of one size would be 40,320 orders
            if index not in used:
                for rest in assign(position + 1, used | {index}):
                    yield (index, *rest)

    return assign(0, frozenset())


MAX_DIMS_ORDERS = 24
"""At most this many orders are tried (each compares the whole tensor): eight dims of one size allow 40,320."""


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
    diverged; ``equivalence`` names what the comparison allowed for when the two tensors are not laid out alike
    (shapes that differ only by size-1 dimensions, a permutation of the last dimension).
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
    equivalence: str = ""
    layout: str = ""
    """The re-ordering of the last dimension allowed for ("" none): one of :func:`_last_dim_permutations`'
    descriptions, or :data:`PERMUTED`."""
    padded: bool = False
    """B's tensor is A's padded along one dimension (:func:`padding`), and either there were no values to compare the
    part they share (diverged), or that part agrees: whether the padding matters is for the caller to tell (a head
    over a padded vocabulary whose logits the model cuts back; the model's own output is read as it is)."""

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
    numel: int = 1

    @classmethod
    def of(cls, record: TensorRecord) -> StatPoint | None:
        if record.stats is None:
            return None
        values = _stat_values(record.stats)
        if record.spec_stats is None:
            slack: tuple[float, ...] = (0.0,) * 4
        else:
            slack = tuple(_printed_resolution(text, value) for text, value in zip(record.spec_stats, values))
        return cls(values, slack, record.dtype, record.numel)

    def close_to(self, other: StatPoint, rtol: float, atol: float) -> bool:
        return self.first_outside(other, rtol, atol) is None

    def first_outside(self, other: StatPoint, rtol: float, atol: float) -> int | None:
        """Every statistic within its own tolerance, widened by the rounding of both sides.

        min and max are single elements: the element tolerance. mean and std are aggregates of ``numel`` elements:
        random differences of the elements mostly cancel in them, so their tolerance is the element tolerance over
        sqrt(numel) (:func:`aggregate_tolerance`). That is what lets statistics alone see a small systematic change
        (a norm's eps, a rotary base) that moves every element by less than the element tolerance."""
        mean, std = self.values[0], self.values[1]
        scale = math.hypot(mean, std) if math.isfinite(mean) and math.isfinite(std) else math.inf
        aggregate = None
        if math.isfinite(scale):
            epsilon = _epsilon(self.dtype, other.dtype)
            aggregate = aggregate_tolerance(min(self.numel, other.numel), scale, rtol, atol, epsilon)
        for k, (x, y, sx, sy) in enumerate(zip(self.values, other.values, self.slack, other.slack)):
            if k < 2 and aggregate is not None and math.isfinite(x) and math.isfinite(y):
                if abs(y - x) > aggregate + sx + sy:
                    return k
            elif not _close(x, y, rtol, atol + sx + sy):
                return k
        return None


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


def _mask_like(record: TensorRecord) -> bool:
    """An additive attention mask: its smallest value is -inf or near the dtype's lowest value. Its mean and std
    are those of the fill value (infinite, or ~1e38), so statistics say nothing about its pattern."""
    assert record.stats is not None
    lowest = record.stats.min
    return lowest == -math.inf or lowest <= 0.5 * _LOWEST.get(record.dtype, -1.79e308)


def _sketches_apart(a: TensorRecord, b: TensorRecord, rtol: float, atol: float) -> str | None:
    """Why the value fingerprints of ``a`` and ``b`` (TensorRecord.sketch) disagree, or None when they agree or
    cannot be compared (missing, or rows laid out otherwise). Each row group's mean and root mean square are
    aggregates of the group's elements, with :func:`aggregate_tolerance`."""
    sa, sb = a.sketch, b.sketch
    if sa is None or sb is None or a.numel != b.numel:
        return None
    if squeezed(a.shape) != squeezed(b.shape) and not split_alike(a.shape, b.shape):
        return None  # rows in another order (dims re-ordered) are cut into other groups
    # groups are equal runs of the elements in order: a split last dim cuts the same elements into more rows and
    # more groups, whose sums add up to the coarser side's when its groups are unions of them
    merged_a, merged_b = _merged(sa, len(sb)), _merged(sb, len(sa))
    if merged_a is None or merged_b is None:
        return None
    sa, sb = merged_a, merged_b
    groups = len(sa) // 2
    size = a.numel / groups
    epsilon = _epsilon(a.dtype, b.dtype)
    for g in range(groups):
        sums = (sa[g], sb[g])
        squares = (sa[groups + g], sb[groups + g])
        if not all(math.isfinite(x) for x in (*sums, *squares)):
            continue
        mean_a, mean_b = sums[0] / size, sums[1] / size
        rms_a, rms_b = math.sqrt(max(squares[0], 0.0) / size), math.sqrt(max(squares[1], 0.0) / size)
        allowed = aggregate_tolerance(int(size), rms_a, rtol, atol, epsilon)
        for what, x, y in (("mean", mean_a, mean_b), ("root mean square", rms_a, rms_b)):
            if abs(y - x) > allowed:
                where = f"row group {g + 1} of {groups}"
                return f"{what} of {where} {x:.8g} vs {y:.8g} (the value fingerprint; statistics of the whole agree)"
    return None


def _merged(sketch: tuple[float, ...], other: int) -> tuple[float, ...] | None:
    """``sketch`` with its groups summed into as many as ``other`` (a sketch's length) holds, when they divide
    evenly; None when they cannot."""
    if len(sketch) <= other:
        return sketch if other % len(sketch) == 0 else None
    if len(sketch) % other:
        return None
    groups, merged = len(sketch) // 2, other // 2
    run = groups // merged
    sums = [math.fsum(sketch[g * run : (g + 1) * run]) for g in range(merged)]
    squares = [math.fsum(sketch[groups + g * run : groups + (g + 1) * run]) for g in range(merged)]
    return (*sums, *squares)


def _from_stats(a: TensorRecord, b: TensorRecord, base: dict[str, Any]) -> TensorDiff:
    assert a.stats is not None and b.stats is not None
    if _mask_like(a) and _mask_like(b):
        reason = "masks (-inf or the dtype's lowest value): their statistics cannot tell patterns apart"
        return TensorDiff(**base, basis="none", status="unchecked", reason=reason)
    deltas = _stat_deltas(a.stats, b.stats)
    point_a, point_b = StatPoint.of(a), StatPoint.of(b)
    assert point_a is not None and point_b is not None
    worst = point_a.first_outside(point_b, base["rtol"], base["atol"])
    if worst is None:
        apart = _sketches_apart(a, b, base["rtol"], base["atol"])
        if apart is None:
            return TensorDiff(**base, basis="stats", status="equal", stat_deltas=deltas)
        return TensorDiff(**base, basis="stats", status="diverged", stat_deltas=deltas, reason=apart)
    x, y = _stat_values(a.stats)[worst], _stat_values(b.stats)[worst]
    reason = f"{STAT_NAMES[worst]} {x:.8g} vs {y:.8g}"
    if worst < 2:
        reason += f" (beyond the tolerance of a {STAT_NAMES[worst]} of {a.numel} elements)"
    if a.nan_count != b.nan_count or a.inf_count != b.inf_count:
        reason += f" (nan/inf {a.nan_count}/{a.inf_count} vs {b.nan_count}/{b.inf_count})"
    return TensorDiff(**base, basis="stats", status="diverged", stat_deltas=deltas, reason=reason)


# -- full values ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Elementwise:
    outside: int
    max_abs: float
    max_rel: float
    cosine: float
    shift: float  # the largest systematic shift of the mean, as a multiple of its tolerance (see _shift)
    atol: float  # the absolute tolerance applied (normwise: raised to rtol times the largest differing magnitude)


_LOWEST = {"torch.float16": -65504.0, "torch.bfloat16": -3.3895e38, "torch.float32": -3.4028e38}


def _masked(t: Any, dtype: str) -> Any:
    """Elements that mark masked positions: -inf, or near the dtype's lowest value (``finfo.min``), the two
    conventions of additive attention masks."""
    lowest = _LOWEST.get(dtype, -1.79e308)
    return t <= 0.5 * lowest


SLICE = 1 << 15
"""Elements measured at a time: a slice's float64 temporaries stay in the processor's cache, where the twenty-odd
elementwise passes over a whole tensor of logits (tens of megabytes each) would each go to memory."""


class _Sums:
    """What :func:`_elementwise` gathers over the slices of two flat tensors, in one pass (see there)."""

    def __init__(self) -> None:
        self.differs = False
        self.masked_alike = False
        self.largest_differing = 0.0
        self.max_abs = self.max_rel = 0.0
        self.aa = self.bb = self.ab = 0.0
        self.magnitude = 0.0
        self.always_outside = 0
        self.outside = 0  # finite elements outside the given tolerance, counted where it is final
        self.beyond: list[tuple[Any, Any]] = []  # (|b - a|, |a|) of those outside the given atol, where it grows
        self.recount: list[int] = []  # where it grows, the slices (by start) of finite elements outside it
        # per slice, of b - a and of (b - a) * sign(a): (elements, mean, sum of squared deviations from it)
        self.differences: list[tuple[int, float, float]] = []
        self.signed: list[tuple[int, float, float]] = []


def _combined(slices: Sequence[tuple[int, float, float]], n: int) -> tuple[float, float]:
    """The mean of ``n`` values and the sum of their squared deviations from it, from each slice's (Chan et al.)."""
    mean = sum(size * part for size, part, _ in slices) / n
    # squared by a product: values beyond float64's range give inf, where ``**`` raises OverflowError
    return mean, sum(squares + size * (part - mean) * (part - mean) for size, part, squares in slices)


def _slices(a: Any, b: Any) -> Iterator[tuple[Any, Any]]:
    """``a`` and ``b`` (flat) in slices of :data:`SLICE` elements, each as float64."""
    for start in range(0, a.numel(), SLICE):
        yield a[start : start + SLICE].double(), b[start : start + SLICE].double()


def _deviations(values: Any) -> tuple[float, float]:
    """The mean of ``values`` and the sum of their squared deviations from it (two reductions, no temporaries)."""
    return float(values.mean().item()), float(values.var(correction=0).item()) * int(values.numel())


def _ordinary(ca: Any, cb: Any, dtypes: tuple[str, str] | None) -> bool:
    """Both slices finite (a NaN or an infinity shows in their extremes) and, with ``dtypes``, none at a masked
    position: the common case, where :func:`_elementwise` needs none of its masks."""
    for values, dtype in zip((ca, cb), dtypes or ("", ""), strict=True):
        if values.numel() == 0:
            return False
        low, high = values.aminmax()
        low_, high_ = float(low.item()), float(high.item())
        if not (math.isfinite(low_) and math.isfinite(high_)) or (
            dtypes and low_ <= 0.5 * _LOWEST.get(dtype, -1.79e308)
        ):
            return False
    return True


def _ordinary_largest(a: Any, b: Any, dtypes: tuple[str, str]) -> float | None:
    """The largest magnitude of ``a`` among the elements that differ, read in the tensors' own dtypes (exactly),
    when every element of both is :func:`_ordinary`; else None."""
    if not (a.is_floating_point() and b.is_floating_point()) or not _ordinary(a, b, dtypes):
        return None
    return float(a.abs().masked_fill(a == b, 0).max().item())


def _add_slice(
    sums: _Sums,
    fa: Any,
    fb: Any,
    diff: Any | None,
    comparable: Any | None,
    rtol: float,
    atol: float,
    *,
    start: int = 0,
    largest: bool = False,
    deferred: bool = False,
) -> None:
    """Adds one slice to ``sums``: ``fa``, ``fb`` the values (0 where not finite in both), ``diff`` their absolute
    differences (0 where the same, infinite where only one is finite; None: ``|fb - fa|``, every element being finite
    and none masked), ``comparable`` the elements finite in both that differ (None: all of them). ``largest`` also
    gathers the largest magnitude of ``fa`` among the elements that differ; ``deferred``: ``atol`` is not final
    (normwise), so the elements beyond it are counted at the end (the slice, from ``start``, again). As few passes
    as the sums allow: this is where measuring spends its time."""
    scale = fa.abs()
    size = int(fa.numel())
    delta = fb - fa
    diff = delta.abs() if diff is None else diff
    sums.magnitude += float(scale.sum().item())
    if not bool(diff.any().item()):  # identical here (the common case): only the norms to add
        squares = float((fa * fa).sum().item())
        sums.aa, sums.bb, sums.ab = sums.aa + squares, sums.bb + squares, sums.ab + squares
        sums.differences.append((size, 0.0, 0.0))
        sums.signed.append((size, 0.0, 0.0))
        return
    sums.differs = True
    if largest:
        differing = float(scale.masked_fill(diff == 0, 0.0).max().item())
        sums.largest_differing = max(sums.largest_differing, differing)
    sums.aa += float((fa * fa).sum().item())
    sums.bb += float((fb * fb).sum().item())
    sums.ab += float((fa * fb).sum().item())
    max_abs = float(diff.max().item())
    sums.max_abs = max(sums.max_abs, max_abs)
    # 0/0 where both are 0 (the same); anything else over 0 is infinite
    sums.max_rel = max(sums.max_rel, float((diff / scale).nan_to_num(nan=0.0, posinf=math.inf).max().item()))
    if max_abs > atol:  # else no element lies beyond atol + rtol * |a|, nor beyond a larger atol
        beyond = ~(diff <= atol + rtol * scale)
        if comparable is not None:
            beyond = beyond & comparable
        if not deferred:  # the final atol: counted now
            sums.outside += int(beyond.sum().item())
        elif comparable is None:  # atol grows at the end (normwise): the slice is counted again then
            sums.recount.append(start)
        elif bool(beyond.any().item()):  # as above, where masks would have to be made again: kept
            sums.beyond.append((diff[beyond], scale[beyond]))
    sums.differences.append((size, *_deviations(delta)))
    sums.signed.append((size, *_deviations(delta * fa.sign())))


def _recounted(a: Any, b: Any, starts: Sequence[int], rtol: float, atol: float) -> int:
    """The elements beyond ``atol + rtol * |a|`` in the ordinary slices that begin at ``starts``."""
    outside = 0
    for start in starts:
        ca, cb = a[start : start + SLICE].double(), b[start : start + SLICE].double()
        outside += int((~((cb - ca).abs() <= atol + rtol * ca.abs())).sum().item())
    return outside


def _add_irregular_slice(
    sums: _Sums, ca: Any, cb: Any, rtol: float, atol: float, dtypes: tuple[str, str], normwise: bool
) -> None:
    """Adds a slice that holds a NaN, an infinity or (with ``dtypes``) a masked position: see :func:`_elementwise`."""
    finite = ca.isfinite() & cb.isfinite()
    lowest = (_masked(ca, dtypes[0]), _masked(cb, dtypes[1])) if normwise or dtypes[0] else None
    if normwise and lowest is not None:
        differing = (ca != cb) & finite & ~lowest[0] & ~lowest[1]
        if bool(differing.any().item()):
            largest = float(ca.masked_fill(~differing, 0.0).abs().max().item())
            sums.largest_differing = max(sums.largest_differing, largest)
    same = (ca == cb) | (ca.isnan() & cb.isnan())
    if dtypes[0] and lowest is not None:
        masked = lowest[0] & lowest[1]
        if bool(masked.any().item()):
            same = same | masked
            sums.masked_alike = sums.masked_alike or bool((masked & (ca != cb)).any().item())
            ca, cb = ca.masked_fill(masked, 0.0), cb.masked_fill(masked, 0.0)
            finite = finite | masked  # set to 0 in both
    # over the elements finite in both; elementwise products and sums only (BLAS dot and boolean indexing of
    # whole tensors stall on a busy machine's thread pool)
    diff = (cb - ca).abs().masked_fill(same, 0.0).nan_to_num(nan=math.inf, posinf=math.inf)
    sums.always_outside += int((~same & ~finite).sum().item())
    fa, fb = ca.masked_fill(~finite, 0.0), cb.masked_fill(~finite, 0.0)
    _add_slice(sums, fa, fb, diff, finite & ~same, rtol, atol, deferred=normwise)


def _elementwise(
    a: Any,
    b: Any,
    rtol: float,
    atol: float,
    epsilon: float,
    dtypes: tuple[str, str] = ("", ""),
    *,
    normwise: bool = False,
) -> tuple[_Elementwise, _Sums]:
    """Differences of two flat tensors in float64, using tensor methods only, a slice at a time and in one pass.

    An element is the same in both when equal, NaN in both, the same infinity, or (with ``dtypes``) masked in both
    (:func:`_masked`, set to 0 first); a non-finite element is close only to itself. With ``normwise``, ``atol`` is
    at least ``rtol`` times the largest magnitude of ``a`` among the elements that differ (finite, masked in
    neither): read over the whole tensor the first time it matters (an element beyond the given ``atol``) where every
    element is ordinary (:func:`_ordinary_largest`), else known only at the end, so the finite elements beyond the
    given ``atol`` are counted then."""
    sums = _Sums()
    n = a.numel()
    ordinary: float | None = None  # every element ordinary, and the largest differing magnitude: atol is final
    tried = not normwise
    for start, (ca, cb) in zip(range(0, n, SLICE), _slices(a, b), strict=True):
        if ordinary is not None or _ordinary(ca, cb, dtypes if normwise or dtypes[0] else None):
            _add_slice(sums, ca, cb, None, None, rtol, atol, start=start, largest=normwise, deferred=normwise)
        else:
            _add_irregular_slice(sums, ca, cb, rtol, atol, dtypes, normwise)
        if not tried and sums.recount:  # the final atol matters now
            tried = True
            ordinary = _ordinary_largest(a, b, dtypes)
            if ordinary is not None:
                sums.largest_differing, atol, normwise = ordinary, max(atol, rtol * ordinary), False
                sums.outside += _recounted(a, b, sums.recount, rtol, atol)
                sums.recount.clear()
    if normwise:
        atol = max(atol, rtol * sums.largest_differing)
    if not sums.differs:  # identical: exactly 1, not 1 up to rounding
        return _Elementwise(0, 0.0, 0.0, 1.0, 0.0, atol), sums
    outside = (
        sums.always_outside
        + sums.outside
        + sum(int((~(diff <= atol + rtol * scale)).sum().item()) for diff, scale in sums.beyond)
    )
    outside += _recounted(a, b, sums.recount, rtol, atol)
    found = _Elementwise(
        outside, sums.max_abs, sums.max_rel, _cosine(sums, a, b), _shift(sums, n, rtol, atol, epsilon), atol
    )
    return found, sums


def _cosine(sums: _Sums, a: Any, b: Any) -> float:
    """The cosine of ``a`` and ``b`` (flat) over the elements finite in both, from the sums; where a sum of squares
    overflows float64 (elements from about 1e154 up), read again with each tensor scaled by its largest finite
    magnitude, which leaves the cosine as it is."""
    if not all(math.isfinite(total) for total in (sums.aa, sums.bb, sums.ab)):
        both = a.isfinite() & b.isfinite()
        x, y = (t.double().masked_fill(~both, 0.0) for t in (a, b))
        x, y = (t / t.abs().max().clamp_min(math.ulp(0.0)) for t in (x, y))
        sums = _Sums()
        sums.aa, sums.bb, sums.ab = (float((p * q).sum().item()) for p, q in ((x, x), (y, y), (x, y)))
    norms = math.sqrt(sums.aa) * math.sqrt(sums.bb)
    if norms > 0:
        return max(-1.0, min(1.0, sums.ab / norms))
    return 1.0 if sums.aa == sums.bb == 0 else 0.0


def _shift(sums: _Sums, n: int, rtol: float, atol: float, epsilon: float) -> float:
    """How far the differences lean one way, as a multiple of what random differences allow (> 1: systematic).

    Two means are tested: of ``b - a`` (an offset) and of ``(b - a) * sign(a)`` (a scaling: a norm's eps, a wrong
    constant), each against :func:`aggregate_tolerance`. Honest rounding differences between two implementations
    cancel out in both; a small bug that moves every element by less than the element tolerance does not."""
    if n < 2:
        return 0.0
    magnitude = sums.magnitude / n
    allowed = aggregate_tolerance(n, magnitude, rtol, atol, epsilon)
    if allowed <= 0:
        return 0.0
    (offset, offset_squares), (scaling, scaling_squares) = _combined(sums.differences, n), _combined(sums.signed, n)
    offset, scaling = abs(offset), abs(scaling)
    ratio = max(offset, scaling) / allowed
    # the same two means against their own spread: a bug far below the element tolerance (a norm's eps) still leans
    # far beyond what its own differences scatter by, and beyond a few units of rounding
    floor = _ROUNDING_UNITS * epsilon * magnitude
    if floor > 0:
        for mean, squares in ((offset, offset_squares), (scaling, scaling_squares)):
            spread = math.sqrt(squares / (n - 1))
            if spread > 0:
                t = mean / (spread / math.sqrt(n))
                ratio = max(ratio, min(mean / floor, t / _LEANING_T))
    return ratio


_ROTARY_FRACTIONS = ((1, 4), (2, 5), (1, 2), (3, 4))
"""Partial rotary embeddings rotate this fraction of each head's channels (GPT-NeoX and GPT-J a quarter, Phi-2 two
fifths, ChatGLM half) and pass the rest through unchanged."""


def _last_dim_permutations(shape: tuple[int, ...]) -> list[tuple[str, Any]]:
    """Candidate re-orderings of the last dimension that a port may legitimately use, as (description, function
    from a tensor of ``shape`` to A's layout): the per-head interleaved <-> half-split rotary layouts, for every even
    head size that divides the last dimension, of all of a head's channels or of its rotated part (partial rotary)."""
    if not shape or shape[-1] < 4:
        return []
    width = shape[-1]
    candidates: list[tuple[str, Any]] = []
    for head in range(2, width + 1, 2):
        if width % head:
            continue
        heads = width // head
        rotated = [head] + [head * n // d for n, d in _ROTARY_FRACTIONS if head * n % d == 0 and head * n // d % 2 == 0]
        for turned in dict.fromkeys(part for part in rotated if part >= 2):

            def to_half(t: Any, heads: int = heads, head: int = head, turned: int = turned) -> Any:
                split = t.reshape(*t.shape[:-1], heads, head)
                front = split[..., :turned].reshape(*split.shape[:-1], turned // 2, 2).transpose(-1, -2)
                return (
                    split.clone()
                    .index_copy_(-1, _first(split, turned), front.reshape(*split.shape[:-1], turned))
                    .reshape(t.shape)
                )

            def to_interleaved(t: Any, heads: int = heads, head: int = head, turned: int = turned) -> Any:
                split = t.reshape(*t.shape[:-1], heads, head)
                front = split[..., :turned].reshape(*split.shape[:-1], 2, turned // 2).transpose(-1, -2)
                return (
                    split.clone()
                    .index_copy_(-1, _first(split, turned), front.reshape(*split.shape[:-1], turned))
                    .reshape(t.shape)
                )

            of = f"head size {head}" if turned == head else f"the first {turned} of each head of {head}"
            candidates.append((f"per-head interleaved->half-split layout ({of})", to_half))
            candidates.append((f"per-head half-split->interleaved layout ({of})", to_interleaved))
    return candidates


PERMUTED = "permutation of the last dim"
"""The layout of a re-ordering found by matching columns (:func:`_general_permutation`)."""


def _first(like: Any, count: int) -> Any:
    """The indices 0..count-1 as an integer tensor made from ``like``."""
    return like.new_zeros(0).long().new_tensor(range(count))


def _general_permutation(ta: Any, tb: Any, rtol: float, atol: float) -> Any | None:
    """The permutation ``p`` of the last dimension with ``tb[..., p] ≈ ta``, when there is one (found by matching
    columns on their sums and sums of squares, then checked element by element), else None."""
    width = ta.shape[-1]
    rows = ta.numel() // max(width, 1)
    if width < 2 or rows < 2 or width > 16384:  # one row: any equal multiset would do, no evidence of a layout
        return None
    a = ta.detach().reshape(rows, width).double()
    b = tb.detach().reshape(rows, width).double()
    if not bool(a.isfinite().all().item()) or not bool(b.isfinite().all().item()):
        return None
    # a column's signature: its values in a fixed random direction (one number that separates distinct columns)
    direction = _fixed_direction(rows, a)
    key_a, key_b = direction @ a, direction @ b
    order_a, order_b = key_a.argsort(), key_b.argsort()
    permutation = order_b[order_a.argsort()]  # column j of A is column permutation[j] of B
    if bool((permutation == permutation.new_tensor(range(width))).all().item()):
        return None  # the identity: nothing to allow for
    return permutation if _within(a, b[:, permutation], rtol, atol) else None


def _fixed_direction(rows: int, like: Any) -> Any:
    # deterministic pseudo-random weights without a generator: a low-discrepancy sequence in [0.5, 1.5)
    index = like.new_tensor(range(rows)) if rows else like.new_zeros(0)
    return ((index * 0.6180339887498949) % 1.0) + 0.5


def _from_values(ta: Any, tb: Any, base: dict[str, Any], normwise: bool, layout: str | None = None) -> TensorDiff:
    """Differences of two tensors whose values lie in the same order (equal shapes up to size-1 dimensions), in
    float64, using tensor methods only. When they differ only by a re-ordering of the last dimension (a rotary
    layout, a permuted projection), they are equal up to it, and ``equivalence`` says so. ``normwise``: ``atol`` is
    at least ``rtol`` times the largest magnitude of ``a`` (see the module docstring). ``layout``: the only
    re-ordering allowed for ("" none; None any)."""
    rtol, atol = base["rtol"], base["atol"]
    epsilon = _epsilon(base["dtype_a"], base["dtype_b"])
    equivalence = base.pop("equivalence", "")
    a = ta.detach().reshape(-1)
    b = tb.detach().reshape(-1)
    dtypes = (base["dtype_a"], base["dtype_b"])
    # normwise: over the elements that differ, not over a mask's stand-ins for minus infinity that both share
    found, sums = _elementwise(a, b, rtol, atol, epsilon, dtypes, normwise=normwise)
    atol = found.atol
    if found.outside == 0 and sums.masked_alike:
        equivalence = _join(equivalence, "masked positions (-inf and the dtype's lowest value) compared alike")
    reorderable = ta.is_floating_point() and tb.is_floating_point()  # ids in another order are other ids
    same_rows = ta.dim() and ta.shape[-1:] == tb.shape[-1:] and ta.numel() == tb.numel()
    if found.outside and layout != "" and reorderable and same_rows:  # "": no re-ordering allowed for
        shaped = ta.detach(), tb.detach().reshape(ta.shape)
        found, equivalence = _reordered(*shaped, found, equivalence, base, layout, epsilon)
    if found.outside:
        status: Status = "diverged"
        reason = f"{found.outside} of {a.numel()} elements outside tolerance, max |Δ| {found.max_abs:.3g}"
    elif found.shift > 1.0:
        status = "diverged"
        reason = (
            f"every element within tolerance, but the differences lean one way: a systematic shift "
            f"{found.shift:.1f}x what rounding allows over {a.numel()} elements (max |Δ| {found.max_abs:.3g})"
        )
    else:
        status, reason = "equal", ""
    return TensorDiff(
        **base,
        basis="values",
        status=status,
        max_abs=found.max_abs,
        max_rel=found.max_rel,
        cosine=found.cosine,
        outside=found.outside,
        reason=reason,
        equivalence=equivalence,
    )


def _reordered(
    ta: Any, tb: Any, found: _Elementwise, equivalence: str, base: dict[str, Any], layout: str | None, epsilon: float
) -> tuple[_Elementwise, str]:
    """``found`` and ``equivalence`` for ``tb`` (``ta``'s shape) re-ordered along its last dimension, when a
    re-ordering ``layout`` allows (None: any) makes it agree with ``ta``; ``base["layout"]`` then names it. Each
    candidate is refused on the first rows before the whole tensor is read, and all of them at once when those rows
    do not hold the same values (:func:`_may_be_reordered`)."""
    rtol, atol = base["rtol"], found.atol
    head_rows = _first_rows(ta).double(), _first_rows(tb).double()
    if not _may_be_reordered(*head_rows, rtol, atol):
        return found, equivalence
    shaped_a, shaped_b = ta.double(), tb.double()
    for description, reorder in _last_dim_permutations(tuple(ta.shape)):
        if layout is not None and description != layout:
            continue
        if not _within(head_rows[0], reorder(head_rows[1]), rtol, atol):
            continue
        trial, _ = _elementwise(shaped_a.reshape(-1), reorder(shaped_b).reshape(-1), rtol, atol, epsilon)
        if trial.outside == 0 and trial.shift <= 1.0:
            base["layout"] = description
            return trial, _join(equivalence, f"equal up to a {description}")
    permutation = _general_permutation(shaped_a, shaped_b, rtol, atol) if layout in (None, PERMUTED) else None
    if permutation is not None:
        trial, _ = _elementwise(shaped_a.reshape(-1), shaped_b[..., permutation].reshape(-1), rtol, atol, epsilon)
        if trial.outside == 0 and trial.shift <= 1.0:
            base["layout"] = PERMUTED
            return trial, _join(equivalence, f"equal up to a {PERMUTED}")
    return found, equivalence


def _first_rows(t: Any) -> Any:
    return t.reshape(-1, t.shape[-1])[:4]


def _may_be_reordered(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """Whether a re-ordering of the last dimension could make rows ``b`` agree with rows ``a``: a re-ordering keeps
    each row's values, and matching them in sorted order gives the smallest largest difference of any matching, so
    when that exceeds the row's largest tolerance no re-ordering agrees (one pass refuses them all)."""
    bound = atol + rtol * a.abs().amax(-1, keepdim=True)
    return bool(((b.sort(-1).values - a.sort(-1).values).abs() <= bound).all().item())


def _within(a: Any, b: Any, rtol: float, atol: float) -> bool:
    return bool(((b - a).abs() <= atol + rtol * a.abs()).all().item())


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second


def padding(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int] | None:
    """``(dim, size)`` when ``b`` is ``a`` with one dimension made larger (nanoGPT and litgpt pad the vocabulary of
    their head, 50257 to 50304, and cut the logits after), up to size-1 dims (a vLLM style port's head over its
    tokens flattened, ``[T, V']`` for ``[1, T, V]``): ``dim`` is B's, along which ``size`` entries are A's (the
    first, or the last where a port pads in front)."""
    found = _padded_dim(a, b)
    if found is not None:
        return found
    found = _padded_dim(squeezed(a), squeezed(b))
    if found is None:
        return None
    dim, size = found
    return [k for k, n in enumerate(b) if n != 1][dim], size


def _padded_dim(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int] | None:
    if len(a) != len(b):
        return None
    apart = [dim for dim, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(apart) != 1 or not 0 < a[apart[0]] < b[apart[0]]:  # an empty tensor shares nothing to compare
        return None
    return apart[0], a[apart[0]]


def _base(name_a: str, a: TensorRecord, name_b: str, b: TensorRecord, rtol: float, atol: float) -> dict[str, Any]:
    """The fields every :class:`TensorDiff` of the pair shares."""
    return {
        "name_a": name_a,
        "name_b": name_b,
        "shape_a": a.shape,
        "shape_b": b.shape,
        "dtype_a": a.dtype,
        "dtype_b": b.dtype,
        "rtol": rtol,
        "atol": atol,
    }


def measure(
    name_a: str,
    a: TensorRecord,
    name_b: str,
    b: TensorRecord,
    tolerance: Tolerance,
    values: tuple[Any, Any] | None = None,
    *,
    any_dims_order: bool = True,
    layout: str | None = None,
) -> TensorDiff:
    """Compare two tensor records; ``values`` holds both full tensors when they are available. Without
    ``any_dims_order`` (the model's own output, which its caller reads as it is laid out), the same dims in another
    order are another shape. ``layout``: the only re-ordering of the last dimension allowed for ("" none; None any
    that makes the values equal)."""
    base = _base(name_a, a, name_b, b, *tolerance.for_dtypes(a.dtype, b.dtype))
    orders: list[tuple[int, ...]] = []
    split = False
    if a.shape != b.shape:
        orders = dims_orders(a.shape, b.shape) if any_dims_order else []
        split = not orders and any_dims_order and split_alike(a.shape, b.shape)
        if squeezed(a.shape) != squeezed(b.shape) and not orders and not split:
            pad = padding(a.shape, b.shape)
            if pad is not None and values is not None:  # compared on what the two hold alike
                dim, size = pad
                ta, tb = values
                normwise = tolerance.atol is None
                padded = f"B's dim {dim} padded from {size} to {b.shape[dim]}"
                first = _from_values(
                    ta,
                    tb.narrow(dim, 0, size),
                    {**base, "equivalence": f"{padded}: its first {size} compared"},
                    normwise=normwise,
                    layout=layout,
                )
                if first.status != "diverged":
                    return dataclasses.replace(first, padded=True)
                last = _from_values(  # padded in front (reserved ids first, a causal conv's frames cut from the left)
                    ta,
                    tb.narrow(dim, b.shape[dim] - size, size),
                    {**base, "equivalence": f"{padded}: its last {size} compared"},
                    normwise=normwise,
                    layout=layout,
                )
                if last.status != "diverged":
                    return dataclasses.replace(last, padded=True)
                return min((first, last), key=lambda d: d.outside or 0)  # the nearer alignment tells the departure
            reason = f"shape {list(a.shape)} vs {list(b.shape)}"
            return TensorDiff(**base, basis="none", status="diverged", reason=reason, padded=pad is not None)
        if split:
            base["equivalence"] = f"shapes {list(a.shape)} and {list(b.shape)}: the same elements, a last dim split"
        elif not orders:
            base["equivalence"] = f"shapes {list(a.shape)} and {list(b.shape)} differ only by size-1 dims"
        else:
            base["equivalence"] = f"shapes {list(a.shape)} and {list(b.shape)}: the same dims in another order"
    if values is not None:
        ta, tb = values
        if split:  # the same elements in the same order: B's laid out in A's shape
            tb = tb.reshape(ta.shape)
        if not orders:
            return _from_values(ta, tb, base, normwise=tolerance.atol is None, layout=layout)
        # B's values laid out as A holds them. When two dims have the same size, the shapes allow several orders:
        # the one under which the values agree is the port's layout (a transposition of two dims that A and B lay
        # out alike is not among them: equal shapes are compared as they are); none agreeing, the first is shown
        ta = ta.reshape(squeezed(a.shape))
        tb = tb.reshape(squeezed(b.shape))
        found = []
        for order in orders:  # (each trial is given its own copy of ``base``: it takes the equivalence out of it)
            laid_out = tb.permute(order).contiguous()
            found.append(_from_values(ta, laid_out, dict(base), normwise=tolerance.atol is None, layout=layout))
            if found[-1].status == "equal":
                return found[-1]
        return found[0]
    if a.stats is not None and b.stats is not None:
        return _from_stats(a, b, base)
    if a.stats is None and b.stats is None and not orders:
        whole = _repr_integers(a), _repr_integers(b)
        if whole[0] is not None and whole[1] is not None:
            return _from_integers(whole[0], whole[1], base)
        if _comparable_integer_sketches(a, b):
            apart = _sketches_apart(a, b, 0.0, 0.0)
            status: Status = "equal" if apart is None else "diverged"
            reason = "" if apart is None else apart.partition(" (")[0] + " (the value fingerprint of integers)"
            return TensorDiff(**base, basis="stats", status=status, reason=reason)
    reason = "" if a.stats is None and b.stats is None else f"no statistics in {'A' if a.stats is None else 'B'}"
    return TensorDiff(**base, basis="none", status="unchecked", reason=reason)


# -- attention masks of two conventions ---------------------------------------------------------------------------


def mask_record(record: TensorRecord) -> bool:
    """An attention mask: a boolean tensor, or an additive one (0 where kept, -inf or the dtype's lowest value where
    masked: its largest value is 0)."""
    if record.dtype == "torch.bool":
        return True
    return record.stats is not None and record.stats.max == 0.0 and _mask_like(record)


def broadcastable(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape ``a`` and ``b`` broadcast to, or None when they do not (a mask ``[1, 1, T, T]`` against one of
    ``[B, 1, T, T]``: its consumer broadcasts it over the batch)."""
    rank = max(len(a), len(b))
    padded_a, padded_b = (1,) * (rank - len(a)) + a, (1,) * (rank - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(padded_a, padded_b)):
        return None
    return tuple(max(x, y) for x, y in zip(padded_a, padded_b))


def _kept(t: Any, dtype: str) -> Any | None:
    """The positions a mask keeps (a boolean tensor), or None when an additive mask also holds other values than 0
    (a position bias added to it): not a mask alone."""
    if dtype == "torch.bool":
        return t
    masked = _masked(t, dtype)
    if bool((t.masked_fill(masked, 0.0) != 0).any().item()):
        return None
    return masked.logical_not()


def measure_masks(
    name_a: str, a: TensorRecord, name_b: str, b: TensorRecord, values: tuple[Any, Any] | None
) -> TensorDiff:
    """Two attention masks given at the same place in other conventions (:func:`mask_record`): a boolean one and an
    additive one, or shapes that differ by a dimension one of them broadcasts. They are compared by the positions
    they keep, broadcast to one shape; a boolean mask may mark the kept positions or the masked ones (SDPA's
    ``attn_mask`` against ``masked_fill``), so either reading that matches is equal. Statistics cannot tell patterns
    apart: without both values the pair is unchecked."""
    base = _base(name_a, a, name_b, b, 0.0, 0.0)
    shape = broadcastable(a.shape, b.shape)
    kept = None if values is None or shape is None else (_kept(values[0], a.dtype), _kept(values[1], b.dtype))
    if shape is None or kept is None or kept[0] is None or kept[1] is None:
        reason = "masks in other conventions: compared by their values only"
        return TensorDiff(**base, basis="none", status="unchecked", reason=reason)

    def spread(t: Any) -> Any:
        return t.reshape((1,) * (len(shape) - t.dim()) + tuple(t.shape)).expand(*shape)

    keep_a, keep_b = spread(kept[0]), spread(kept[1])
    apart = int((keep_a != keep_b).sum().item())
    equivalence = "masks compared by the positions they keep"
    if apart and "torch.bool" in (a.dtype, b.dtype) and bool((keep_a == keep_b.logical_not()).all().item()):
        apart, equivalence = 0, "masks compared by the positions they keep (True marking masked positions)"
    numel = math.prod(shape)
    if apart:
        reason = f"masks: {apart} of {numel} positions kept on one side only"
        return TensorDiff(**base, basis="values", status="diverged", max_abs=1.0, outside=apart, reason=reason)
    return TensorDiff(**base, basis="values", status="equal", max_abs=0.0, outside=0, equivalence=equivalence)


# -- integers from their repr lines ----------------------------------------------------------------------------------

_INTEGER = re.compile(r"-?\d+|True|False")
_INTEGER_DTYPES = {f"torch.{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)} | {"torch.bool"}


def _repr_integers(record: TensorRecord) -> list[int] | None:
    """Every element of an integer or boolean tensor, read from its repr lines (``values="repr"``), or None when
    the repr does not hold them all (torch summarises a large tensor with ``...``) or there is none."""
    if record.dtype not in _INTEGER_DTYPES or not record.value:
        return None
    text = "\n".join(record.value)
    if "..." in text or not text.startswith("tensor("):
        return None
    body = text[len("tensor(") :]
    body = body[: body.rindex("]") + 1] if "[" in body else re.split(r"[,)]", body, maxsplit=1)[0]
    numbers = [1 if word == "True" else 0 if word == "False" else int(word) for word in _INTEGER.findall(body)]
    return numbers if len(numbers) == record.numel else None


def _comparable_integer_sketches(a: TensorRecord, b: TensorRecord) -> bool:
    """Both integer (or boolean) tensors with value fingerprints laid out alike: compared exactly."""
    return (
        a.dtype in _INTEGER_DTYPES
        and b.dtype in _INTEGER_DTYPES
        and a.sketch is not None
        and b.sketch is not None
        and len(a.sketch) == len(b.sketch)
        and a.numel == b.numel
        and a.shape[-1:] == b.shape[-1:]
    )


def _from_integers(a: list[int], b: list[int], base: dict[str, Any]) -> TensorDiff:
    """Two integer tensors compared exactly, element by element (ids, positions, buckets)."""
    apart = [abs(y - x) for x, y in zip(a, b) if x != y]
    largest = float(max(apart, default=0))
    if not apart:
        return TensorDiff(**base, basis="values", status="equal", max_abs=0.0, outside=0)
    reason = f"{len(apart)} of {len(a)} elements differ (integers, read from their repr), max |Δ| {largest:.3g}"
    return TensorDiff(**base, basis="values", status="diverged", max_abs=largest, outside=len(apart), reason=reason)
