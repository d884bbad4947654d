"""graphtrace.compare on real models: the first divergence, identical traces, traces written by transformers,
pruned and multi-step traces, tolerances."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import InvalidOptionError, TraceFormatError
from tests.conftest import ROOT, run_python, run_reference
from tests.zoo import llama

LLAMA = "LlamaForCausalLM"


def _perturbed(parameter: str, delta: float = 0.5) -> Callable[[nn.Module], None]:
    def change(model: nn.Module) -> None:
        with torch.no_grad():
            model.get_parameter(parameter).view(-1)[3] += delta

    return change


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Llama traces, captured once per (variant, values) and reused by the tests of this file."""
    made: dict[tuple[str, str], Path] = {}
    variants = {
        "original": None,
        "input_layernorm": _perturbed("model.layers.1.input_layernorm.weight"),
        "down_proj": _perturbed("model.layers.1.mlp.down_proj.weight"),
    }

    def get(variant: str, values: str = "safetensors") -> Path:
        if (variant, values) not in made:
            model, inputs = llama()
            change = variants[variant]
            if change is not None:
                change(model)
            path = tmp_path_factory.mktemp(f"{variant}-{values}")
            graphtrace.capture(model, inputs, path=path, values=values)
            made[variant, values] = path
        return made[variant, values]

    return get


@pytest.mark.parametrize(
    ("variant", "culprit"),
    [
        ("input_layernorm", f"{LLAMA}.model.layers.1.input_layernorm@0"),  # the layer's first sub-call
        ("down_proj", f"{LLAMA}.model.layers.1.mlp.down_proj@0"),  # deep inside the layer
    ],
)
def test_a_perturbed_weight_is_named_as_the_first_divergence(traces: Callable[..., Path], variant: str, culprit: str):
    result = graphtrace.compare(traces("original"), traces(variant))
    assert not result.equal
    first = result.first_divergence
    assert first is not None and first.a.id == culprit == first.b.id
    assert first.how == "path" and first.inputs_agree and first.status == "diverged"
    output = first.outputs[0]
    assert output.basis == "values" and output.status == "diverged"
    assert 0 < output.outside <= output.numel and output.max_abs > 1e-3 and output.cosine < 1
    # every call that returned earlier agrees, on full values
    earlier = result.calls[: result.calls.index(first)]
    assert earlier and all(call.status in ("equal", "unchecked") and call.inputs_agree for call in earlier)
    assert any(d.basis == "values" for call in earlier for d in call.outputs)
    # the calls that contain it diverge too, but their inputs agree only up to the layer
    parents = [call for call in result.calls if culprit.startswith(call.a.path + ".")]
    assert parents and all(call.status == "diverged" for call in parents)
    later = result.calls[result.calls.index(first) + 1 :]
    assert any(not call.inputs_agree for call in later)


def test_identical_traces_are_equal(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("original"), traces("original"))
    assert result.equal and result.first_divergence is None
    assert len(result.calls) == 45 and not result.only_in_a and not result.only_in_b
    assert all(d.max_abs == 0 and d.cosine == 1 for call in result.calls for d in call.outputs if d.basis == "values")
    assert result.matched_by() == {"path": 45, "rule": 0, "structure": 0, "fused": 0}
    assert "EQUAL: all 45 matched calls agree within tolerance" in result.table()


