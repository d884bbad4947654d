"""Tensor statistics: the only numeric code of graphtrace.

The transformers format writes mean, std, min and max of float16/float32/bfloat16 tensors as the ``repr`` of the 0-d
result (``"tensor(-8.1495e-04)"``, ``"tensor(1.5020e-05, dtype=torch.float16)"``, ``device='cuda:0'`` first where
torch prints a device) under ``sci_mode=True``. Calling four reductions and four ``repr``s per tensor is most of the
reference's cost, so the common case (a plain tensor, no autograd history in play) computes the four reductions in
the tensor's own dtype and formats them the way torch's printer does. Anything unusual (a tensor subclass, autograd
recording, a narrow print width) takes the reference's own path so that the strings stay identical.

Off the CPU, capture does not read the results at once (:mod:`graphtrace.engine.step_numbers` reads a whole
step's together): :func:`queued_reductions`, :func:`nonfinite_counts` and :func:`fingerprint` only queue work on
the tensor's device, and :func:`summary_of` / :func:`sketch_of` turn the numbers read back into what a record
holds. :func:`summarize` and :func:`row_sketch` compute and read at once: on the CPU, where a read waits for
nothing, and for the unusual cases above.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch._tensor_str import PRINT_OPTS

from graphtrace.engine import std_bound
from graphtrace.model import Stats
from graphtrace.reprs import device_suffix, sanitize_repr, spec_printoptions, with_suffixes

__all__ = [
    "MAX_INTEGER_SKETCH",
    "NO_STATS",
    "SKETCH_GROUPS",
    "SPEC_STAT_DTYPES",
    "SpecFormat",
    "TensorSummary",
    "fingerprint",
    "format_scalar",
    "AT_ONCE",
    "NONE",
    "QUEUED",
    "has_stats",
    "queued_reductions",
    "stats_path",
    "row_sketch",
    "sketch_of",
    "spec_format",
    "summarize",
    "summary_of",
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


class SpecFormat(NamedTuple):
    """How torch prints a 0-d result of a tensor: precision, suffixes (device, dtype) and line width, as they were
    when the tensor was recorded."""

    precision: int
    suffixes: tuple[str, ...]
    linewidth: int
    template: str = ""
    """One ``%`` template for every non-zero finite value (empty when the value's width decides the wrapping)."""


def _form(precision: int, suffixes: tuple[str, ...], linewidth: int) -> SpecFormat:
    form = SpecFormat(precision, suffixes, linewidth)
    # the widest body of this precision decides the wrapping; every body of %e has that width or one or two less
    widest = _with_suffixes("-" + "0" * (precision + 7), form)
    narrowest = _with_suffixes("0" * (precision + 6), form)
    if widest.count("\n") != narrowest.count("\n"):
        return form
    return form._replace(template=_with_suffixes(f"%.{precision}e", form))


_formats: dict[tuple[object, ...], SpecFormat] = {}


def spec_format(tensor: torch.Tensor) -> SpecFormat:
    """The :class:`SpecFormat` of ``tensor``'s 0-d results now (torch's ``_str_intern`` rules for a plain tensor)."""
    dtype = tensor.dtype
    default_device = torch._C._get_default_device()
    device = None if tensor.is_cpu else tensor.device  # the common case keyed without a device object
    current = torch.cuda.current_device() if device is not None and device.type == "cuda" else None
    options = PRINT_OPTS
    key = (dtype, device, default_device, current, torch.get_default_dtype(), options.precision, options.linewidth)
    found = _formats.get(key)
    if found is None:
        device = tensor.device
        suffixes = []
        on_device = device_suffix(str(device), device.type, device.index, default_device, current)
        if on_device is not None:
            suffixes.append(on_device)
        if dtype != torch.get_default_dtype():
            suffixes.append(f"dtype={dtype}")
        if len(_formats) >= 256:
            _formats.clear()
        found = _formats[key] = _form(PRINT_OPTS.precision, tuple(suffixes), PRINT_OPTS.linewidth)
    return found


def _with_suffixes(body: str, form: SpecFormat) -> str:
    return with_suffixes(f"tensor({body}", form.suffixes, form.linewidth)


def format_scalar(value: float, dtype: torch.dtype, precision: int, form: SpecFormat | None = None) -> str:
    """``repr`` of a 0-d tensor of ``dtype`` holding ``value``, as torch prints it with ``sci_mode=True`` (``form``:
    its suffixes, by default those of a CPU tensor)."""
    if value != 0.0 and math.isfinite(value):
        body = f"{value:.{precision}e}"
    elif math.isfinite(value):  # zero: torch's integer mode, "0." / "-0."
        body = f"{value:.0f}."
    else:
        body = f"{value:.0f}"  # nan, inf, -inf
    if form is not None:
        return _with_suffixes(body, form)
    if dtype == torch.get_default_dtype():
        return f"tensor({body})"
    return f"tensor({body}, dtype={dtype})"


def _spec_strings(
    mean: float, std: float, low: float, high: float, dtype: torch.dtype, form: SpecFormat
) -> tuple[str, str, str, str]:
    """:func:`format_scalar` of the four statistics; when all are non-zero and finite (nearly always), through one
    cached ``%`` template each (a ``%e`` field is never wider than the nine-digit precision's bound on it)."""
    precision = form.precision
    template = form.template
    if template and mean and std and low and high and math.isfinite(mean + std + low + high):  # NaN, inf propagate
        return template % mean, template % std, template % low, template % high
    return (
        format_scalar(mean, dtype, precision, form),
        format_scalar(std, dtype, precision, form),
        format_scalar(low, dtype, precision, form),
        format_scalar(high, dtype, precision, form),
    )


def _needs_reference_path(tensor: torch.Tensor) -> bool:
    """True when the repr of a 0-d result would carry a suffix only torch's printer gets right."""
    return (
        type(tensor) not in _PLAIN_TENSOR_TYPES
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


def _reductions(tensor: torch.Tensor, form: SpecFormat) -> list[float]:
    """mean, std, min, max in the tensor's own dtype (float64, or float32 for other floating dtypes), read at once;
    for a large CPU tensor of a spec dtype, std from :mod:`graphtrace.engine.std_bound` where it proves the printed
    digits, and for a mid-sized float32 one where it proves torch's value."""
    dtype = tensor.dtype
    data = tensor if dtype in SPEC_STAT_DTYPES or dtype == torch.float64 else tensor.float()
    low, high = torch.aminmax(data)
    bounded = None if data.numel() < std_bound.MIN_DOUBLE_ELEMENTS else _std_bound_path(data)
    if bounded:
        mean, lowest, highest = _fetch(data.mean(), low, high)
        if math.isfinite(lowest) and math.isfinite(highest):
            if bounded == "printed":
                std = std_bound.printed_std(data, mean, lambda value: format_scalar(value, dtype, form.precision, form))
            else:
                std = std_bound.float32_std(data, mean)
            if std is not None:
                return [mean, std, lowest, highest]
        return [mean, data.std().item(), lowest, highest]
    spread = data.std() if data.numel() > 1 else data.new_full((), math.nan)
    return _fetch(data.mean(), spread, low, high)


def _std_bound_path(data: torch.Tensor) -> str | None:
    """Which of std_bound's computations serves ``data`` (a CPU tensor large enough that they cost less than
    torch's scalar loop), if any."""
    if not data.is_cpu:
        return None
    n = data.numel()
    if n < std_bound.MIN_DOUBLE_ELEMENTS:
        return None
    if n >= std_bound.MIN_ELEMENTS:
        return "printed" if data.dtype in SPEC_STAT_DTYPES and data.is_contiguous() else None
    return "float32" if data.dtype == torch.float32 else None


def _fetch(*results: torch.Tensor) -> list[float]:
    """The values of 0-d results as floats: one ``.item()`` each on the CPU (a third of the cost of stacking them),
    one transfer of them stacked elsewhere."""
    if results[0].is_cpu:
        return [result.item() for result in results]
    return list(torch.stack(results).tolist())


def has_stats(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` has statistics: a dense floating tensor with values (a meta tensor has a shape and a
    dtype but none)."""
    return (
        tensor.dtype.is_floating_point and tensor.layout == torch.strided and not tensor.is_meta and tensor.numel() > 0
    )


NONE, QUEUED, AT_ONCE = 0, 1, 2
"""What :func:`stats_path` says of a tensor."""


def stats_path(tensor: torch.Tensor) -> int:
    """:data:`NONE` for a tensor without statistics (:func:`has_stats`); :data:`AT_ONCE` when :func:`summarize`
    serves it: its 0-d results need torch's printer, or it is a CPU tensor whose standard deviation std_bound
    computes from the mean read first (on the CPU a read waits for nothing, and next to the passes over such a
    tensor it costs nothing); :data:`QUEUED` for every other one (:func:`queued_reductions`)."""
    dtype = tensor.dtype
    if not dtype.is_floating_point or tensor.layout != torch.strided or tensor.is_meta:
        return NONE
    n = tensor.numel()
    if n == 0:
        return NONE
    if dtype in SPEC_STAT_DTYPES and _needs_reference_path(tensor):
        return AT_ONCE
    if n < std_bound.MIN_DOUBLE_ELEMENTS:  # the common case, decided without a call
        return QUEUED
    return QUEUED if _std_bound_path(tensor) is None else AT_ONCE


def summarize(tensor: torch.Tensor) -> TensorSummary:
    """Statistics and non-finite counts of ``tensor``, computed and read now (empty for a tensor without
    statistics: see :func:`has_stats`)."""
    dtype = tensor.dtype
    if not dtype.is_floating_point or tensor.numel() == 0 or tensor.layout != torch.strided or tensor.is_meta:
        return NO_STATS  # as has_stats, inline: this runs for every tensor recorded on the CPU
    spec_dtype = dtype in SPEC_STAT_DTYPES
    if spec_dtype and _needs_reference_path(tensor):
        return _reference_summary(tensor)
    form = spec_format(tensor)
    if tensor.requires_grad:
        with torch.no_grad():
            mean, std, low, high = _reductions(tensor, form)
    else:
        mean, std, low, high = _reductions(tensor, form)
    stats = Stats(mean, std, low, high)
    spec = None
    if spec_dtype:
        spec = _spec_strings(mean, std, low, high, dtype, form)
    return TensorSummary(stats, spec, *_nonfinite_counts(tensor, low, high))


def queued_reductions(tensor: torch.Tensor) -> list[torch.Tensor]:
    """mean, std, min and max of ``tensor`` (one that :func:`stats_path` queues) as 0-d tensors on its device, in
    its own dtype (float64, or float32 for other floating dtypes), nothing read."""
    data = tensor if tensor.dtype in _OWN_DTYPES else tensor.float()
    if data.requires_grad:
        with torch.no_grad():
            return _queued(data)
    return _queued(data)


_OWN_DTYPES = SPEC_STAT_DTYPES | {torch.float64}


def _queued(data: torch.Tensor) -> list[torch.Tensor]:
    low, high = torch.aminmax(data)
    return [data.mean(), data.std() if data.numel() > 1 else data.new_full((), math.nan), low, high]


def nonfinite_counts(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How many NaN and how many infinite values ``tensor`` holds, as 0-d int64 tensors on its device (no gradient
    flows through either)."""
    return torch.isnan(tensor).sum(), torch.isinf(tensor).sum()


def summary_of(
    mean: float, std: float, low: float, high: float, dtype: torch.dtype, form: SpecFormat | None
) -> tuple[Stats, tuple[str, str, str, str] | None]:
    """The statistics and the reference's strings (for a spec dtype, whose ``form`` is given) of a tensor of
    ``dtype`` whose :func:`queued_reductions` read back as these numbers."""
    return Stats(mean, std, low, high), None if form is None else _spec_strings(mean, std, low, high, dtype, form)


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


def fingerprint(tensor: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The value fingerprint of ``tensor`` (see TensorRecord.sketch) on its device, nothing read: its numbers in
    order, as 1-d tensors whose concatenation is the flat fingerprint (joined when read, with the rest of the step's:
    a join per tensor would cost a dispatch; :func:`sketch_of` turns the numbers into the record's). None for a
    complex tensor, a sparse or meta one.
    Integer and boolean tensors (ids, positions) have no statistics, but a fingerprint, summed in float64: exact
    while the sums stay below 2**53 (ids and positions: sums of squares of values below 2**26 per element, up to
    the size limit).

    Today: the rows (all but the last dimension) cut into up to :data:`SKETCH_GROUPS` equal groups in order, each
    group's sum, then each group's sum of squares."""
    if tensor.dtype.is_complex or tensor.layout != torch.strided or tensor.is_meta:
        return None
    if not tensor.dtype.is_floating_point and tensor.numel() > MAX_INTEGER_SKETCH:
        return None  # a large mask: two float64 copies of it, for a fingerprint no diff needs
    groups = _groups(tensor.shape)
    if not groups:
        return None
    if tensor.requires_grad and torch.is_grad_enabled():
        with torch.no_grad():
            return _fingerprint(tensor.detach(), groups)
    return _fingerprint(tensor, groups)  # no autograd in play: the same operations without a no_grad() object


def _fingerprint(tensor: torch.Tensor, groups: int) -> tuple[torch.Tensor, ...]:
    grouped = tensor.reshape(groups, -1)
    if not grouped.dtype.is_floating_point:
        grouped = grouped.double()
    elif grouped.dtype != torch.float32 and grouped.dtype != torch.float64:
        grouped = grouped.float()
    return grouped.sum(1), (grouped * grouped).sum(1)


def sketch_of(numbers: Sequence[float]) -> tuple[float, ...]:
    """The record's fingerprint from the numbers of a :func:`fingerprint` read back."""
    return tuple(numbers)


def row_sketch(tensor: torch.Tensor) -> tuple[float, ...] | None:
    """:func:`fingerprint` of ``tensor`` read at once."""
    parts = fingerprint(tensor)
    if parts is None:
        return None
    numbers: list[float] = []
    for part in parts:
        numbers += part.tolist()  # read apart: no tensor to join them in
    return sketch_of(numbers)
