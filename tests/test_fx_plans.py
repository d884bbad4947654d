"""Plans shared by identical instances and kept across captures, and the structural check of later calls: fewer
traces and replays, the same trace."""

from __future__ import annotations

import enum
import gc
import re
import weakref
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
import graphtrace.engine.fx.dispatch as fx_dispatch
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.engine.fx.plans import module_keys
from graphtrace.model import Trace
from tests.fx_equivalence import check_auto_equals_eager
from tests.test_fx_engine import _same_state, _state


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> list[nn.Module]:
    """The modules traced, in order, one entry per trace."""
    modules: list[nn.Module] = []
    trace_module = fx_dispatch.trace_module

    def counting(module: nn.Module, forward: Any, call: Any, context: Any) -> Any:
        modules.append(module)
        return trace_module(module, forward, call, context)

    monkeypatch.setattr(fx_dispatch, "trace_module", counting)
    return modules


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> list[nn.Module]:
    """The modules whose call was replayed numerically, one entry per replay."""
    modules: list[nn.Module] = []
    replay = fx_dispatch.Replay

    def counting(module: nn.Module, *args: Any) -> Any:
        modules.append(module)
        return replay(module, *args)

    monkeypatch.setattr(fx_dispatch, "Replay", counting)
    return modules


class Scaled(nn.Module):
    """A layer whose graph is specialised on a plain attribute (the constant of its multiplication)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.scale


class Stack(nn.Module):
    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) + x
        return x


def _flows(trace: Trace) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(node.id, node.strategy, node.inputs_from) for node in trace.walk()]


def test_a_second_capture_traces_nothing_and_records_the_same_trace(traced: list[nn.Module]) -> None:
    model, inputs = demo_model(), demo_inputs()
    first = graphtrace.capture(model, inputs, values="none")
    assert 0 < len(traced) < sum(1 for _ in model.modules())  # identical layers share their plans
    count = len(traced)
    second = graphtrace.capture(model, inputs, values="none")
    assert len(traced) == count
    assert _flows(second) == _flows(first) and second.coverage().fx == second.coverage().module_calls


def test_a_changed_attribute_or_forward_is_traced_again(traced: list[nn.Module]) -> None:
    model = Stack(Scaled(2.0), Scaled(2.0))
    x = torch.randn(2, 4)
    graphtrace.capture(model, x)
    traced.clear()
    model.layers[1].scale = 3.0  # its graph differs now: its own plan, and its parent's
    trace = check_auto_equals_eager(model, {"x": x})
    assert {type(module).__name__ for module in traced} == {"Scaled", "Stack"} and model.layers[1] in traced
    assert all(node.strategy == "fx" for node in trace.walk())
    traced.clear()
    model.layers[0].forward = lambda x: x * 5  # type: ignore[method-assign]  # another forward: another key
    try:
        check_auto_equals_eager(model, {"x": x})
    finally:
        del model.layers[0].forward
    assert model.layers[0] in traced


class Mode(enum.Enum):
    A = 1
    B = 2


class Settings:
    """An object a module holds (as a transformers model holds its config): keyed by identity."""


def test_module_keys_compare_plain_attributes_by_value_and_objects_by_identity() -> None:
    def key(value: object) -> object:
        module = nn.Identity()
        module.setting = value
        return module_keys(module)[id(module)]

    assert key(float("nan")) == key(float("nan")) and key(0.0) != key(-0.0)
    assert key(Mode.A) == key(Mode.A) != key(Mode.B)
    assert key([1, 2.5, "s"]) == key([1, 2.5, "s"]) != key((1, 2.5, "s"))
    settings = Settings()
    assert key(settings) == key(settings) != key(Settings())
    assert key(None) != key(settings)


def test_identical_instances_share_a_plan_and_a_differing_attribute_does_not(
    traced: list[nn.Module], replayed: list[nn.Module]
) -> None:
    model = Stack(Scaled(2.0), Scaled(2.0), Scaled(3.0), Scaled(2.0))
    trace = check_auto_equals_eager(model, {"x": torch.randn(2, 4)})
    scaled = [module for module in traced if isinstance(module, Scaled)]
    assert scaled == [model.layers[0], model.layers[2]]  # 2.0 and 3.0: two plans for four layers
    # verified bit for bit once per plan and capture, the others checked structurally
    assert [m for m in replayed if isinstance(m, Scaled)] == [model.layers[0], model.layers[2]]
    assert [m for m in replayed if isinstance(m, nn.Linear)] == [model.layers[0].proj]
    assert all(node.strategy == "fx" for node in trace.walk())


def test_structurally_checked_layers_get_the_data_flow_of_the_verified_one(replayed: list[nn.Module]) -> None:
    model = demo_model()
    trace = graphtrace.capture(model, demo_inputs(), values="none")
    assert sum(1 for module in replayed if module in list(model.layers)) == 1  # the other three: structural

    def inside(i: int) -> list[tuple[str, tuple[str, ...]]]:
        prefix = f"DemoTransformer.layers.{i}."
        previous = f"DemoTransformer.layers.{i - 1}@0" if i else "DemoTransformer.embed_tokens@0"
        rename = lambda name: "previous" if name == previous else name.replace(prefix, "L.")  # noqa: E731
        return [
            (rename(node.id), tuple(rename(source) for source in node.inputs_from))
            for node in trace.walk()
            if node.path.startswith(prefix)
        ]

    assert inside(1) == inside(2) == inside(3) == inside(0)
    down = trace.find("DemoTransformer.layers.2.mlp.down_proj")
    assert set(down.inputs_from) == {"DemoTransformer.layers.2.mlp.act@0", "DemoTransformer.layers.2.mlp.up_proj@0"}


class ScalesItsInput(nn.Module):
    """Its child reads the input through an operation: only the graph knows where the child's input comes from."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x * 2)


