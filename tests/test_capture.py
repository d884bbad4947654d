"""graphtrace.capture and graphtrace.tracing: the trace they return, the files they write, errors and residue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._tensor_str import PRINT_OPTS

import graphtrace
import graphtrace.api as graphtrace_api
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.errors import InvalidInputsError, InvalidModelError, InvalidOptionError, OutputPathError
from graphtrace.model import TensorRecord
from tests.conftest import run_cli, run_ours


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        out = self.a(x)
        return out if y is None else self.b(out + y)


@pytest.mark.parametrize(
    ("inputs", "expected_calls"),
    [
        ({"x": torch.ones(1, 3), "y": torch.ones(1, 3)}, ["TwoInputs", "TwoInputs.a", "TwoInputs.b"]),
        ((torch.ones(1, 3), torch.ones(1, 3)), ["TwoInputs", "TwoInputs.a", "TwoInputs.b"]),
        (torch.ones(1, 3), ["TwoInputs", "TwoInputs.a"]),
    ],
    ids=["kwargs", "args", "tensor"],
)
def test_inputs_of_every_accepted_kind(inputs: object, expected_calls: list[str]) -> None:
    trace = graphtrace.capture(TwoInputs(), inputs)
    assert [node.path for node in trace.walk()] == expected_calls
    assert len(trace.steps) == 1 and trace.meta.model_class == "TwoInputs"


@pytest.mark.parametrize("bad", [[torch.ones(1, 3)], 3, "x", {1: torch.ones(1)}])
def test_unsupported_inputs_fail_before_the_forward(bad: object) -> None:
    model = TwoInputs()
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(InvalidInputsError, match="dict of keyword|string keys"):
        graphtrace.capture(model, bad)
    assert calls == [] and "forward" not in model.__dict__


def test_rejects_non_module_and_bad_options(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="got builtins.function"):
        graphtrace.capture(lambda x: x, torch.ones(1))
    with pytest.raises(InvalidOptionError, match="values='bogus' is not one of"):
        graphtrace.capture(TwoInputs(), torch.ones(1, 3), values="bogus")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="needs path"):
        graphtrace.capture(TwoInputs(), torch.ones(1, 3), values="safetensors")
    with pytest.raises(InvalidOptionError, match="prune_layers must be True or False"):
        graphtrace.capture(TwoInputs(), torch.ones(1, 3), prune_layers="yes")  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputPathError, match="is a file"):
        graphtrace.capture(TwoInputs(), torch.ones(1, 3), path=tmp_path / "file")


def test_trace_content_of_the_demo_model() -> None:
    model = demo_model()
    inputs = demo_inputs()
    trace = graphtrace.capture(model, inputs)
    root = trace.root
    assert root.path == "DemoTransformer" and root.type_name == "DemoTransformer" and not root.leaf
    layer = trace.find("DemoTransformer.layers.2")
    assert layer.type_name == "DecoderLayer" and [c.name for c in layer.children] == [
        "input_norm",
        "attn",
        "post_attention_norm",
        "mlp",
    ]
    q_proj = trace.find("DemoTransformer.layers.2.attn.q_proj")
    assert q_proj.leaf and q_proj.strategy in ("eager", "fx")
    out = q_proj.outputs
    assert isinstance(out, TensorRecord) and out.shape == (1, 12, 64) and out.dtype == "torch.float32"
    assert out.stats is not None and out.spec_stats is not None and out.is_finite
    assert out.value is not None and out.value[0].startswith("tensor([[[")
    # non-leaf outputs carry statistics (graphtrace's addition) but no value
    assert isinstance(layer.outputs, TensorRecord) and layer.outputs.value is None and layer.outputs.stats
    # data flow: the input norm of layer 2 reads what layer 1 returned
    assert "DemoTransformer.layers.1@0" in trace.find("DemoTransformer.layers.2.input_norm").inputs_from
    # the model's output is unchanged by capture
    with torch.no_grad():
        expected = model(**inputs)
        with graphtrace.tracing(model):
            traced = model(**inputs)
    assert torch.equal(expected, traced)


def test_repeated_calls_are_numbered() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(self.norm(x) * 3)

    trace = graphtrace.capture(Twice(), torch.randn(2, 3))
    first, second = trace.root.children
    assert (first.id, second.id) == ("Twice.norm@0", "Twice.norm@1")
    assert trace.find("Twice.norm", 1) is second
    # the root's graph knows that norm@1 reads norm@0's output through "* 3"; tensor identity alone cannot know
    assert second.inputs_from == ("Twice.norm@0",)
    eager = graphtrace.capture(Twice(), torch.randn(2, 3), strategy="eager")
    assert eager.root.children[1].inputs_from == ()


def test_capture_files_equal_the_shims(tmp_path: Path) -> None:
    model = demo_model()
    inputs = demo_inputs()
    graphtrace.capture(model, inputs, path=tmp_path / "capture")
    run_ours(model, lambda: model(**inputs), tmp_path / "shim", do_prune_layers=False)
    for name in ("DemoTransformer_debug_tree_SUMMARY.json", "DemoTransformer_debug_tree_FULL_TENSORS.json"):
        assert (tmp_path / "capture" / name).read_bytes() == (tmp_path / "shim" / name).read_bytes()


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs())
    written = trace.save(tmp_path)
    assert str(tmp_path / "DemoTransformer_graphtrace.json") in written
    loaded = graphtrace.load(str(tmp_path))
    assert loaded.meta == trace.meta
    originals = list(trace.walk())
    for before, after in zip(originals, loaded.walk(), strict=True):
        assert (after.id, after.type_name, after.leaf, after.inputs_from) == (
            before.id,
            before.type_name,
            before.leaf,
            before.inputs_from,
        )
        # repr lines live in FULL_TENSORS, not in graphtrace's own file
        assert [r.summary() for _, r in after.output_tensors()] == [r.summary() for _, r in before.output_tensors()]


def test_safetensors_values_are_streamed_into_path(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = demo_model()
    trace = graphtrace.capture(model, demo_inputs(), path=tmp_path, values="safetensors")
    q_proj = trace.find("DemoTransformer.layers.0.attn.q_proj")
    record = q_proj.outputs
    assert (
        isinstance(record, TensorRecord) and record.file == "./DemoTransformer.layers.0.attn.q_proj_outputs.safetensors"
    )
    stored = load_file(str(tmp_path / record.file))["data"]
    assert tuple(stored.shape) == record.shape and record.stats is not None
    assert stored.mean().item() == pytest.approx(record.stats.mean, rel=1e-6)
    full = json.loads((tmp_path / "DemoTransformer_debug_tree_FULL_TENSORS.json").read_text())
    assert full["inputs"]["kwargs"]["input_ids"]["value"] == "./DemoTransformer_inputs_kwargs_input_ids.safetensors"


def test_prune_layers_prunes_every_saved_file(tmp_path: Path) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path, values="safetensors", prune_layers=True)
    assert any(node.path.endswith("layers.1") for node in trace.walk())  # the in-memory trace keeps everything
    summary = (tmp_path / "DemoTransformer_debug_tree_SUMMARY.json").read_text()
    own = (tmp_path / "DemoTransformer_graphtrace.json").read_text()
    for text in (summary, own):
        assert "layers.0." in text and "layers.3." in text and "layers.1." not in text and "layers.2." not in text
    assert not list(tmp_path.glob("*layers.1*.safetensors")) and list(tmp_path.glob("*layers.3*.safetensors"))


def test_forward_error_keeps_partial_trace_and_leaves_no_residue(tmp_path: Path) -> None:
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ok = nn.Linear(2, 2)
            self.bad = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bad(self.ok(x))

    model = Fails()
    options = dict(vars(PRINT_OPTS))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as raised:
        graphtrace.capture(model, torch.ones(1, 2), path=tmp_path)
    note = raised.value.__notes__[-1]
    assert f"saved to {tmp_path}" in note and "the call that raised: Fails.bad@0" in note
    trace = graphtrace.load(str(tmp_path))
    assert [n.id for n in trace.walk()] == ["Fails@0", "Fails.ok@0", "Fails.bad@0"]
    assert trace.failed_call() is not None and trace.failed_call().path == "Fails.bad"
    assert trace.find("Fails.ok").error is None
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert dict(vars(PRINT_OPTS)) == options and torch.is_grad_enabled()


def test_tracing_keeps_the_trace_of_a_failing_block() -> None:
    model = TwoInputs()
    with pytest.raises(KeyError):
        with graphtrace.tracing(model) as session:
            model(torch.ones(1, 3))
            raise KeyError("after the forward")
    assert session.trace is not None and [n.path for n in session.trace.walk()] == ["TwoInputs", "TwoInputs.a"]


def test_capture_runs_under_no_grad_and_restores_grad_mode() -> None:
    seen: list[bool] = []
    model = nn.Linear(2, 2)
    model.register_forward_hook(lambda *args: seen.append(torch.is_grad_enabled()))
    with torch.enable_grad():
        graphtrace.capture(model, torch.ones(1, 2))
        assert torch.is_grad_enabled()
    assert seen == [False]


def test_a_failed_forward_without_path_hands_the_partial_trace_to_the_caller() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(3, 3))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as raised:
        graphtrace.capture(model, torch.ones(1, 2))
    assert "kept on this exception's .graphtrace_trace" in raised.value.__notes__[-1]
    partial = raised.value.graphtrace_trace
    assert [n.path for n in partial.walk()] == ["Sequential", "Sequential.0", "Sequential.1"]
    assert partial.failed_call().path == "Sequential.1"


def test_a_save_that_fails_after_a_failed_forward_keeps_the_forwards_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(trace: graphtrace.Trace, directory: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(graphtrace_api, "save", disk_full)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(3, 3))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as raised:
        graphtrace.capture(model, torch.ones(1, 2), path=tmp_path)
    notes = raised.value.__notes__
    assert any("could not be saved" in note and "No space left" in note for note in notes)
    assert "kept on this exception's .graphtrace_trace" in notes[-1]
    assert raised.value.graphtrace_trace.failed_call().path == "Sequential.1"


class ScalesInPlace(nn.Module):
    """Scales ``first``'s output in place after it was recorded, then hands the same tensor object to ``second``."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        hidden.mul_(3.0)
        return self.second(hidden)


