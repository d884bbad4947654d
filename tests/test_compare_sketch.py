"""The value fingerprint (TensorRecord.sketch) of traces without full values: a change too small or too local for a
tensor's statistics is still seen, and equivalent layouts still agree."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import graphtrace
from graphtrace.engine.stats import row_sketch


class OneRowScaled(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(64, 64)
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if self.factor != 1.0:
            y = y.clone()
            y[:, 3] = y[:, 3] * self.factor  # one token of 32, by a few parts in a million
        return y.relu()


def test_a_change_too_small_for_the_statistics_is_seen_by_the_fingerprint(tmp_path: Path) -> None:
    x = torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(1))
    for name, factor in (("a", 1.0), ("same", 1.0), ("b", 1 + 5e-6)):
        graphtrace.capture(OneRowScaled(factor), x, path=tmp_path / name)  # values="repr": no files
    assert graphtrace.compare(tmp_path / "a", tmp_path / "same").equal
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and first.a.path == "OneRowScaled"
    assert "the value fingerprint; statistics of the whole agree" in first.reason


def test_the_fingerprint_ignores_size_one_dims_and_last_dim_order() -> None:
    x = torch.randn(1, 8, 64)
    sketch = row_sketch(x)
    assert sketch is not None and len(sketch) == 16  # 8 row groups: sums, then sums of squares
    assert row_sketch(x[0]) == sketch
    permuted = row_sketch(x[..., torch.randperm(64)])
    assert permuted is not None and all(abs(p - s) < 1e-4 for p, s in zip(permuted, sketch))
    assert row_sketch(torch.tensor(1.0)) is None and row_sketch(torch.randn(2, 2).to(torch.complex64)) is None
    # integers (ids, positions) have no statistics but a fingerprint, exact in float64
    assert row_sketch(torch.arange(4)) == (6.0, 14.0) and row_sketch(torch.tensor([True, False])) == (1.0, 1.0)
    assert row_sketch(torch.ones(2048, 1024, dtype=torch.bool)) is None  # a large mask: no fingerprint


class Lookup(torch.nn.Module):
    """Looks rows up at positions it computes: positions shifted by one in the faulty version."""

    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift
        self.table = torch.nn.Embedding(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1]) + self.shift
        return x + self.table(positions)


def test_integer_inputs_compare_exactly_by_their_fingerprint(tmp_path: Path) -> None:
    """Without values, an integer input (computed in the caller's own code) is compared by its fingerprint: the
    departure is placed in the caller, before the lookup, not in the lookup's weights."""
    x = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(1))
    for name, shift in (("a", 0), ("b", 1)):
        torch.manual_seed(0)
        graphtrace.capture(Lookup(shift), x, path=tmp_path / name)  # values="repr": no files
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and first.a.path == "Lookup", result.table()
    assert "before table" in result.table() and "the value fingerprint of integers" in result.table()


def test_integers_in_repr_lines_compare_exactly_when_the_lines_hold_them_all() -> None:
    """A transformers-written trace keeps integer tensors as repr lines: read when nothing is summarised away."""
    from graphtrace.compare.measure import Tolerance, measure
    from graphtrace.model import TensorRecord

    def ids(*lines: str) -> TensorRecord:
        return TensorRecord((2, 3), "torch.int64", value=lines)

    a = ids("tensor([[0, 1, 2],", "        [3, 4, 5]])")
    assert measure("x", a, "x", ids("tensor([[0, 1, 2],", "        [3, 4, 5]])"), Tolerance()).status == "equal"
    apart = measure("x", a, "x", ids("tensor([[0, 1, 2],", "        [3, 4, -6]])"), Tolerance())
    assert apart.status == "diverged" and apart.outside == 1 and apart.max_abs == 11.0
    summarised = ids("tensor([[0, 1, 2],", "        ...,", "        [3, 4, 5]])")
    assert measure("x", a, "x", summarised, Tolerance()).status == "unchecked"
