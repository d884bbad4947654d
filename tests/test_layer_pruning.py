"""Layer blocks that pruning drops get no values; kept calls hold exactly what transformers writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from tests.conftest import assert_same_trace_files, run_ours, run_reference


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(self.norm(x))


class Stack(nn.Module):
    """Layer blocks called in an unusual order and one of them twice, numbered leaves after them under the same
    parent, and a block list nested in a block."""

    def __init__(self, order: tuple[int, ...] = (0, 2, 1, 1, 3, 4)) -> None:
        super().__init__()
        self.order = order
        self.blocks = nn.ModuleList(Block() for _ in range(5))
        self.heads = nn.ModuleList(nn.Linear(4, 2) for _ in range(3))  # numbered, not layer blocks
        self.inner = nn.ModuleDict({"layers": nn.ModuleList(Block() for _ in range(4))})

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i in self.order:
            x = self.blocks[i](x)
        for layer in self.inner["layers"]:
            x = layer(x)
        return tuple(head(x) for head in self.heads)


@pytest.mark.parametrize("use_repr", [True, False])
@pytest.mark.parametrize("order", [(0, 1, 2, 3, 4), (0, 2, 1, 1, 3, 4), (4, 3)])
def test_pruned_files_equal_transformers(tmp_path: Path, use_repr: bool, order: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = Stack(order)
    x = torch.randn(2, 4)
    ours = run_ours(model, lambda: model(x), tmp_path / "ours", use_repr=use_repr)
    reference = run_reference(model, lambda: model(x), tmp_path / "reference", use_repr=use_repr)
    assert_same_trace_files(reference, ours)


def test_dropped_blocks_keep_statistics_but_no_values(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Stack()
    for values in ("repr", "bundle"):
        trace = graphtrace.capture(model, torch.randn(2, 4), path=tmp_path / values, values=values, prune_layers=True)
        kept_ids = {n.id for n in trace.with_pruned_layers().walk()}
        for node in trace.walk():
            outputs = [r for _, r in node.output_tensors()] if node.leaf else []
            leaf_values = [r for _, r in node.input_tensors()] + outputs
            stored = [r.value is not None or r.file is not None for r in leaf_values]
            if node.id in kept_ids:
                assert all(stored), (values, node.id)
            else:
                assert not any(stored), (values, node.id)  # nothing was formatted or written for it
                assert all(r.stats is not None for r in leaf_values)
        dropped = {n.path for n in trace.walk()} - {n.path for n in trace.with_pruned_layers().walk()}
        assert "Stack.blocks.2" in dropped and "Stack.inner.layers.1" in dropped
        assert trace.find("Stack.heads.1").outputs.value is not None or values == "bundle"


def test_a_failing_block_keeps_its_values(tmp_path: Path) -> None:
    class Failing(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.proj(self.norm(x))
            raise RuntimeError("boom")

    torch.manual_seed(0)
    model = Stack((0, 1, 2, 3))
    model.blocks[3] = Failing()
    with pytest.raises(RuntimeError, match="boom"):
        graphtrace.capture(model, torch.randn(2, 4), path=tmp_path, prune_layers=True)
    trace = graphtrace.load(str(tmp_path))
    assert [n.path for n in trace.root.children] == ["Stack.blocks.0", "Stack.blocks.3"]
    assert trace.find("Stack.blocks.3.proj").outputs is not None
    full = (tmp_path / "Stack_debug_tree_FULL_TENSORS.json").read_text()
    assert full.count('"value": [') >= 6 and "Stack.blocks.3.proj" in full