@pytest.mark.parametrize("strategy", ["eager", "auto"])
def test_a_tensor_modified_in_place_gets_fresh_statistics(strategy: str) -> None:
    """Statistics are cached per tensor version: the same object, changed in place since, is measured again."""
    torch.manual_seed(0)
    model = ScalesInPlace()
    x = torch.randn(2, 4)
    with torch.no_grad():
        before = model.first(x)
    trace = graphtrace.capture(model, x, strategy=strategy, values="repr")
    first, second = trace.steps[0].children
    recorded, seen = first.outputs, second.args[0]
    assert isinstance(recorded, TensorRecord) and isinstance(seen, TensorRecord)
    assert recorded.stats is not None and seen.stats is not None
    assert recorded.stats.mean == pytest.approx(before.mean().item(), rel=1e-6)
    assert seen.stats.mean == pytest.approx(3 * before.mean().item(), rel=1e-6)
    assert seen.stats.max == pytest.approx(3 * before.max().item(), rel=1e-6)
    assert seen.spec_stats != recorded.spec_stats and seen.value != recorded.value
    assert second.inputs_from == (first.id,)  # modified in place, still the tensor first returned


def test_a_path_with_an_overlong_name_is_a_path_error_before_the_forward(tmp_path: Path) -> None:
    model = TwoInputs()
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(OutputPathError, match=r"File name too long\. A name in the path is longer than the file"):
        graphtrace.capture(model, torch.ones(1, 3), path=tmp_path / ("a" * 300))
    assert calls == []
    result = run_cli("capture", "tests.zoo:llama", "-o", str(tmp_path / ("b" * 300)))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "shorten it" in result.stderr


