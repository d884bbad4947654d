"""The shim against transformers' own model_addition_debugger_context: same files on the same model and inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import assert_same_trace_files, run_ours, run_reference
from tests.zoo import ORACLE_MODELS

MODES = [
    pytest.param({"use_repr": True, "do_prune_layers": True}, id="repr-pruned"),
    pytest.param({"use_repr": True, "do_prune_layers": False}, id="repr-all"),
    pytest.param({"use_repr": False, "do_prune_layers": True}, id="safetensors-pruned"),
    pytest.param({"use_repr": False, "do_prune_layers": False}, id="safetensors-all"),
]


def _compare(tmp_path: Path, model: nn.Module, call, **options) -> None:  # type: ignore[no-untyped-def]
    ours = run_ours(model, call, tmp_path / "ours", **options)
    reference = run_reference(model, call, tmp_path / "reference", **options)
    assert_same_trace_files(reference, ours)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(ORACLE_MODELS))
def test_real_architectures_match_transformers(tmp_path: Path, name: str, mode: dict) -> None:
    model, inputs = ORACLE_MODELS[name]()
    _compare(tmp_path, model, lambda: model(**inputs), **mode)


# -- custom models covering the format's corners ---------------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, mask: torch.Tensor | None = None) -> tuple:
        y = self.norm(self.proj(x)) * scale
        return y, {"mask": mask, "sum": y.sum(-1), "flag": True, "nested": [y[:, :1], None]}


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 6)
        self.blocks = nn.ModuleList(Inner() for _ in range(4))
        self.never_called = nn.Sequential(nn.Linear(6, 6), nn.ReLU())  # a container whose children never run
        self.unused_leaf = nn.Linear(2, 2)
        self.head = nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None, label: str = "x") -> dict:
        h = self.embed(ids)
        aux = []
        for block in self.blocks:
            h, extra = block(h, scale=0.5, mask=mask)
            aux.append(extra["sum"])
        return {"logits": self.head(h), "aux": tuple(aux), "label": label}


class MixedDtypes(nn.Module):
    """Leaves that see and return float16, bfloat16, float64, int, bool and non-contiguous tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16 = nn.Linear(4, 4).to(torch.float16)
        self.bf16 = nn.Linear(4, 4).to(torch.bfloat16)
        self.fp64 = nn.Linear(4, 4).to(torch.float64)
        self.count = Counter()

    def forward(self, x: torch.Tensor) -> tuple:
        a = self.fp16(x.to(torch.float16))
        b = self.bf16(x.to(torch.bfloat16).t().contiguous().t())
        c = self.fp64(x.double())
        counted = self.count(x.t(), x > 0)  # non-contiguous float input, bool input
        return a, b, c, counted


class Counter(nn.Module):
    def forward(self, x: torch.Tensor, positive: torch.Tensor) -> tuple:
        return positive.sum(dim=0), x.argmax(dim=0), positive, x[::2]


class Aliased(nn.Module):
    """One Linear registered under two names and called through both, and a shared norm called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(5, 5)
        self.second = self.first
        self.norm = nn.LayerNorm(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.second(self.norm(self.first(x))))


def test_nested_kwargs_tuple_and_dict_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Nested().eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.tensor([[1, 1, 0, 1]])
    for i, mode in enumerate(MODES):
        _compare(tmp_path / str(i), model, lambda: model(ids, mask=mask, label="hello"), **mode.values[0])


@pytest.mark.parametrize("use_repr", [True, False])
def test_mixed_dtypes_and_non_contiguous_tensors(tmp_path: Path, use_repr: bool) -> None:
    torch.manual_seed(0)
    model = MixedDtypes()
    x = torch.randn(4, 4)
    _compare(tmp_path, model, lambda: model(x), use_repr=use_repr)


def test_aliased_module_is_recorded_under_its_first_name(tmp_path: Path) -> None:
    # The shared norm is called twice: the JSON is the reference's; files differ by design (see test_compat_faults).
    torch.manual_seed(0)
    model = Aliased()
    x = torch.randn(2, 5)
    _compare(tmp_path, model, lambda: model(x), use_repr=True)
    text = (tmp_path / "ours" / "Aliased_debug_tree_SUMMARY.json").read_text()
    assert "Aliased.second" not in text and text.count('"Aliased.first"') == 2


def test_several_forward_calls_keep_the_last_calls_files(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Nested().eval()
    first, last = torch.tensor([[1, 2]]), torch.tensor([[5, 6, 7]])

    def two_calls() -> None:
        model(first)
        model(last)

    _compare(tmp_path, model, two_calls, use_repr=False, do_prune_layers=False)
    summary = (tmp_path / "ours" / "Nested_debug_tree_SUMMARY.json").read_text()
    assert "torch.Size([1, 3])" in summary and "torch.Size([1, 2])" not in summary


def test_root_body_keeps_callers_grad_mode(tmp_path: Path) -> None:
    """The root's own ops run with autograd as in transformers, so a child's input repr shows its grad_fn."""

    class ScaledRoot(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.full((3,), 2.0))
            self.leaf = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.leaf(x * self.scale)

    torch.manual_seed(0)
    model = ScaledRoot()
    x = torch.randn(2, 3)
    _compare(tmp_path, model, lambda: model(x), use_repr=True)
    assert "grad_fn=<MulBackward0>" in (tmp_path / "ours" / "ScaledRoot_debug_tree_FULL_TENSORS.json").read_text()


@pytest.mark.parametrize("value", [None, 0, 1, ""])
def test_options_are_read_for_their_truth_as_transformers_reads_them(tmp_path: Path, value: object) -> None:
    model, inputs = ORACLE_MODELS["llama"]()
    _compare(tmp_path, model, lambda: model(**inputs), use_repr=False, do_prune_layers=value)


def test_a_falsy_debug_path_writes_into_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import graphtrace

    model = nn.Sequential(nn.Linear(2, 2))
    monkeypatch.chdir(tmp_path)
    with graphtrace.model_addition_debugger_context(model, debug_path="", do_prune_layers=None):
        model(torch.ones(1, 2))
    assert (tmp_path / "Sequential_debug_tree_SUMMARY.json").is_file()
