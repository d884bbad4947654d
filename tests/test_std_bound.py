"""The standard deviation of large tensors from float32 passes: torch's printed string or a refusal, never another."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import pytest
import torch

from graphtrace.engine import std_bound
from graphtrace.engine.stats import format_scalar, summarize

N = (1 << 16) + 13  # a tail that is not a multiple of eight


def _torch_string(t: torch.Tensor) -> str:
    with torch._tensor_str.printoptions(sci_mode=True):
        return repr(t.std())


def _printed(t: torch.Tensor) -> str | None:
    value = std_bound.printed_std(t, t.mean().item(), lambda v: format_scalar(v, t.dtype, 4))
    return None if value is None else format_scalar(value, t.dtype, 4)


def _printed_at(value: float, dtype: torch.dtype) -> str:
    """torch's string for a double-precision std of ``value`` (torch rounds it to the dtype through float)."""
    with torch._tensor_str.printoptions(sci_mode=True):
        return repr(torch.tensor(value, dtype=torch.float64).float().to(dtype))


FAR = 4e-6
"""Relative distance from a rounding boundary beyond which the bound must decide: its interval is ~3e-7 wide for
well-conditioned tensors, ~2e-6 when the mean is about the size of the spread (``x.abs()``)."""
CLOSE = 1.5e-7
"""Relative distance within which it must refuse: the float32 sums of eight alone are uncertain by more."""


def _distance(x: torch.Tensor) -> str:
    """ "far" or "close" (to a rounding boundary of the printed std), judged from the exact std and torch's printer
    alone, or "between" (either answer is fine, as long as a decided one is torch's)."""
    exact = x.double().std().item()
    if _printed_at(exact * (1 - FAR), x.dtype) == _printed_at(exact * (1 + FAR), x.dtype):
        return "far"
    if _printed_at(exact * (1 - CLOSE), x.dtype) != _printed_at(exact * (1 + CLOSE), x.dtype):
        return "close"
    return "between"


def _check(x: torch.Tensor, label: object) -> str:
    """The bound proves the digits of a tensor far from a boundary, refuses one close to it, and is never wrong."""
    distance, printed = _distance(x), _printed(x)
    if distance == "far":
        assert printed is not None, (label, "far from a rounding boundary, yet refused")
    if distance == "close":
        assert printed is None, (label, "within the sums' own error of a rounding boundary, yet decided")
    if printed is not None:
        assert printed == _torch_string(x), label
    return distance


@pytest.mark.parametrize(("dtype", "at_least"), [(torch.float32, 4), (torch.float16, 10), (torch.bfloat16, 10)])
def test_typical_activations_are_decided_and_equal_torchs(dtype: torch.dtype, at_least: int) -> None:
    generator = torch.Generator().manual_seed(0)
    far = 0
    for i in range(12):
        x = torch.randn(N + 1000 * i, generator=generator) * 10 ** (i % 5 - 2)
        x = [x, x.abs(), torch.nn.functional.gelu(x)][i % 3].to(dtype)
        far += _check(x, (i, dtype)) == "far"
    assert far >= at_least  # the seeded tensors do exercise the proof (float32 prints finer, so fewer are far)


