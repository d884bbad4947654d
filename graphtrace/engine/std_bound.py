"""The printed standard deviation of a large tensor from vectorised float32 passes, proven or declined.

transformers writes ``repr(tensor.std())``: the sample standard deviation rounded to the tensor's dtype and printed
with five significant digits. On CPU, torch computes it in double precision with a scalar loop
(``std_var_all_cpu``: the float32 mean ``m``, then ``sum((x - m)**2)`` in double; float16 and bfloat16 go through
Welford's algorithm in double), about ten times slower than a vectorised float32 reduction and most of the cost of
statistics on a large model. Its result is the exact value up to a relative error below ``(n + 16) * 2**-53``.

Here ``sum(x)`` and ``sum(x * x)`` are computed with float32 additions of eight elements (reducing a ``(8, k)`` view
over its first dimension) and double precision for the rest. Whatever order torch adds eight numbers in, each partial
sum is off by at most ``gamma(8)`` of the sum of its terms' magnitudes, so both sums come with a rigorous error bound
that does not depend on torch's summation order; flushed subnormals add an absolute ``2**-126`` per element. From
them follows an interval that holds torch's double-precision value; its two ends are rounded to the tensor's dtype
as torch rounds and printed as torch prints. When both ends print the same, that is the string torch prints; when
they do not (a value within about ``1e-6`` relative of a rounding boundary, or an ill-conditioned tensor whose mean
dwarfs its spread), :func:`printed_std` returns None and the caller asks torch.

Mid-sized float32 tensors (:data:`MIN_DOUBLE_ELEMENTS` up to :data:`MIN_ELEMENTS`, GPT-2's and BERT's activations)
take :func:`float32_std`: the deviations ``x - m`` in double precision, exactly as torch's loop forms them, summed
by a vectorised double-precision dot product. Both sums of the same squares are within ``gamma(n)`` of the exact one
whatever their order, so torch's float32 result is known exactly (not only its printed digits) unless the interval
straddles a float32 rounding boundary, about one tensor in a thousand; then torch runs.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Callable

import torch

__all__ = ["MIN_DOUBLE_ELEMENTS", "MIN_ELEMENTS", "float32_std", "printed_std"]

MIN_ELEMENTS = 1 << 19
"""Below this many elements torch's own ``std`` costs no more than the passes here, measured inside real forwards
(where the tensors are no longer in cache): the passes win on the 0.84B Llama's 0.5M to 8M element tensors and lose
on BERT-base's 0.1M to 0.4M element ones."""

MIN_DOUBLE_ELEMENTS = 1 << 15
"""From this many elements a float32 tensor's std from :func:`float32_std` (three vectorised passes) costs less than
torch's scalar loop (about half of it at GPT-2's 98K and 393K elements, one thread); below, the dispatches weigh
more than the loop."""

_CHUNK = 1 << 18  # elements per pass: the float32 squares of a chunk stay in cache
_U32 = 2.0**-24
_U64 = 2.0**-53
_FLUSH = 2.0**-126  # the largest value a flushed subnormal (or underflowed square) can lose
_GAMMA9 = 9 * _U32 / (1 - 9 * _U32)  # a square's rounding and eight terms added in any order


def _as_float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _as_float16(value: float) -> float:
    return float(struct.unpack("e", struct.pack("e", _as_float32(value)))[0])


