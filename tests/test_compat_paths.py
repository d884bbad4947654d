"""model_addition_debugger_context's None and rank paths, against transformers' own on the same model and input:
debug_path=None writes into the current directory, do_prune_layers=None prunes nothing, and a rank other than 0
writes nothing and leaves the model untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import InvalidOptionError
from tests.conftest import spec_files


def _layers() -> nn.Module:
    """Four numbered layer blocks, which pruning would cut to the first and the last."""
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(3, 3), nn.Tanh()) for _ in range(4)))


def _run(
    context: Any, directory: Path, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> tuple[dict[str, str], torch.Tensor]:
    """Run ``context`` (transformers' or ours) in ``directory`` as the current directory with ``debug_path=None``;
    the files written there and the output."""
    directory.mkdir()
    monkeypatch.chdir(directory)
    model = _layers()
    with context(model, debug_path=None, **options):
        output = model(torch.linspace(-1, 1, 6).reshape(2, 3))
    for module in model.modules():  # transformers leaves instance forwards behind
        module.__dict__.pop("forward", None)
    return {name: (directory / name).read_text() for name in sorted(p.name for p in directory.iterdir())}, output


@pytest.mark.parametrize("prune", [None, True])
def test_debug_path_none_writes_into_the_current_directory_as_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prune: bool | None
) -> None:
    from transformers.model_debugging_utils import model_addition_debugger_context as reference

    theirs, their_output = _run(reference, tmp_path / "theirs", monkeypatch, do_prune_layers=prune)
    ours, our_output = _run(
        graphtrace.model_addition_debugger_context, tmp_path / "ours", monkeypatch, do_prune_layers=prune
    )
    assert (
        spec_files(tmp_path / "ours")
        == list(ours)
        == ["Sequential_debug_tree_FULL_TENSORS.json", "Sequential_debug_tree_SUMMARY.json"]
    )
    assert ours == theirs
    assert torch.equal(our_output, their_output)
    summary = ours["Sequential_debug_tree_SUMMARY.json"]
    kept = [i for i in range(4) if f'"Sequential.{i}.0"' in summary]
    assert kept == ([0, 1, 2, 3] if prune is None else [0, 3])  # None prunes nothing, as in transformers


def test_a_debug_path_that_is_not_a_path_is_refused_before_anything_runs() -> None:
    model = _layers()
    with pytest.raises(InvalidOptionError, match="debug_path must be a directory path or None, got int"):
        with graphtrace.model_addition_debugger_context(model, debug_path=3):  # type: ignore[arg-type]
            pass
    assert not any("forward" in module.__dict__ for module in model.modules())


def _as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    """torch.distributed as a process of rank ``rank`` in an initialized job sees it."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)


@pytest.mark.parametrize("use_repr", [True, False])
def test_a_rank_other_than_0_writes_nothing_and_leaves_the_model_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_repr: bool
) -> None:
    from transformers.model_debugging_utils import model_addition_debugger_context as reference

    model = _layers()
    x = torch.randn(2, 3)
    expected = model(x)
    _as_rank(monkeypatch, 1)
    with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path / "ours"), use_repr=use_repr):
        assert not any("forward" in module.__dict__ for module in model.modules())  # nothing attached
        assert torch.equal(model(x), expected)
    with reference(model, debug_path=str(tmp_path / "theirs"), use_repr=use_repr):
        model(x)
    assert list((tmp_path / "theirs").iterdir()) == []  # transformers' rank 1 writes nothing either
    assert list((tmp_path / "ours").iterdir()) == []
    _as_rank(monkeypatch, 0)  # the same job's rank 0 records
    with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path / "ours"), use_repr=use_repr):
        model(x)
    assert spec_files(tmp_path / "ours") == [
        "Sequential_debug_tree_FULL_TENSORS.json",
        "Sequential_debug_tree_SUMMARY.json",
    ]
