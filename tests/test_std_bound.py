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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_typical_activations_are_decided_and_equal_torchs(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    decided = 0
    for i in range(12):
        x = torch.randn(N + 1000 * i, generator=generator) * 10 ** (i % 5 - 2)
        x = [x, x.abs(), torch.nn.functional.gelu(x)][i % 3].to(dtype)
        printed = _printed(x)
        if printed is not None:
            decided += 1
            assert printed == _torch_string(x), (i, dtype)
    assert decided >= 9  # the fast path serves most tensors


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
def test_values_at_a_rounding_boundary_are_refused_or_right(dtype: torch.dtype, boundary: float) -> None:
    refused = 0
    for i in range(8):
        x = _tensor_with_std_near(boundary * (1 + (i - 4) * 1e-7), N // 2 + i, dtype, seed=i)
        printed = _printed(x)
        if printed is None:
            refused += 1
        else:
            assert printed == _torch_string(x), i
    assert refused >= 4  # close calls are detected, not guessed


def test_ill_conditioned_and_extreme_tensors() -> None:
    generator = torch.Generator().manual_seed(2)
    base = torch.randn(N, generator=generator)
    cases = {
        "mean dwarfs spread": base * 1e-4 + 3.0,
        "constant": torch.full((N,), 0.1),
        "subnormal": base * 1e-42,
        "huge": base * 1e30,
        "squares overflow": base * 1e20,
    }
    for name, x in cases.items():
        printed = _printed(x)
        assert printed is None or printed == _torch_string(x), name
    assert _printed(cases["constant"]) in (None, "tensor(0.)")
    assert _printed(cases["squares overflow"]) is None


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
