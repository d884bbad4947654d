"""The forward wrapper and the walk over a model's modules that eager capture (and fx's fallback) installs by."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

import graphtrace
from graphtrace.engine.eager import is_leaf, module_paths


def _reference_paths(model: nn.Module) -> list[tuple[str, nn.Module]]:
    root = type(model).__name__
    return [((f"{root}.{name}" if name else root), module) for name, module in model.named_modules()]


class Shares(nn.Module):
    """One module under three names (the later ones are skipped, its children too), empty slots, nesting."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
        self.first = shared
        self.blocks = nn.ModuleList([nn.Sequential(shared, nn.Identity()), nn.Linear(2, 2)])
        self.add_module("empty", None)  # a slot in _modules holding None
        self.again = shared
        self.holder = nn.Module()
        self.holder.add_module("only_none", None)


def test_module_paths_walk_as_named_modules_does() -> None:
    model = Shares()
    assert [(p, id(m)) for p, m in module_paths(model)] == [(p, id(m)) for p, m in _reference_paths(model)]
    assert len({id(m) for _, m in module_paths(model)}) == len(list(module_paths(model)))  # each module once


class HidesOne(nn.Module):
    """A class with its own named_modules: the walk is its."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = nn.Linear(2, 2)
        self.hidden = nn.Linear(2, 2)

    def named_modules(  # type: ignore[override]
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        for name, module in super().named_modules(memo, prefix, remove_duplicate):
            if not name.endswith("hidden"):
                yield name, module


def test_a_class_with_its_own_named_modules_is_walked_by_it() -> None:
    model = nn.Sequential(HidesOne())
    assert [p for p, _ in module_paths(model)] == ["Sequential", "Sequential.0", "Sequential.0.kept"]
    assert [p for p, _ in module_paths(model)] == [p for p, _ in _reference_paths(model)]


def test_a_module_holding_only_empty_slots_is_a_leaf() -> None:
    model = Shares()
    assert is_leaf(model.holder) and is_leaf(model.blocks[1]) and not is_leaf(model.blocks)


class Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.grad_modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.grad_modes.append(torch.is_grad_enabled())
        raise KeyError("inside")


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Raises()
        self.grad_modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.grad_modes.append(torch.is_grad_enabled())
        try:
            return self.inner(x)
        except KeyError:
            self.grad_modes.append(torch.is_grad_enabled())  # the wrapper gave the caller's mode back
            return x


def test_a_submodule_runs_without_grad_and_gives_the_callers_mode_back_also_when_it_raises(tmp_path: Path) -> None:
    model = Outer()
    with torch.enable_grad():
        with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path)):
            model(torch.ones(1, 2))  # the shim leaves the root in the caller's mode, as transformers does
        assert torch.is_grad_enabled()
    assert model.grad_modes == [True, True] and model.inner.grad_modes == [False]
    trace = graphtrace.capture(model, torch.ones(1, 2), strategy="eager")
    assert [node.error for node in trace.walk()] == [None, "KeyError: 'inside'"]


class _HidesItsChildren(nn.Module):
    """Overrides named_children only: transformers asks named_children whether a module is a leaf."""

    def __init__(self) -> None:
        super().__init__()
        self.helper = nn.Identity()  # never called
        self.w = nn.Parameter(torch.ones(3))

    def named_children(self) -> Iterator[tuple[str, nn.Module]]:
        return iter(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def test_a_module_hiding_its_children_from_named_children_is_a_leaf_as_transformers_says(tmp_path: Path) -> None:
    from transformers.model_debugging_utils import model_addition_debugger_context as reference

    assert is_leaf(_HidesItsChildren())
    model = nn.Sequential(nn.Linear(3, 3), _HidesItsChildren()).eval()
    x = torch.randn(2, 3)
    for name, context in (("hf", reference), ("graphtrace", graphtrace.model_addition_debugger_context)):
        with torch.no_grad(), context(model, debug_path=str(tmp_path / name), do_prune_layers=False):
            model(x)
    for file in ("Sequential_debug_tree_SUMMARY.json", "Sequential_debug_tree_FULL_TENSORS.json"):
        assert (tmp_path / "graphtrace" / file).read_bytes() == (tmp_path / "hf" / file).read_bytes()