def test_a_structurally_checked_call_passes_its_inputs_producers_through_the_graph(replayed: list[nn.Module]) -> None:
    model = nn.Sequential(ScalesItsInput(), ScalesItsInput(), ScalesItsInput())
    trace = graphtrace.capture(model, (torch.randn(2, 4),), values="none")
    assert [module for module in replayed if isinstance(module, ScalesItsInput)] == [model[0]]
    for i in (1, 2):  # structural: the input's producer (the layer before) reaches the child through x * 2
        assert trace.find(f"Sequential.{i}.proj").inputs_from == (f"Sequential.{i - 1}@0",)  # type: ignore[union-attr]


class SwitchesChildren(nn.Module):
    """Calls ``a``, or ``b`` once a Python counter outside the module's attributes says so: the same signature, other
    children."""

    def __init__(self, counter: list[int]) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.counter = counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(x) if self.counter[0] > 0 else self.a(x)


def test_a_later_call_that_calls_other_children_falls_back_with_the_reason() -> None:
    counter = [0]
    model = Stack(SwitchesChildren(counter))
    x = torch.randn(2, 4)
    with graphtrace.tracing(model, strategy="eager") as eager:
        with torch.no_grad():
            model(x)
            counter[0] = 1
            model(x)
    counter[0] = 0
    with graphtrace.tracing(model) as auto:
        with torch.no_grad():
            model(x)  # verified bit for bit
            counter[0] = 1
            model(x)  # checked structurally: calls b where the graph calls a
    assert auto.trace is not None and eager.trace is not None
    switching = [node for node in auto.trace.walk() if node.path == "Stack.layers.0"]
    assert [node.strategy for node in switching] == ["fx", "eager"]
    assert auto.trace.fallbacks == {
        "Stack.layers.0": "Mismatch: the forward calls Linear where the graph calls a",
    }
    assert [n.outputs for n in auto.trace.walk()] == [n.outputs for n in eager.trace.walk()]


def test_ops_need_no_extra_replays(replayed: list[nn.Module]) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), values="none", ops=True)
    layers = [node for node in trace.walk() if re.fullmatch(r"DemoTransformer\.layers\.\d+\.attn", node.path)]
    assert len(layers) == 4 and len({len(layer.children) for layer in layers}) == 1
    assert all(any(child.kind == "op" for child in layer.children) for layer in layers)
    with_ops = len(replayed)
    replayed.clear()
    graphtrace.capture(demo_model(), demo_inputs(), values="none")
    assert with_ops == len(replayed) < trace.coverage().module_calls  # op records come from the op tier