class CapturesItself(nn.Module):
    """A model whose forward starts a capture of itself (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.inner_started = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.inner_started:
            self.inner_started = True
            graphtrace.capture(self, x)
        return self.proj(x)


@pytest.mark.parametrize("strategy", ["eager", "auto"])
def test_a_model_that_captures_itself_is_refused_and_the_outer_trace_stays_whole(strategy: str) -> None:
    model = CapturesItself()
    with pytest.raises(InvalidOptionError, match="CapturesItself is already being captured") as caught:
        graphtrace.capture(model, torch.ones(1, 3), strategy=strategy)
    trace = caught.value.graphtrace_trace  # type: ignore[attr-defined]
    assert [node.id for node in trace.walk()] == ["CapturesItself@0"]  # the root once, nothing of an inner capture
    assert trace.root.error is not None and "already being captured" in trace.root.error
    assert all("forward" not in module.__dict__ for module in model.modules())
    model.inner_started = True  # afterwards the model is free: a capture from outside works
    assert [node.id for node in graphtrace.capture(model, torch.ones(1, 3)).walk()] == [
        "CapturesItself@0",
        "CapturesItself.proj@0",
    ]


class TiedAndShared(nn.Module):
    """A head tied to the embedding, and a block registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.block = nn.Linear(4, 4)
        self.again = self.block
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.again(self.block(self.embed(ids))))


@pytest.mark.parametrize("build", [TiedAndShared, demo_model])
def test_parameter_counts_are_what_each_module_holds(build: type[nn.Module]) -> None:
    model = build()
    inputs = torch.tensor([[1, 2, 3]]) if build is TiedAndShared else demo_inputs()
    trace = graphtrace.capture(model, inputs)
    root = type(model).__name__
    expected = {
        f"{root}.{name}" if name else root: count
        for name, module in model.named_modules()
        if (count := sum(p.numel() for p in module.parameters()))
    }
    assert trace.parameters == expected  # a tied weight once, as module.parameters() counts it
    if build is TiedAndShared:
        assert trace.parameters == {
            "TiedAndShared": 60,
            "TiedAndShared.embed": 40,
            "TiedAndShared.block": 20,
            "TiedAndShared.head": 40,
        }