def _tensor_with_std_near(target: float, pairs: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A tensor of exactly representable values (pairs of +-1, +-2 and +-1.0078125, mean exactly 0) whose std is
    within about 1e-7 (relative) of ``target``."""
    fine = 1.0078125**2 - 1
    squares = target**2 * (2 * pairs - 1) / 2  # the sum of squares of one value per pair
    twos = int((squares - pairs) // 3)
    nudged = round((squares - pairs - 3 * twos) / fine)
    ones = pairs - twos - nudged
    half = torch.cat((torch.full((twos,), 2.0), torch.full((nudged,), 1.0078125), torch.ones(ones)))
    values = torch.cat((half, -half))
    return values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(seed))].to(dtype)


BOUNDARIES = [
    (torch.float32, 1.23455),  # five-digit decimal ties
    (torch.float32, 1.41425),
    (torch.float32, 1.00005),
    (torch.float16, (1.234375 + 1.2353515625) / 2),  # midpoints between neighbouring values of the dtype
    (torch.bfloat16, (1.234375 + 1.2421875) / 2),
]


@pytest.mark.parametrize(("dtype", "boundary"), BOUNDARIES)
def test_values_at_a_rounding_boundary_are_refused_and_values_off_it_decided(
    dtype: torch.dtype, boundary: float
) -> None:
    distances = []
    for i, offset in enumerate((-1e-5, -3e-7, -2e-7, -1e-7, 0.0, 1e-7, 2e-7, 3e-7, 1e-5)):
        x = _tensor_with_std_near(boundary * (1 + offset), N // 2 + i, dtype, seed=i)
        distances.append(_check(x, offset))
    assert distances[0] == distances[-1] == "far"  # 1e-5 off the boundary: proven
    assert distances.count("close") >= 2  # close calls are detected, not guessed


def test_ill_conditioned_and_extreme_tensors_are_refused() -> None:
    """None exactly where the float32 sums cannot prove anything; a shifted but well-conditioned tensor is decided."""
    generator = torch.Generator().manual_seed(2)
    base = torch.randn(N, generator=generator)
    refused = {
        "mean dwarfs spread": base * 1e-4 + 3.0,  # the sums' error exceeds the spread itself
        "constant": torch.full((N,), 0.1),  # zero spread: the interval reaches below zero
        "subnormal": base * 1e-42,  # flushed subnormals: the error bound is the whole value
        "squares underflow": base * 1e-20,  # normal values, subnormal squares: the same
        "huge": base * 1e30,  # float32 squares overflow
        "squares overflow": base * 1e20,
    }
    for name, x in refused.items():
        assert _printed(x) is None, name
    decided = {"shifted": base * 0.5 + 1.0, "negative mean": base * 2 - 1, "large": base * 2e14}
    for name, x in decided.items():
        assert _check(x, name) == "far", name  # the seeded tensors are far from a boundary
        assert _printed(x) == _torch_string(x), name


U64 = 2.0**-53


def _f32_after(value: float, step: int) -> float:
    bits = struct.unpack("I", struct.pack("f", value))[0]
    return float(struct.unpack("f", struct.pack("I", bits + step))[0])


def _as_f32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _print_boundary(near: float) -> tuple[Fraction, str]:
    """The midpoint of the two neighbouring float32 values around ``near`` that torch prints differently, and the
    upper one's string."""
    low = _as_f32(near)
    while _printed_at(_f32_after(low, 1), torch.float32) == _printed_at(low, torch.float32):
        low = _f32_after(low, 1)
    while _printed_at(_f32_after(low, -1), torch.float32) != _printed_at(low, torch.float32):
        low = _f32_after(low, -1)
    high = _f32_after(low, 1)
    return (Fraction(low) + Fraction(high)) / 2, _printed_at(high, torch.float32)


def _largest_f32_square(limit: Fraction) -> float:
    """The largest float32 ``y`` with ``2 * y**2 <= limit``."""
    y = _as_f32(math.sqrt(float(limit / 2)))
    while 2 * Fraction(y) ** 2 > limit:
        y = _f32_after(y, -1)
    while 2 * Fraction(_f32_after(y, 1)) ** 2 <= limit:
        y = _f32_after(y, 1)
    return y


def _tensor_with_exact_std(target: Fraction) -> torch.Tensor:
    """2000 float32 values (pairs of +-1, +-2 and three fine pairs) whose exact std is ``target`` to ~1e-20."""
    ones, twos = 822, 175
    n = 2 * (ones + twos + 3)
    rest = target**2 * (n - 1) - 2 * ones - 8 * twos
    fine = []
    for _ in range(3):
        fine.append(_largest_f32_square(rest))
        rest -= 2 * Fraction(fine[-1]) ** 2
    half = torch.tensor([1.0] * ones + [2.0] * twos + fine)
    return torch.cat((half, -half))


@pytest.mark.parametrize(("factor", "refused"), [(0.75, True), (8.0, False)])
def test_the_slack_covers_torchs_own_rounding(monkeypatch: pytest.MonkeyPatch, factor: float, refused: bool) -> None:
    """torch's double-precision std is off the exact value by up to (n + 16) * 2**-53 (relative). With the sums
    known exactly (the float32 error terms set to zero), only that slack stands between the exact std and a
    rounding boundary: a std 0.75 of torch's error away from it must be refused, one 8 of it away decided."""
    boundary, above = _print_boundary(1.23455)
    n = 2000
    x = _tensor_with_exact_std(boundary * (1 + Fraction(factor * (n + 16) * U64)))
    assert x.numel() == n
    mean = Fraction(x.mean().item())
    variance = sum((Fraction(v) - mean) ** 2 for v in x.tolist()) / (n - 1)
    distance = math.sqrt(float(variance / boundary**2)) - 1
    assert distance == pytest.approx(factor * (n + 16) * U64, rel=1e-3)  # the construction is what it claims
    s1, s2 = (float(sum(Fraction(v) ** k for v in x.tolist())) for k in (1, 2))
    monkeypatch.setattr(std_bound, "_sums", lambda flat: (s1, s2))
    monkeypatch.setattr(std_bound, "_GAMMA9", 0.0)
    monkeypatch.setattr(std_bound, "_FLUSH", 0.0)
    value = std_bound.printed_std(x, float(mean), lambda v: format_scalar(v, x.dtype, 4))
    if refused:
        assert value is None
    else:
        assert value is not None and format_scalar(value, x.dtype, 4) == above == _torch_string(x)


def test_summarize_uses_it_and_keeps_the_reference_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(std_bound, "MIN_ELEMENTS", 1 << 16)
    calls: list[int] = []
    printed_std = std_bound.printed_std
    monkeypatch.setattr(std_bound, "printed_std", lambda data, *a: calls.append(data.numel()) or printed_std(data, *a))
    generator = torch.Generator().manual_seed(3)
    for shape in [(1, 128, 768), (3, 7, 4099), (N,)]:
        x = torch.randn(shape, generator=generator)
        with torch._tensor_str.printoptions(sci_mode=True):
            expected = tuple(repr(r) for r in (x.mean(), x.std(), x.min(), x.max()))
        summary = summarize(x)
        assert summary.spec_stats == expected
        assert summary.stats is not None and math.isclose(summary.stats.std, x.std().item(), rel_tol=1e-6)
    assert len(calls) == 3
    transposed = torch.randn(300, 300, generator=generator).t()  # not contiguous: torch's own std
    with torch._tensor_str.printoptions(sci_mode=True):
        assert summarize(transposed).spec_stats[1] == repr(transposed.std())
    assert len(calls) == 3  # the transposed tensor never reached the bound


def test_float32_std_is_torchs_own_float_or_refused() -> None:
    """Mid-sized float32 tensors (the double-precision dot product): the very float torch returns, seldom None."""
    generator = torch.Generator().manual_seed(4)
    refused = 0
    for i in range(60):
        n = int(torch.randint(2, 200_000, (), generator=generator))
        x = torch.randn(n, generator=generator) * 10.0 ** (i % 9 - 4) + [0.0, 1.0, -300.0][i % 3]
        if i % 4 == 0:  # strided: torch adds in another order, the bound does not care
            x = x[: n // 4 * 4].view(-1, 4).t()
        value = std_bound.float32_std(x, x.mean().item())
        refused += value is None
        assert value is None or value == x.std().item(), i
    assert refused <= 2


def _float32_midpoint(near: float) -> tuple[Fraction, float, float]:
    """The midpoint of two neighbouring float32 values around ``near``, and the two values."""
    low = _as_f32(near)
    high = _f32_after(low, 1)
    return (Fraction(low) + Fraction(high)) / 2, low, high


@pytest.mark.parametrize(("offset", "decided"), [(-1e-9, True), (-1e-15, False), (1e-15, False), (1e-9, True)])
def test_float32_std_refuses_a_std_at_a_float32_rounding_midpoint(offset: float, decided: bool) -> None:
    """A std within the sums' own error of the midpoint between two float32 values cannot be told: refused; one
    further off (still far closer than the printed digits see) is decided, and is torch's float."""
    midpoint, below, above = _float32_midpoint(1.2345678)
    x = _tensor_with_exact_std(midpoint * (1 + Fraction(offset)))
    value = std_bound.float32_std(x, x.mean().item())
    if decided:
        assert value == x.std().item() == (above if offset > 0 else below)
    else:
        assert value is None


def test_float32_std_refuses_what_the_bound_cannot_see() -> None:
    generator = torch.Generator().manual_seed(5)
    base = torch.randn(40_000, generator=generator)
    assert std_bound.float32_std(torch.full((40_000,), 0.5), 0.5) is None  # no spread
    subnormal = base * 1e-42  # a flushed float32 input would move the sum by more than the sum itself
    assert std_bound.float32_std(subnormal, subnormal.mean().item()) is None
    for x in (base * 1e30, base * 1e-20, base * 1e-4 + 3.0):  # double precision copes with what float32 does not
        assert std_bound.float32_std(x, x.mean().item()) == x.std().item()


def test_summarize_takes_torchs_float_for_mid_sized_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    exact = std_bound.float32_std
    monkeypatch.setattr(std_bound, "float32_std", lambda data, mean: calls.append(data.numel()) or exact(data, mean))
    generator = torch.Generator().manual_seed(6)
    for shape in [(1, 128, 768), (1, 128, 3072)]:
        x = torch.randn(shape, generator=generator)
        with torch._tensor_str.printoptions(sci_mode=True):
            expected = tuple(repr(r) for r in (x.mean(), x.std(), x.min(), x.max()))
        summary = summarize(x)
        assert summary.spec_stats == expected
        assert summary.stats is not None and summary.stats.std == x.std().item()
    summarize(torch.randn(1, 16, 1024, dtype=torch.float16, generator=generator))  # float16: torch's std
    summarize(torch.randn(std_bound.MIN_DOUBLE_ELEMENTS - 1, generator=generator))  # too small to pay
    assert calls == [128 * 768, 128 * 3072]
