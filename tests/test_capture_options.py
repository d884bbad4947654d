"""capture()'s conveniences: return_output, modules= (record one part of a real model), the progress line."""

from __future__ import annotations

import io
import os
import pty
import time
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace import progress as progress_module
from graphtrace.errors import InvalidOptionError
from graphtrace.progress import Progress
from tests.conftest import run_cli
from tests.zoo import llama

ROOT = "LlamaForCausalLM"


@pytest.fixture(scope="module")
def model_inputs():  # type: ignore[no-untyped-def]
    return llama()


def test_return_output_gives_the_models_output(model_inputs) -> None:  # type: ignore[no-untyped-def]
    model, inputs = model_inputs
    trace, output = graphtrace.capture(model, inputs, return_output=True)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert torch.equal(output.logits, expected)
    assert isinstance(trace, graphtrace.Trace) and trace.root.path == ROOT
    assert isinstance(graphtrace.capture(model, inputs), graphtrace.Trace)  # the default is unchanged
    with pytest.raises(InvalidOptionError, match="return_output must be True or False"):
        graphtrace.capture(model, inputs, return_output="yes")  # type: ignore[call-overload]


def test_modules_records_one_layer_and_keeps_its_ancestors(model_inputs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model, inputs = model_inputs
    full = graphtrace.capture(model, inputs, ops=True)
    part = graphtrace.capture(model, inputs, ops=True, modules=["model.layers.1"], path=tmp_path / "part")
    paths = [node.path for node in part.walk()]
    layer = f"{ROOT}.model.layers.1"
    # the root and LlamaModel as structural nodes: no inputs, no outputs, only the way down to the layer
    assert paths[:3] == [ROOT, f"{ROOT}.model", layer]
    for structural in part.steps[0], part.steps[0].children[0]:
        assert structural.outputs is None and structural.args == () and not structural.kwargs
        assert structural.error is None and len(structural.children) == 1
    # everything inside the layer, ops included, exactly as a full capture records it
    inside = [node for node in full.walk() if node.path == layer or node.path.startswith((layer + ".", layer + "#"))]
    assert paths[2:] == [node.path for node in inside]
    assert any(node.kind == "op" for node in inside)
    for mine, theirs in zip(list(part.walk())[2:], inside, strict=True):
        assert mine.id == theirs.id
        # a tensor has a value fingerprint once a recorded call returned it: layer 0 did so in the full capture
        assert _unsketched(mine.outputs) == _unsketched(theirs.outputs)
        assert _unsketched(mine.args) == _unsketched(theirs.args)
    assert not any(path.endswith(("embed_tokens", "lm_head", "layers.0", "layers.2")) for path in paths)
    # the saved trace reads back and shows, and its page renders
    assert [node.path for node in graphtrace.load(str(tmp_path / "part")).walk()] == paths
    shown = run_cli("show", str(tmp_path / "part"))
    assert shown.returncode == 0 and "layers.1" in shown.stdout and "layers.0" not in shown.stdout
    viewed = run_cli("view", str(tmp_path / "part"))
    assert viewed.returncode == 0, viewed.stderr


def test_modules_globs(model_inputs) -> None:  # type: ignore[no-untyped-def]
    model, inputs = model_inputs
    trace = graphtrace.capture(model, inputs, modules=["model.layers.*.mlp", "lm_head"])
    recorded = {node.path.removeprefix(ROOT + ".") for node in trace.walk() if node.outputs is not None}
    mlps = {f"model.layers.{i}.mlp" for i in range(3)}
    assert mlps <= recorded and "lm_head" in recorded
    assert all(
        path.startswith(("model.layers.", "lm_head")) and (".mlp" in path or path == "lm_head") for path in recorded
    )
    structural = {node.path.removeprefix(ROOT + ".") for node in trace.walk() if node.outputs is None}
    assert structural == {ROOT, "model", "model.layers.0", "model.layers.1", "model.layers.2"}


def test_modules_that_match_nothing_are_an_error(model_inputs) -> None:  # type: ignore[no-untyped-def]
    model, inputs = model_inputs
    with pytest.raises(InvalidOptionError, match=r"'model.layer.1' matches no module .* Did you mean model.layers.1"):
        graphtrace.capture(model, inputs, modules=["model.layer.1"])
    with pytest.raises(InvalidOptionError, match="not a list of module paths"):
        graphtrace.capture(model, inputs, modules=[3])  # type: ignore[list-item]


def test_progress_line_when_forced(
    model_inputs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    model, inputs = model_inputs
    monkeypatch.setattr(progress_module, "DELAY", 0.0)  # show it from the first moment
    graphtrace.capture(model, inputs, progress=True)
    err = capsys.readouterr().err
    assert "\rgraphtrace: " in err.replace("\r\033[K", "\r") and " calls recorded" in err
    assert err.endswith("\r\033[K")  # erased at the end
    graphtrace.capture(model, inputs)  # stderr is not a terminal here: nothing
    assert capsys.readouterr().err == ""


def test_progress_only_on_a_terminal() -> None:
    leader, follower = pty.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            assert Progress(lambda: "x", stream=terminal).enabled
        assert not Progress(lambda: "x", stream=io.StringIO()).enabled
        stream = io.StringIO()
        shown = Progress(lambda: "graphtrace: 12 calls recorded", stream=stream, enabled=True, delay=0.0)
        deadline = time.monotonic() + 30
        with shown:
            while "12 calls" not in stream.getvalue() and time.monotonic() < deadline:
                pass  # the thread writes at once (delay=0)
        assert stream.getvalue().startswith("\r\033[Kgraphtrace: 12 calls recorded")
        assert stream.getvalue().endswith("\r\033[K")
    finally:
        os.close(leader)
        os.close(follower)


def test_capture_command_takes_modules(tmp_path: Path) -> None:
    result = run_cli(
        "capture", "tests.zoo:llama", "-o", "out", "--modules", "model.layers.2", "--modules", "lm_head", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    trace = graphtrace.load(str(tmp_path / "out"))
    recorded = [node.path.removeprefix(ROOT + ".") for node in trace.walk() if node.outputs is not None]
    assert recorded[0] == "model.layers.2" and recorded[-1] == "lm_head"
    assert all(path.startswith("model.layers.2") or path == "lm_head" for path in recorded)
    wrong = run_cli("capture", "tests.zoo:llama", "-o", "out2", "--modules", "model.layer.2", cwd=tmp_path)
    assert wrong.returncode == 2 and "matches no module" in wrong.stderr and "Traceback" not in wrong.stderr


def _unsketched(value: object) -> object:
    import dataclasses

    from graphtrace.model import TensorRecord

    if isinstance(value, TensorRecord):
        return dataclasses.replace(value, sketch=None)
    if isinstance(value, tuple):
        return tuple(_unsketched(item) for item in value)
    if isinstance(value, dict):
        return {key: _unsketched(item) for key, item in value.items()}
    return value
