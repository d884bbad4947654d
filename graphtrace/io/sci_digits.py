"""Python's ``'%.{p}e' % x`` of many doubles at once, digit for digit, with a few tensor operations.

Python formats a double in about 160 ns; the unpruned shim prints 47,000 of them per forward. Here all of a step's
values are formatted together. A non-zero double's ``p + 1`` significant digits are ``round(|x| * 10**(p - e))`` for
its decimal exponent ``e``. With ``|p - e| <= 22`` the power of ten is exact in float64, so the scaled value carries
one rounding (two when the exponent's estimate from the binary exponent is corrected by a factor ten): a relative
error below 2**-51, less than ``10**(p + 1) * 2**-51`` absolute. Rounding it to the nearest integer therefore gives
Python's (correctly rounded) digits whenever it lies farther than that from a tie ``n + 0.5``. Values within a wide
margin of a tie are formatted by Python itself, as are those whose exponent is out of that range (subnormals,
float64's extremes) and non-finite ones. A scaled value that rounds up to ``10**(p + 1)`` carries into the exponent,
as Python's does (``9.99995e-05`` is ``1.0000e-04``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["MAX_PRECISION", "sci_chars"]

MAX_PRECISION = 8
"""Precisions from 1 to this are formatted here (torch's default is 4); the margin below stays tiny for them."""

_TABLE_PRECISION = 4  # up to this precision a table holds the text of every mantissa: one lookup per value
_EXPONENT_BOUND = 40  # |exponent| of the exact rows stays below 22 + MAX_PRECISION + 1
_SPAN = 22  # 10**22 is the largest power of ten exact in float64
_LOG10_2 = math.log10(2.0)
# scaled = magnitude * _MULTIPLIERS[i] / _DIVISORS[i] with i = shift + 22: one of the two factors is 1.0
_MULTIPLIERS = torch.tensor([float(10 ** max(k, 0)) for k in range(-_SPAN, _SPAN + 1)], dtype=torch.float64)
_DIVISORS = torch.tensor([float(10 ** max(-k, 0)) for k in range(-_SPAN, _SPAN + 1)], dtype=torch.float64)
_EXPONENTS = torch.tensor(
    [list(f"e{k:+03d}".encode("ascii")) for k in range(-_EXPONENT_BOUND, _EXPONENT_BOUND + 1)], dtype=torch.uint8
)
_SIGNS = torch.tensor(list(b" -"), dtype=torch.uint8)
_mantissa_tables: dict[int, torch.Tensor] = {}


def _mantissa_digits(rounded: torch.Tensor, precision: int) -> torch.Tensor:
    """``d.ddd`` of integers ``rounded`` below ``10**(precision + 1)``, as rows of ASCII codes."""
    divisors = torch.tensor([float(10 ** (precision - i)) for i in range(precision + 1)], dtype=torch.float64)
    # floor of an exactly rounded quotient of integers below 2**53 by a power of ten is the integer quotient
    digits = torch.floor(rounded.to(torch.float64).unsqueeze(1) / divisors).remainder_(10).to(torch.uint8).add_(48)
    point = torch.full((rounded.numel(), 1), ord("."), dtype=torch.uint8)
    return torch.cat([digits[:, :1], point, digits[:, 1:]], dim=1)


def _mantissa_chars(rounded: torch.Tensor, precision: int) -> torch.Tensor:
    """The mantissas' text of integers ``rounded`` up to ``10**(precision + 1)``, which carries (``1.000``)."""
    low, high = 10**precision, 10 ** (precision + 1)
    if precision > _TABLE_PRECISION:
        return _mantissa_digits(rounded.masked_fill(rounded == high, low), precision)
    table = _mantissa_tables.get(precision)
    if table is None:
        table = _mantissa_tables[precision] = _mantissa_digits(torch.arange(high + 1).clamp_(max=high - 1), precision)
        table[high] = table[low]
    return table.index_select(0, rounded)


def sci_chars(values: torch.Tensor, precision: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the 1-d float64 ``values`` as ``'%.{precision}e' % value`` in ``precision + 7`` ASCII codes, led by
    a ``-`` or a space, as a ``(len(values), precision + 7)`` uint8 tensor; and which values are *irregular* (not
    of that form: non-finite, or with a three-digit exponent), whose rows are undefined."""
    if not 1 <= precision <= MAX_PRECISION:
        raise ValueError(f"precision {precision} is outside 1..{MAX_PRECISION}")
    low, high = 10**precision, 10 ** (precision + 1)
    magnitude = values.abs()
    binary_exponent = ((values.view(torch.int64) >> 52) & 0x7FF) - 1023
    exponent = binary_exponent.to(torch.float64).mul_(_LOG10_2).floor_().to(torch.int64)  # or one below
    shift = precision - exponent
    factors = (shift + _SPAN).clamp_(0, 2 * _SPAN)
    scaled = magnitude * _MULTIPLIERS.index_select(0, factors) / _DIVISORS.index_select(0, factors)
    too_large = scaled >= high
    scaled = torch.where(too_large, scaled / 10, scaled)
    exponent += too_large.to(torch.int64)
    fraction = scaled - scaled.floor()
    exact = (
        (shift.abs() <= _SPAN)
        & (scaled >= low)
        & (scaled < high)
        & ((fraction - 0.5).abs() > high * 2.0**-40)  # the error bound is high * 2**-51
    )
    zero = magnitude == 0
    rounded = scaled.round().to(torch.int64).clamp_(0, high).masked_fill_(zero, 0)
    exponent = (exponent + (rounded == high).to(torch.int64)).masked_fill_(zero, 0)
    exponent = exponent.clamp_(-_EXPONENT_BOUND, _EXPONENT_BOUND) + _EXPONENT_BOUND
    chars = torch.cat(
        [
            _SIGNS.index_select(0, torch.signbit(values).to(torch.int64)).unsqueeze(1),
            _mantissa_chars(rounded, precision),
            _EXPONENTS.index_select(0, exponent),
        ],
        dim=1,
    )
    finite = torch.isfinite(values)
    by_python = (finite & ~(exact | zero)).nonzero().flatten().tolist()
    irregular = ~finite
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
