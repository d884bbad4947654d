"""Tensor statistics: the only numeric code of graphtrace.

The transformers format writes mean, std, min and max of float16/float32/bfloat16 tensors as the ``repr`` of the 0-d
result (``"tensor(-8.1495e-04)"``, ``"tensor(1.5020e-05, dtype=torch.float16)"``) under ``sci_mode=True``. Calling
four reductions and four ``repr``s per tensor is most of the reference's cost, so the common case (a plain CPU
tensor, no autograd history in play) computes the four reductions in the tensor's own dtype, fetches them in one
host transfer and formats them the way torch's printer does. Anything unusual (another device, a tensor subclass,
autograd recording) takes the reference's own path so that the strings stay identical.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from torch._tensor_str import PRINT_OPTS

from graphtrace.engine import std_bound
from graphtrace.model import Stats
from graphtrace.reprs import sanitize_repr, spec_printoptions

__all__ = [
    "MAX_INTEGER_SKETCH",
    "NO_STATS",
    "SKETCH_GROUPS",
    "SPEC_STAT_DTYPES",
    "TensorSummary",
    "format_scalar",
    "row_sketch",
    "summarize",
]

SKETCH_GROUPS = 16
"""At most this many row groups in a value fingerprint (TensorRecord.sketch)."""

MAX_INTEGER_SKETCH = 1 << 20
"""Integer and boolean tensors of up to this many elements get a value fingerprint (ids, positions, buckets)."""

SPEC_STAT_DTYPES = frozenset({torch.float16, torch.float32, torch.bfloat16})
"""The dtypes for which transformers writes mean/std/min/max."""

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


class TensorSummary(NamedTuple):
    stats: Stats | None
    spec_stats: tuple[str, str, str, str] | None
    nan_count: int
    inf_count: int


NO_STATS = TensorSummary(None, None, 0, 0)
"""The summary of a tensor without statistics (not floating, empty, or not measured)."""


def format_scalar(value: float, dtype: torch.dtype, precision: int) -> str:
    """``repr`` of a 0-d CPU tensor of ``dtype`` holding ``value``, as torch prints it with ``sci_mode=True``."""
    if value != 0.0 and math.isfinite(value):
        body = f"{value:.{precision}e}"
    elif math.isfinite(value):  # zero: torch's integer mode, "0." / "-0."
        body = f"{value:.0f}."
    else:
        body = f"{value:.0f}"  # nan, inf, -inf
    if dtype == torch.get_default_dtype():
        return f"tensor({body})"
    return f"tensor({body}, dtype={dtype})"


_templates: dict[tuple[torch.dtype, int, torch.dtype], str] = {}


def _spec_strings(
    mean: float, std: float, low: float, high: float, dtype: torch.dtype, precision: int
) -> tuple[str, str, str, str]:
    """:func:`format_scalar` of the four statistics; when all are non-zero and finite (nearly always), through one
    cached ``%`` template each."""
    if mean and std and low and high and math.isfinite(mean + std + low + high):  # NaN and inf propagate into a sum
        default = torch.get_default_dtype()
        key = (dtype, precision, default)
        template = _templates.get(key)
        if template is None:
            suffix = "" if dtype == default else f", dtype={dtype}"
            template = _templates[key] = f"tensor(%.{precision}e{suffix})"
        return template % mean, template % std, template % low, template % high
    return (
        format_scalar(mean, dtype, precision),
        format_scalar(std, dtype, precision),
        format_scalar(low, dtype, precision),
        format_scalar(high, dtype, precision),
    )


def _needs_reference_path(tensor: torch.Tensor) -> bool:
    """True when the repr of a 0-d result would carry a suffix only torch's printer gets right."""
    return (
        type(tensor) not in _PLAIN_TENSOR_TYPES
        or not tensor.is_cpu
        or torch._C._get_default_device() != "cpu"
        or (tensor.requires_grad and torch.is_grad_enabled())
        or PRINT_OPTS.linewidth < 60
    )


def _nonfinite_counts(tensor: torch.Tensor, low: float, high: float) -> tuple[int, int]:
    # NaN propagates into min and max and Inf shows in one of them, so finite extremes prove a finite tensor.
    if math.isfinite(low) and math.isfinite(high):
        return 0, 0
    with torch.no_grad():
        counts = torch.stack([torch.isnan(tensor).sum(), torch.isinf(tensor).sum()]).tolist()
    return int(counts[0]), int(counts[1])


