"""Python's ``'%.{p}e' % x`` of many doubles at once, digit for digit, with a few tensor operations.

Python formats a double in about 160 ns; the unpruned shim prints 47,000 of them per forward. Here all of a step's
values are formatted together. A non-zero double's ``p + 1`` significant digits are ``round(|x| * 10**(p - e))`` for
its decimal exponent ``e``, which its binary exponent ``b`` tells to within one: ``e`` is ``floor(b * log10(2))`` or
one more. Tables per binary exponent give that estimate and the power of ten to scale by. With ``|p - e| <= 22`` the
power is exact in float64, so the scaled value carries one rounding (two when it is then divided by ten, the estimate
having been one short): a relative error below 2**-51, less than ``10**(p + 1) * 2**-51`` absolute. Rounding it to
the nearest integer therefore gives Python's (correctly rounded) digits whenever it lies farther than that from a tie
``n + 0.5``. Values within a wide margin of a tie are formatted by Python itself, as are those whose exponent is out
of that range (subnormals, float64's extremes); non-finite ones are reported. A scaled value that rounds up to
``10**(p + 1)`` carries into the exponent, as Python's does (``9.99995e-05`` is ``1.0000e-04``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["MAX_PRECISION", "sci_chars"]

MAX_PRECISION = 8
"""Precisions from 1 to this are formatted here (torch's default is 4); the margin below stays tiny for them."""

_TABLE_PRECISION = 4  # up to this precision a table holds the text of every mantissa: one lookup per value
_EXPONENT_BOUND = 40  # |exponent| of the exact rows stays below 22 + MAX_PRECISION + 2
_CPU = torch.device("cpu")  # explicit: lines may be formatted under another default device
_SPAN = 22  # 10**22 is the largest power of ten exact in float64
_EXPONENTS = torch.tensor(
    [list(f"e{k:+03d}".encode("ascii")) for k in range(-_EXPONENT_BOUND, _EXPONENT_BOUND + 1)],
    dtype=torch.uint8,
    device=_CPU,
)
_MINUS, _SPACE = ord("-"), ord(" ")


class _Scales(NamedTuple):
    """Per biased binary exponent (0 to 2047): the decimal exponent's estimate (plus ``_EXPONENT_BOUND``, an index
    into ``_EXPONENTS``) and ``scaled = |x| * multiplier / divisor`` (one of the two is 1.0; NaN where the power of
    ten would not be exact, and 1.0 for zeros and subnormals, which scale below ``10**p``)."""

    exponent: torch.Tensor
    multiplier: torch.Tensor
    divisor: torch.Tensor


_scales: dict[int, _Scales] = {}
_mantissa_tables: dict[int, torch.Tensor] = {}


def _scales_for(precision: int) -> _Scales:
    scales = _scales.get(precision)
    if scales is None:
        exponents, multipliers, divisors = [], [], []
        for biased in range(2048):
            estimate = math.floor((biased - 1023) * math.log10(2.0))
            shift = precision - estimate
            usable = 0 < biased < 2047 and abs(shift) <= _SPAN and abs(estimate) < _EXPONENT_BOUND - 2
            exponents.append(estimate + _EXPONENT_BOUND if usable else _EXPONENT_BOUND)
            if biased == 0:
                multipliers.append(1.0)
                divisors.append(1.0)
            else:
                multipliers.append(float(10 ** max(shift, 0)) if usable else math.nan)
                divisors.append(float(10 ** max(-shift, 0)) if usable else math.nan)
        scales = _scales[precision] = _Scales(
            torch.tensor(exponents, dtype=torch.int64, device=_CPU),
            torch.tensor(multipliers, dtype=torch.float64, device=_CPU),
            torch.tensor(divisors, dtype=torch.float64, device=_CPU),
        )
    return scales


def _mantissa_digits(rounded: torch.Tensor, precision: int) -> torch.Tensor:
    """``d.ddd`` of integers ``rounded`` below ``10**(precision + 1)``, as rows of ASCII codes."""
    powers = [float(10 ** (precision - i)) for i in range(precision + 1)]
    divisors = torch.tensor(powers, dtype=torch.float64, device=_CPU)
    # floor of an exactly rounded quotient of integers below 2**53 by a power of ten is the integer quotient
    digits = torch.floor(rounded.to(torch.float64).unsqueeze(1) / divisors).remainder_(10).to(torch.uint8).add_(48)
    point = torch.full((rounded.numel(), 1), ord("."), dtype=torch.uint8, device=_CPU)
    return torch.cat([digits[:, :1], point, digits[:, 1:]], dim=1)


def _mantissa_chars(rounded: torch.Tensor, precision: int) -> torch.Tensor:
    """The mantissas' text of integers ``rounded`` up to ``10**(precision + 1)``, which carries (``1.000``)."""
    low, high = 10**precision, 10 ** (precision + 1)
    if precision > _TABLE_PRECISION:
        return _mantissa_digits(rounded.masked_fill(rounded == high, low), precision)
    table = _mantissa_tables.get(precision)
    if table is None:
        every = torch.arange(high + 1, device=_CPU).clamp_(max=high - 1)
        table = _mantissa_tables[precision] = _mantissa_digits(every, precision)
        table[high] = table[low]
    return table.index_select(0, rounded)


def sci_chars(values: torch.Tensor, precision: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the 1-d float64 ``values`` as ``'%.{precision}e' % value`` in ``precision + 7`` ASCII codes, led by
    a ``-`` or a space, as a ``(len(values), precision + 7)`` uint8 tensor; and which values are *irregular* (not
    of that form: non-finite, or with a three-digit exponent), whose rows are undefined."""
    if not 1 <= precision <= MAX_PRECISION:
        raise ValueError(f"precision {precision} is outside 1..{MAX_PRECISION}")
    low, high = 10**precision, 10 ** (precision + 1)
    scales = _scales_for(precision)
    bits = values.view(torch.int64)
    biased = (bits >> 52).bitwise_and_(0x7FF)
    magnitude = values.abs()
    scaled = magnitude.mul_(scales.multiplier.index_select(0, biased)).div_(scales.divisor.index_select(0, biased))
    too_large = scaled >= high  # the estimate was one short
    scaled = torch.where(too_large, scaled / 10, scaled)
    fraction = scaled - scaled.floor()
    tie_distance = fraction.sub_(0.5).abs_()
    exact = (scaled >= low) & (scaled < high) & (tie_distance > high * 2.0**-40)  # the error is below high * 2**-51
    rounded = scaled.round_().to(torch.int64).clamp_(0, high)  # zeros round to 0, and NaN rows are left alone
    exponent = scales.exponent.index_select(0, biased).add_(too_large).add_(rounded == high)
    signs = (bits < 0).to(torch.uint8).mul_(_MINUS - _SPACE).add_(_SPACE)
    chars = torch.cat(
        [signs.unsqueeze(1), _mantissa_chars(rounded, precision), _EXPONENTS.index_select(0, exponent)], dim=1
    )
    irregular = biased == 2047
    by_python = (exact | irregular | (values == 0)).logical_not_().nonzero().flatten().tolist()
    if by_python:
        _format_in_python(values, by_python, precision, chars, irregular)
    return chars, irregular


def _format_in_python(
    values: torch.Tensor, indices: list[int], precision: int, chars: torch.Tensor, irregular: torch.Tensor
) -> None:
    """Python's own formatting of the values at ``indices``, written into their rows (or marked irregular)."""
    width = precision + 7
    for index, value in zip(indices, values[indices].tolist()):
        text = f"{value:.{precision}e}"  # what "%.4e" % value gives
        field = text if text[0] == "-" else " " + text
        if len(field) == width:
            chars[index] = torch.frombuffer(bytearray(field.encode("ascii")), dtype=torch.uint8)
        else:
            irregular[index] = True
