"""The standard deviation of large tensors from float32 passes: torch's printed string or a refusal, never another."""

from __future__ import annotations

import math

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