def _reference_summary(tensor: torch.Tensor) -> TensorSummary:
    """The reference's computation, call for call, in the caller's grad mode."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # std() of one element warns; the reference's value (nan) stays
        results = (tensor.mean(), tensor.std(), tensor.min(), tensor.max())
    with spec_printoptions():
        spec = tuple(sanitize_repr(repr(result)) for result in results)
    numbers = [float(result.item()) for result in results]
    stats = Stats(*numbers)
    return TensorSummary(stats, spec, *_nonfinite_counts(tensor, stats.min, stats.max))  # type: ignore[arg-type]


def _reductions(tensor: torch.Tensor, precision: int) -> list[float]:
    """mean, std, min, max in the tensor's own dtype (float64, or float32 for other floating dtypes), fetched in one
    host transfer off the CPU; for a large tensor of a spec dtype, std from :mod:`graphtrace.engine.std_bound` where
    it proves the printed digits, and for a mid-sized float32 one where it proves torch's value."""
    dtype = tensor.dtype
    data = tensor if dtype in SPEC_STAT_DTYPES or dtype == torch.float64 else tensor.float()
    low, high = torch.aminmax(data)
    n = data.numel()
    large = n >= std_bound.MIN_ELEMENTS and dtype in SPEC_STAT_DTYPES and data.is_contiguous()
    if large or (std_bound.MIN_DOUBLE_ELEMENTS <= n < std_bound.MIN_ELEMENTS and dtype == torch.float32):
        mean, lowest, highest = _fetch(data.mean(), low, high)
        if math.isfinite(lowest) and math.isfinite(highest):
            if large:
                std = std_bound.printed_std(data, mean, lambda value: format_scalar(value, dtype, precision))
            else:
                std = std_bound.float32_std(data, mean)
            if std is not None:
                return [mean, std, lowest, highest]
        return [mean, data.std().item(), lowest, highest]
    spread = data.std() if data.numel() > 1 else data.new_full((), math.nan)
    return _fetch(data.mean(), spread, low, high)


def _fetch(*results: torch.Tensor) -> list[float]:
    """The values of 0-d results as floats: one ``.item()`` each on the CPU (a third of the cost of stacking them),
    one transfer of them stacked elsewhere."""
    if results[0].is_cpu:
        return [result.item() for result in results]
    return list(torch.stack(results).tolist())


def summarize(tensor: torch.Tensor) -> TensorSummary:
    """Statistics and non-finite counts of ``tensor`` (empty for non-floating, empty or meta tensors: a meta tensor
    has a shape and a dtype but no values)."""
    dtype = tensor.dtype
    if not dtype.is_floating_point or tensor.numel() == 0 or tensor.layout != torch.strided or tensor.is_meta:
        return NO_STATS
    spec_dtype = dtype in SPEC_STAT_DTYPES
    if spec_dtype and _needs_reference_path(tensor):
        return _reference_summary(tensor)
    precision = PRINT_OPTS.precision
    if tensor.requires_grad:
        with torch.no_grad():
            mean, std, low, high = _reductions(tensor, precision)
    else:
        mean, std, low, high = _reductions(tensor, precision)
    stats = Stats(mean, std, low, high)
    spec = None
    if spec_dtype:
        spec = _spec_strings(mean, std, low, high, dtype, precision)
    return TensorSummary(stats, spec, *_nonfinite_counts(tensor, low, high))


_group_counts: dict[torch.Size, int] = {}


def _groups(shape: torch.Size) -> int:
    """How many row groups the sketch of a tensor of ``shape`` has; 0 when it has none (0-d, under two elements)."""
    groups = _group_counts.get(shape)
    if groups is None:
        if len(_group_counts) >= 4096:
            _group_counts.clear()
        numel = math.prod(shape)
        if not shape or numel < 2:
            groups = 0
        else:
            rows = numel // shape[-1]
            groups = next(g for g in range(min(SKETCH_GROUPS, rows), 0, -1) if rows % g == 0)
        _group_counts[shape] = groups
    return groups


def row_sketch(tensor: torch.Tensor) -> tuple[float, ...] | None:
    """The value fingerprint of ``tensor`` (see TensorRecord.sketch), or None for a complex tensor, a sparse or meta
    one. Integer and boolean tensors (ids, positions) have no statistics, but a fingerprint, summed in float64:
    exact while the sums stay below 2**53 (ids and positions: sums of squares of values below 2**26 per element, up to
    the size limit)."""
    if tensor.dtype.is_complex or tensor.layout != torch.strided or tensor.is_meta:
        return None
    if not tensor.dtype.is_floating_point and tensor.numel() > MAX_INTEGER_SKETCH:
        return None  # a large mask: two float64 copies of it, for a fingerprint no diff needs
    groups = _groups(tensor.shape)
    if not groups:
        return None
    if tensor.requires_grad and torch.is_grad_enabled():
        with torch.no_grad():
            return _sketch(tensor.detach(), groups)
    return _sketch(tensor, groups)  # no autograd in play: the same operations without a no_grad() object per tensor


def _sketch(tensor: torch.Tensor, groups: int) -> tuple[float, ...]:
    grouped = tensor.reshape(groups, -1)
    if not grouped.dtype.is_floating_point:
        grouped = grouped.double()
    elif grouped.dtype != torch.float32 and grouped.dtype != torch.float64:
        grouped = grouped.float()
    sums = grouped.sum(1).tolist()
    sums += (grouped * grouped).sum(1).tolist()  # read apart: no third tensor to join them in
    return tuple(sums)
