"""The ``strategy`` option, the coverage of a trace, and both on the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.coverage import Coverage
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.errors import FxCaptureError, GraphtraceError
from tests.conftest import run_cli
from tests.test_fx_engine import ListCache, UsesCache, Wrapper
from tests.zoo import FX_ZOO

CACHE_UPDATE = "Refused: calls DynamicCache.update, which a replay would repeat"


def test_strategy_fx_raises_after_the_forward_with_every_module_and_reason(tmp_path: Path) -> None:
    model, inputs = FX_ZOO["llama"]()
    with torch.no_grad():
        expected = model(**inputs).logits
    with pytest.raises(FxCaptureError) as raised:
        graphtrace.capture(model, inputs, strategy="fx", path=tmp_path)
    error = raised.value
    assert isinstance(error, RuntimeError) and isinstance(error, GraphtraceError)
    assert set(error.fallbacks) == {
        "LlamaForCausalLM.model",
        *(f"LlamaForCausalLM.model.layers.{i}.self_attn" for i in range(3)),
    }
    message = str(error)
    assert message.startswith("strategy='fx': torch.fx could not serve 4 modules:")
    assert f"{CACHE_UPDATE} (3 modules: LlamaForCausalLM.model.layers.0.self_attn," in message
    assert f"saved to {tmp_path}" in message and "strategy='auto'" in message
    # the forward ran once, untouched; the trace is complete and saved
    trace = error.trace
    assert isinstance(trace, graphtrace.Trace) and trace.meta.strategy == "fx"
    assert trace.coverage().module_calls == 45
    saved = graphtrace.load(str(tmp_path))
    assert saved.fallbacks == error.fallbacks and saved.coverage() == trace.coverage()
    with graphtrace.tracing(model, strategy="eager"):
        assert torch.equal(model(**inputs).logits, expected)
    assert all("forward" not in module.__dict__ for module in model.modules())


def test_strategy_fx_on_a_model_fx_serves_whole() -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), strategy="fx")
    assert trace.fallbacks == {} and {node.strategy for node in trace.walk()} == {"fx"}


def test_strategy_eager_never_loads_fx() -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")
    assert {node.strategy for node in trace.walk()} == {"eager"}
    assert trace.coverage() == Coverage(module_calls=57, fx=0, eager={"strategy='eager'": 57})
    code = (
        "import sys, graphtrace\n"
        "from graphtrace.demo import demo_inputs, demo_model\n"
        "graphtrace.capture(demo_model(), demo_inputs(), strategy='eager')\n"
        "loaded = [name for name in sys.modules if name.startswith('graphtrace.engine.fx')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_coverage_counts_calls_by_strategy_and_reason() -> None:
    trace = graphtrace.capture(Wrapper(UsesCache()), (torch.ones(1, 4), ListCache()))
    coverage = trace.coverage()
    assert coverage == Coverage(
        module_calls=3, fx=2, eager={"Refused: calls ListCache.update, which a replay would repeat": 1}
    )
    assert coverage.summary() == (
        "fx served 2 of 3 module calls (67%); eager: 1 × Refused: calls ListCache.update, which a replay would repeat"
    )


def test_coverage_of_a_model_called_twice_counts_every_call() -> None:
    model = demo_model()
    with graphtrace.tracing(model) as session:
        with torch.no_grad():
            model(**demo_inputs())
            model(**demo_inputs(seed=3))
    assert session.trace is not None
    assert session.trace.coverage() == Coverage(module_calls=114, fx=114)
    assert str(session.trace.coverage()) == "fx served 114 of 114 module calls (100%)"


def test_show_prints_the_coverage_line(tmp_path: Path) -> None:
    captured = run_cli("capture", "tests.zoo:llama", "-o", "out", cwd=tmp_path)
    assert captured.returncode == 0, captured.stderr
    shown = run_cli("show", "out", "--depth", "3", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1] == (  # in a porter's words; --why adds the technical reasons
        "coverage: torch.fx verified 41 of 45 module calls (91%); 4 recorded by wrapping forward: the model passes a "
        "cache object (4)"
    )
    why = run_cli("show", "out", "--depth", "3", "--why", cwd=tmp_path).stdout.splitlines()
    assert why[2] == (
        f"why: fx served 41 of 45 module calls (91%); eager: 3 × {CACHE_UPDATE}, "
        "1 × NotImplementedError: argument of type: <class 'transformers.cache_utils.DynamicCache'>"
    )
    assert any(
        line.endswith(f"the model passes a cache object (why: {CACHE_UPDATE})") and "self_attn" in line for line in why
    )


def test_capture_with_strategy_fx_on_the_command_line_fails_with_the_reasons(tmp_path: Path) -> None:
    captured = run_cli("capture", "tests.zoo:llama", "-o", "out", "--strategy", "fx", cwd=tmp_path)
    assert captured.returncode == 2
    assert captured.stderr.startswith("graphtrace capture: error: strategy='fx': torch.fx could not serve 4 modules")
    assert CACHE_UPDATE in captured.stderr and "Traceback" not in captured.stderr
    assert (tmp_path / "out" / "LlamaForCausalLM_graphtrace.json").is_file()  # the trace was kept
