"""Statistics: the reference's exact strings from fewer operations, and non-finite counts."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from graphtrace.engine.stats import format_scalar, summarize


def _reference_strings(t: torch.Tensor) -> tuple[str, ...]:
    with warnings.catch_warnings(), torch._tensor_str.printoptions(sci_mode=True):
        warnings.simplefilter("ignore")
        return tuple(repr(x) for x in (t.mean(), t.std(), t.min(), t.max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_strings_equal_the_references_on_varied_tensors(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    cases = []
    for shape in [(), (1,), (2,), (3, 7), (2, 5, 33), (4096,)]:
        for scale in (1e-6, 1e-2, 1.0, 3e4):
            cases.append((torch.randn(shape, generator=generator) * scale).to(dtype))
    cases += [torch.zeros(4, dtype=dtype), -torch.zeros(1, dtype=dtype), torch.randn(6, 4).to(dtype).t()]
    for t in cases:
        assert summarize(t).spec_stats == _reference_strings(t), (t.shape, t.dtype)


def test_non_finite_values_are_counted() -> None:
    t = torch.tensor([1.0, math.nan, math.inf, -math.inf, math.nan])
    summary = summarize(t)
    assert (summary.nan_count, summary.inf_count) == (2, 2)
    assert summary.spec_stats == _reference_strings(t)
    finite = summarize(torch.tensor([1.0, 2.0]))
    assert (finite.nan_count, finite.inf_count) == (0, 0)


def test_other_dtypes() -> None:
    double = summarize(torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert double.spec_stats is None and double.stats is not None and double.stats.mean == 2.0  # numbers, no strings
    assert summarize(torch.tensor([1, 2])) == (None, None, 0, 0)
    assert summarize(torch.tensor([True])) == (None, None, 0, 0)
    assert summarize(torch.empty(0)) == (None, None, 0, 0)  # transformers' min() raises here


def test_autograd_and_subclasses_take_the_references_path() -> None:
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    with torch.enable_grad():
        assert summarize(p).spec_stats == _reference_strings(p)
        assert "grad_fn=<MeanBackward0>" in summarize(p).spec_stats[0]
    with torch.no_grad():
        assert summarize(p).spec_stats == (
            "tensor(1.5000e+00)",
            "tensor(7.0711e-01)",
            "tensor(1.0000e+00)",
            "tensor(2.0000e+00)",
        )


def test_format_scalar_special_values() -> None:
    assert format_scalar(0.0, torch.float32, 4) == "tensor(0.)"
    assert format_scalar(-0.0, torch.float16, 4) == "tensor(-0., dtype=torch.float16)"
    assert format_scalar(math.nan, torch.bfloat16, 4) == "tensor(nan, dtype=torch.bfloat16)"
    assert format_scalar(-math.inf, torch.float32, 4) == "tensor(-inf)"
    assert format_scalar(123.456, torch.float32, 2) == "tensor(1.23e+02)"