def _as_bfloat16(value: float) -> float:
    bits = struct.unpack("I", struct.pack("f", _as_float32(value)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even, as c10::BFloat16 does
    return float(struct.unpack("f", struct.pack("I", bits))[0])


# torch turns the double result into the tensor's dtype through float, so half types round twice, as here.
_ROUND: dict[torch.dtype, Callable[[float], float]] = {
    torch.float32: _as_float32,
    torch.float16: _as_float16,
    torch.bfloat16: _as_bfloat16,
}


_scratch = threading.local()


def _scratch_buffers() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-thread float32 buffers for one chunk's float32 copy, squares and sums of eight, kept for the process:
    allocating them per tensor costs more in page faults than the passes themselves."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        memory = torch.empty(2 * _CHUNK + 2 * (_CHUNK // 8), dtype=torch.float32)
        buffers = _scratch.buffers = (
            memory[:_CHUNK],
            memory[_CHUNK : 2 * _CHUNK],
            memory[2 * _CHUNK :].view(2, _CHUNK // 8),
        )
    return buffers


def _sums(flat: torch.Tensor) -> tuple[float, float]:
    """``sum(x)`` and ``sum(x * x)`` of a contiguous 1-d tensor: float32 sums of eight, then double precision."""
    n = flat.numel()
    head = n - n % 8
    copy, squares, eights = _scratch_buffers()
    parts = []
    for start in range(0, head, _CHUNK):
        chunk = flat[start : min(start + _CHUNK, head)]
        size = chunk.numel()
        k = size // 8
        if chunk.dtype != torch.float32:
            chunk = copy[:size].copy_(chunk)  # exact for float16 and bfloat16
        sums = eights[:, :k]
        torch.sum(chunk.view(8, k), 0, out=sums[0])
        torch.mul(chunk, chunk, out=squares[:size])
        torch.sum(squares[:size].view(8, k), 0, out=sums[1])
        parts.append(sums.sum(1, dtype=torch.float64))
    if head < n:
        tail = flat[head:].double()
        parts.append(torch.stack((tail.sum(), tail.square().sum())))
    s1, s2 = torch.stack(parts).sum(0).tolist()
    return s1, s2


def printed_std(data: torch.Tensor, mean: float, fmt: Callable[[float], str]) -> float | None:
    """The value whose ``fmt`` is the string torch prints for ``data.std()``, or None when that is not certain.

    ``data`` is a contiguous CPU tensor of float32, float16 or bfloat16 with at least two finite elements; ``mean``
    is ``data.mean()`` as torch computes it. The returned value is within one unit in the last place of torch's."""
    rounding = _ROUND[data.dtype]
    n = data.numel()
    s1, s2 = _sums(data.reshape(-1))
    flushed = n * _FLUSH
    # Error bounds of the two sums (the double-precision stages add (n + 8) * u64 of the magnitudes at most).
    e2 = (_GAMMA9 + (n + 8) * _U64) * s2 + flushed
    abs_sum = math.sqrt(n * (s2 + e2))  # >= sum(|x|), by Cauchy-Schwarz
    e1 = (_GAMMA9 + (n + 8) * _U64) * abs_sum + flushed
    if data.dtype == torch.float32:
        # torch centres on its float32 mean: sum((x - m)**2) = s2 - 2 m s1 + n m**2 exactly.
        m = mean
        q = s2 - 2.0 * m * s1 + n * m * m
        eq = e2 + 2.0 * abs(m) * e1 + 8 * _U64 * (s2 + 2.0 * abs(m * s1) + n * m * m)
    else:
        # Welford's algorithm centres on the exact mean: sum((x - mean)**2) = s2 - s1**2 / n.
        q = s2 - s1 * s1 / n
        eq = e2 + (2.0 * abs(s1) * e1 + e1 * e1) / n + 8 * _U64 * (s2 + s1 * s1 / n)
    if not (math.isfinite(q) and math.isfinite(eq)) or q <= eq:
        return None
    slack = 4 * (n + 16) * _U64  # torch's own double-precision rounding, and ours
    if data.dtype != torch.float32:
        slack *= 1 + s2 / (q - eq)  # Welford's error grows with the squared ratio of mean to spread
    low = math.sqrt((q - eq) / (n - 1)) * (1 - slack)
    high = math.sqrt((q + eq) / (n - 1)) * (1 + slack)
    try:
        low, high = rounding(low), rounding(high)
    except OverflowError:
        return None
    if not math.isfinite(high):
        return None
    return low if fmt(low) == fmt(high) else None


_DOUBLE_CHUNK = 1 << 16  # elements per pass: the float64 deviations of a chunk (512 KB) stay in cache


def _double_scratch() -> torch.Tensor:
    """A per-thread float64 buffer for one chunk's deviations, kept for the process like the float32 ones."""
    buffer: torch.Tensor | None = getattr(_scratch, "double", None)
    if buffer is None:
        buffer = _scratch.double = torch.empty(_DOUBLE_CHUNK, dtype=torch.float64)
    return buffer


_TINY = 2.0**-1021  # what a double-precision square that underflows (or is flushed) can lose, twice over


def float32_std(data: torch.Tensor, mean: float) -> float | None:
    """``data.std().item()`` exactly, or None when that is not certain.

    ``data`` is a float32 CPU tensor of at least two finite elements, ``mean`` is ``data.mean()`` as torch computes
    it. torch sums ``fl(fl(double(x) - m) ** 2)`` serially in double; here the same deviations are formed (one
    double subtraction each; a float32 input flushed to zero on the way is off by less than ``2**-126``) and summed
    by dot products of chunks in another order. Each sum is within ``gamma(n + chunks)`` of the exact sum of
    squares, so torch's sum lies in ``s * (1 +- r)`` (plus absolute terms for underflow); ``sqrt(sum / (n - 1))``
    rounded to double and then to float32 is monotone in the sum, so when both ends of the interval give the same
    float32, it is torch's."""
    flat = data.reshape(-1)  # a copy only if strided: torch's order differs anyway, the bound does not care
    n = flat.numel()
    buffer = _double_scratch()
    s = 0.0
    for start in range(0, n, _DOUBLE_CHUNK):
        chunk = flat[start : start + _DOUBLE_CHUNK]
        deviations = buffer[: chunk.numel()].copy_(chunk).sub_(mean)
        s += torch.dot(deviations, deviations).item()
    terms = n + n // _DOUBLE_CHUNK + 2
    gamma = terms * _U64 / (1 - terms * _U64)
    relative = 4 * gamma + 16 * _U64  # torch's sum and this one, the deviations' own rounding, the products below
    absolute = 2 * _FLUSH * math.sqrt(n * s * (1 + relative)) + n * (_FLUSH * _FLUSH + _TINY)
    low, high = s * (1 - relative) - absolute, s * (1 + relative) + absolute
    if not math.isfinite(high) or low <= 0:
        return None
    try:
        low = _as_float32(math.sqrt(low / (n - 1)))
        high = _as_float32(math.sqrt(high / (n - 1)))
    except OverflowError:
        return None
    return low if low == high else None
