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
    assert row_sketch(torch.tensor(1.0)) is None and row_sketch(torch.arange(4)) is None