def test_the_plans_die_with_the_model_and_leave_nothing_on_it() -> None:
    model, inputs = demo_model(), demo_inputs()
    with torch.no_grad():
        model(**inputs)
    before = _state(model)
    graphtrace.capture(model, inputs)
    graphtrace.capture(model, inputs, ops=True)
    assert _same_state(before, _state(model))
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_an_attribute_the_graph_never_uses_costs_a_trace_but_not_a_replay(
    traced: list[nn.Module], replayed: list[nn.Module]
) -> None:
    layers = [Scaled(2.0) for _ in range(3)]
    for index, layer in enumerate(layers):
        layer.layer_idx = index  # keyed by value, unused by the forward
    model = Stack(*layers)
    trace = check_auto_equals_eager(model, {"x": torch.randn(2, 4)})
    assert [module for module in traced if isinstance(module, Scaled)] == layers
    assert [module for module in replayed if isinstance(module, Scaled)] == layers[:1]  # one graph, verified once
    assert all(node.strategy == "fx" for node in trace.walk())


def test_a_leaf_verified_in_one_capture_is_checked_structurally_in_the_next(replayed: list[nn.Module]) -> None:
    model = Stack(Scaled(2.0), Scaled(2.0))
    x = torch.randn(2, 4)
    graphtrace.capture(model, x, values="none")
    assert [m for m in replayed if isinstance(m, nn.Linear)] == [model.layers[0].proj]
    replayed.clear()
    trace = graphtrace.capture(model, x, values="none")
    # leaves have no data flow to learn: proven once, they cost no second computation in later captures;
    # modules with children are still verified bit for bit once per capture
    assert not [m for m in replayed if isinstance(m, nn.Linear)]
    assert [m for m in replayed if isinstance(m, Scaled)] == [model.layers[0]]
    assert all(node.strategy == "fx" for node in trace.walk())
    model.layers[1].proj.weight.data = model.layers[1].proj.weight.data.double()  # another dtype: another key
    replayed.clear()
    graphtrace.capture(model.double(), x.double(), values="none")
    assert model.layers[0].proj in replayed


class SkipsChild(nn.Module):
    """Calls ``a`` then ``b``, or only ``a`` once a Python counter outside the module's attributes says so: the
    same signature, one child call fewer, the same output structure (both children map 4 features to 4)."""

    def __init__(self, counter: list[int]) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.counter = counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        return x if self.counter[0] > 0 else self.b(x)


class Narrow(nn.Module):
    """Keeps the first 4 - counter features: the same signature, another output shape."""

    def __init__(self, counter: list[int]) -> None:
        super().__init__()
        self.counter = counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : 4 - self.counter[0]]


class SumsNarrow(nn.Module):
    """Its own output has the same structure whatever ``narrow`` returns: only the child's output can tell."""

    def __init__(self, counter: list[int]) -> None:
        super().__init__()
        self.narrow = Narrow(counter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.narrow(x).sum(dim=-1, keepdim=True)


def _twice(model: nn.Module, counter: list[int], x: torch.Tensor) -> Trace:
    """Two forwards in one capture: the first verified bit for bit, the second (counter 1) checked structurally."""
    with graphtrace.tracing(model) as session:
        with torch.no_grad():
            model(x)
            counter[0] = 1
            model(x)
    counter[0] = 0
    assert session.trace is not None
    return session.trace


def test_a_later_call_that_skips_a_child_falls_back_with_the_reason() -> None:
    counter = [0]
    model = Stack(SkipsChild(counter))
    trace = _twice(model, counter, torch.randn(2, 4))
    assert [node.strategy for node in trace.walk() if node.path == "Stack.layers.0"] == ["fx", "eager"]
    assert trace.fallbacks == {"Stack.layers.0": "Mismatch: the graph calls b, the forward does not"}
    second = trace.steps[1].children[0]
    assert [child.path for child in second.children] == ["Stack.layers.0.a"]  # what really ran, recorded eagerly


def test_a_later_call_whose_child_returns_another_shape_falls_back_with_the_reason() -> None:
    counter = [0]
    model = Stack(SumsNarrow(counter))
    x = torch.randn(2, 4)
    trace = _twice(model, counter, x)
    layer, narrow = "Stack.layers.0", "Stack.layers.0.narrow"
    assert [node.strategy for node in trace.walk() if node.path == layer] == ["fx", "eager"]
    assert [node.strategy for node in trace.walk() if node.path == narrow] == ["fx", "eager"]
    assert trace.fallbacks[layer].startswith("Mismatch: narrow returned ")
    assert trace.fallbacks[layer].endswith(" than the graph was traced with")
    assert trace.fallbacks[narrow].startswith("Mismatch: the output: ")
    assert trace.find(narrow).outputs.shape == (2, 3)  # type: ignore[union-attr]  # the second step's call