def test_bundles_are_compared_on_full_values_with_each_shard_opened_once(
    traces: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors

    opened: list[str] = []
    real_open = safetensors.safe_open

    def counting_open(path: str, *args: object, **kwargs: object) -> object:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", counting_open)
    result = graphtrace.compare(traces("original", "bundle"), traces("down_proj", "bundle"))
    first = result.first_divergence
    assert first is not None and first.a.id == f"{LLAMA}.model.layers.1.mlp.down_proj@0"
    assert first.outputs[0].basis == "values" and first.outputs[0].outside > 0
    # one shard per trace, opened once for all its tensors (through its descriptor's /proc path, so no names here)
    assert len(opened) == 2


def test_statistics_alone_find_the_same_culprit(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("original", "none"), traces("down_proj", "none"))
    first = result.first_divergence
    assert first is not None and first.a.id == f"{LLAMA}.model.layers.1.mlp.down_proj@0"
    assert {d.basis for call in result.calls for d in call.outputs} == {"stats"}
    assert first.outputs[0].stat_deltas is not None and "outputs: " in first.reason
    # one side with files, the other without: statistics are compared
    mixed = graphtrace.compare(traces("original"), traces("down_proj", "none"))
    assert mixed.first_divergence.a.id == first.a.id  # type: ignore[union-attr]


def test_tolerance_decides(traces: Callable[..., Path]) -> None:
    loose = graphtrace.compare(traces("original"), traces("down_proj"), atol=10.0)
    assert loose.equal and loose.calls[0].outputs[0].atol == 10.0
    with pytest.raises(InvalidOptionError, match="rtol must be a finite number >= 0"):
        graphtrace.compare(traces("original"), traces("original"), rtol=-1)
    with pytest.raises(InvalidOptionError, match="align='fuzzy' is not one of"):
        graphtrace.compare(traces("original"), traces("original"), align="fuzzy")  # type: ignore[arg-type]


def test_traces_written_by_transformers(tmp_path: Path, traces: Callable[..., Path]) -> None:
    model, inputs = llama()
    run_reference(model, lambda: model(**inputs), tmp_path / "files", do_prune_layers=False, use_repr=False)
    run_reference(model, lambda: model(**inputs), tmp_path / "summary")  # repr values, pruned layers
    _perturbed("model.layers.1.mlp.down_proj.weight")(model)
    run_reference(model, lambda: model(**inputs), tmp_path / "changed", do_prune_layers=False, use_repr=False)

    # transformers' files against graphtrace's own trace of the same forward: equal, on full values
    same = graphtrace.compare(tmp_path / "files", traces("original"))
    assert same.equal and len(same.calls) == 45
    leaf_outputs = sum(1 for call in same.calls if call.a.leaf for _ in call.a.output_tensors())
    assert sum(d.basis == "values" for call in same.calls for d in call.outputs) == leaf_outputs == 35
    # transformers' 5-digit statistics against graphtrace's exact ones: their rounding is not a difference
    rounded = graphtrace.compare(tmp_path / "summary", traces("original", "none"))
    assert rounded.equal and {d.basis for call in rounded.calls for d in call.outputs} == {"stats"}
    pruned = {item.call.path for item in rounded.only_in_b}
    assert f"{LLAMA}.model.layers.1" in pruned and len(pruned) == 13 and not rounded.only_in_a

    # two traces written by transformers, one of them changed
    changed = graphtrace.compare(tmp_path / "files", tmp_path / "changed")
    assert changed.first_divergence.a.id == f"{LLAMA}.model.layers.1.mlp.down_proj@0"  # type: ignore[union-attr]
    # their containers hold no outputs: nothing to compare, so no verdict on them
    layer = next(call for call in changed.calls if call.a.path == f"{LLAMA}.model.layers.1")
    assert layer.status == "unchecked" and layer.outputs == ()


def test_different_inputs_are_said_to_be_the_cause(tmp_path: Path) -> None:
    model, inputs = llama()
    a = graphtrace.capture(model, inputs, path=tmp_path / "a", values="safetensors")
    b = graphtrace.capture(model, {"input_ids": inputs["input_ids"].flip(1)}, path=tmp_path / "b", values="safetensors")
    result = graphtrace.compare(a, b)
    first = result.first_divergence
    assert first is not None and not first.inputs_agree
    assert first.a.path == f"{LLAMA}.model.embed_tokens"  # the first call to return, its integer inputs differ
    token_ids = first.inputs[0]
    assert token_ids.dtype_a == "torch.int64" and token_ids.basis == "values" and token_ids.status == "diverged"
    assert "were the two traces given the same inputs?" in result.table()


def test_several_steps_are_compared_pairwise_and_extra_steps_listed(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with graphtrace.tracing(model, path=tmp_path / "a", values="safetensors"):
        model(x), model(x * 2)
    with graphtrace.tracing(model, path=tmp_path / "b", values="safetensors"):
        model(x), model(x * 3), model(x)
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert {call.step for call in result.calls} == {0, 1}
    assert [(item.step, item.call.path) for item in result.only_in_b] == [
        (2, "Sequential"),
        (2, "Sequential.0"),
        (2, "Sequential.1"),
        (2, "Sequential.2"),
    ]
    first = result.first_divergence
    assert first is not None and first.step == 1 and first.a.path == "Sequential.0" and not first.inputs_agree
    assert all(call.status == "equal" for call in result.calls if call.step == 0)
    # values live in step_0/ and step_1/: they were found and compared
    assert all(d.basis == "values" for call in result.calls for d in call.outputs)
    only_first = graphtrace.compare(tmp_path / "a", tmp_path / "b", step=0)
    assert only_first.equal and not only_first.only_in_b
    assert not graphtrace.compare(tmp_path / "a", tmp_path / "b", step=0, strict=False).strict
    with pytest.raises(InvalidOptionError, match="step 5 does not exist in trace A, which has 2"):
        graphtrace.compare(tmp_path / "a", tmp_path / "b", step=5)


def test_strict_counts_unmatched_calls(tmp_path: Path) -> None:
    x = torch.ones(1, 3)
    torch.manual_seed(0)
    small = nn.Sequential(nn.Linear(3, 3))
    bigger = nn.Sequential(small[0], nn.Identity())
    a = graphtrace.capture(small, x, path=tmp_path / "a")
    b = graphtrace.capture(bigger, x, path=tmp_path / "b")
    assert graphtrace.compare(a, b, align="path").equal
    strict = graphtrace.compare(a, b, align="path", strict=True)
    assert not strict.equal and [item.call.path for item in strict.only_in_b] == ["Sequential.1"]


def test_a_call_that_raised_in_one_trace_diverges(tmp_path: Path) -> None:
    class Flaky(nn.Module):
        def __init__(self, fail: bool) -> None:
            super().__init__()
            self.fail = fail
            self.inner = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.fail:
                raise ValueError("shape mismatch in the port")
            return self.inner(x)

    x = torch.ones(1, 2)
    a = graphtrace.capture(nn.Sequential(Flaky(False)), x, path=tmp_path / "a")
    with pytest.raises(ValueError):
        graphtrace.capture(nn.Sequential(Flaky(True)), x, path=tmp_path / "b")
    result = graphtrace.compare(a, tmp_path / "b", align="path")
    first = result.first_divergence
    assert first is not None and first.a.path == "Sequential.0"
    assert first.error == "only B raised: ValueError: shape mismatch in the port"
    assert [item.call.path for item in result.only_in_a] == ["Sequential.0.inner"]


def test_json_report_is_standard_json(traces: Callable[..., Path]) -> None:
    report = graphtrace.compare(traces("original"), traces("down_proj")).to_json()
    text = json.dumps(report, allow_nan=False)
    loaded = json.loads(text)
    assert loaded["format"] == "graphtrace-diff" and loaded["equal"] is False
    assert loaded["first_divergence"]["a"] == f"{LLAMA}.model.layers.1.mlp.down_proj@0"
    assert loaded["first_divergence"]["inputs_agree"] is True
    call = next(c for c in loaded["calls"] if c["a"] == loaded["first_divergence"]["a"])
    output = call["outputs"][0]
    assert output["name_a"] == "outputs" and output["shape_a"] == [1, 7, 32] and output["basis"] == "values"
    assert output["outside"] > 0 and 0 < output["cosine"] < 1 and output["numel"] == 224
    assert loaded["matched"] == {"path": 45, "rule": 0, "structure": 0, "fused": 0}


def test_non_finite_values_in_both_traces_agree_and_in_one_diverge(tmp_path: Path) -> None:
    class Poison(nn.Module):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.value = value

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            x[0, 0] = self.value
            return x

    x = torch.ones(1, 3)
    paths = {}
    for name, value in (("nan", math.nan), ("nan2", math.nan), ("inf", math.inf), ("one", 1.0)):
        paths[name] = tmp_path / name
        graphtrace.capture(nn.Sequential(Poison(value)), x, path=paths[name], values="safetensors")
    assert graphtrace.compare(paths["nan"], paths["nan2"]).equal
    for other in ("inf", "one"):
        result = graphtrace.compare(paths["nan"], paths[other])
        output = result.first_divergence.outputs[0]  # type: ignore[union-attr]
        assert output.outside == 1 and output.max_abs == math.inf
    json.dumps(graphtrace.compare(paths["nan"], paths["inf"]).to_json(), allow_nan=False)


def test_missing_value_file_is_a_format_error(tmp_path: Path, traces: Callable[..., Path]) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(traces("original"), copy)
    (copy / f"{LLAMA}.lm_head_outputs.safetensors").unlink()
    with pytest.raises(TraceFormatError, match=r"lm_head_outputs\.safetensors.*Copy the trace directory"):
        graphtrace.compare(traces("original"), copy)
    with pytest.raises(TraceFormatError, match="no trace at"):
        graphtrace.compare(tmp_path / "nowhere", copy)


def test_comparing_statistics_does_not_import_torch(traces: Callable[..., Path]) -> None:
    code = (
        "import sys, graphtrace, graphtrace.compare.text; "
        f"result = graphtrace.compare({str(traces('original', 'none'))!r}, {str(traces('down_proj', 'none'))!r}); "
        "result.table(); result.to_json(); graphtrace.load(sys.argv[1]).first_nonfinite(); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(graphtrace.__file__)"
    )
    # this checkout's graphtrace, whatever the cwd pytest runs from and whichever graphtrace is installed
    result = run_python("-c", code, str(traces("original", "none")), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "graphtrace" / "__init__.py")


def test_the_worked_example_of_the_docs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    example = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "compare_traces.py"))
    monkeypatch.chdir(tmp_path)
    assert example["main"](Path("ex")) == 1
    out = capsys.readouterr().out
    assert "first divergence: model.layers.1.self_attn.v_proj (Linear): its inputs agree" in out
    assert out.rstrip().endswith("the culprit: LlamaForCausalLM.model.layers.1.self_attn.v_proj (Linear)")
    docs = (Path(__file__).resolve().parent.parent / "docs" / "compare.md").read_text()
    table = out.split("\n\nthe culprit")[0]
    for line in docs.split("graphtrace diff ex/original ex/port`:")[1].split("```")[1].splitlines():
        if line and line != "...":  # the docs show the example's real output, shortened
            assert line in table.splitlines(), line
