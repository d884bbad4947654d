"""Vision, audio and multimodal models, and plain models with what transformers does not exercise (data-dependent
control flow, shared weights, nested dict and dataclass outputs): auto equals eager."""

from __future__ import annotations

import pytest

from tests.fx_equivalence import check_auto_equals_eager, check_zoo_model
from tests.zoo import FX_ZOO

# The fewest module calls fx serves per model today (a regression guard; more is welcome).
FX_SERVED_AT_LEAST = {
    "vit": 51,
    "swin": 62,
    "resnet": 46,
    "convnext": 31,
    "clip": 63,
    "llava": 63,
    "wav2vec2": 52,
    "data_dependent_branch": 2,
    "shared_weights": 10,
    "nested_outputs": 4,
}


@pytest.mark.parametrize("name", list(FX_SERVED_AT_LEAST))
def test_auto_equals_eager(name: str) -> None:
    check_zoo_model(name, FX_SERVED_AT_LEAST[name])


def test_data_dependent_control_flow_keeps_the_root_eager() -> None:
    model, inputs = FX_ZOO["data_dependent_branch"]()
    trace = check_auto_equals_eager(model, inputs)
    assert trace.fallbacks == {
        "DataDependentBranch": "TraceError: symbolically traced variables cannot be used as inputs to control flow"
    }
    assert [node.strategy for node in trace.root.children] == ["fx", "fx"]


def test_a_module_shared_under_three_names_is_recorded_under_its_first() -> None:
    model, inputs = FX_ZOO["shared_weights"]()
    trace = check_auto_equals_eager(model, inputs)
    calls = [node.id for node in trace.walk() if node.type_name == "Linear" and node.path.endswith("proj")]
    assert calls == ["SharedWeights.blocks.0.proj@0", "SharedWeights.blocks.0.proj@1", "SharedWeights.blocks.0.proj@2"]
    assert all(node.strategy == "fx" for node in trace.walk())


def test_nested_outputs_are_served_by_fx() -> None:
    model, inputs = FX_ZOO["nested_outputs"]()
    trace = check_auto_equals_eager(model, inputs)
    assert trace.coverage().fx == trace.coverage().module_calls == 4
    summary = trace.root.outputs["summary"]  # type: ignore[index]
    assert isinstance(summary, str) and summary.startswith("Summary(pooled=tensor(")  # a dataclass is its repr
