"""The fx engine's guarantees on models built to break them: side effects happen once, graphs that would be silently
wrong are caught, nothing is left behind, and plans are reused per module key and signature."""

from __future__ import annotations

import contextvars
from typing import Any

import pytest
import torch
from torch import nn
from torch._tensor_str import PRINT_OPTS

import graphtrace
import graphtrace.engine.fx.dispatch as fx_dispatch
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.engine.fx.plans import module_keys
from tests.fx_equivalence import assert_same_output, check_auto_equals_eager, module_tree, run
from tests.zoo import FX_ZOO


class Wrapper(nn.Module):
    """A root whose own graph is trivial, around the module under test."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        return self.head(self.inner(x, *rest)) * 1


class BufferCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * self.calls


class PythonCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return x * 2


class ListCache:
    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []

    def update(self, value: torch.Tensor) -> torch.Tensor:
        self.items.append(value)
        return torch.cat(self.items, dim=0)


class UsesCache(nn.Module):
    def forward(self, x: torch.Tensor, cache: ListCache) -> torch.Tensor:
        return cache.update(x * 2)[-1:]


class HoldsTensors:
    def __init__(self) -> None:
        self.tensors = [torch.zeros(4)]


class WritesIntoWhatItHolds(nn.Module):
    """Reads a tensor out of an object it was given and writes into it: the replay must not write again."""

    def forward(self, x: torch.Tensor, holder: HoldsTensors) -> torch.Tensor:
        kept = holder.tensors[0]
        kept.add_(1)
        return x + kept


class ScalesItsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1


def _reason(trace: graphtrace.Trace, suffix: str) -> str:
    (path,) = [path for path in trace.fallbacks if path.endswith(suffix)]
    return trace.fallbacks[path]


def _from_the_same_start(build: Any, *inputs: Any) -> tuple[nn.Module, graphtrace.Trace]:
    """A model that changes its own state (or its inputs), captured by eager and by auto from identical copies: the
    traces and outputs must agree; returns the auto-captured model and its trace."""
    results = []
    for strategy in ("eager", "auto"):
        torch.manual_seed(0)
        model = build()
        with graphtrace.tracing(model, strategy=strategy) as session:  # type: ignore[arg-type]
            with torch.no_grad():
                output = model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        results.append((model, session.trace, output))
    (_, eager, eager_output), (model, auto, auto_output) = results
    assert eager is not None and auto is not None
    assert module_tree(auto.root) == module_tree(eager.root)
    assert_same_output(auto_output, eager_output)
    return model, auto


def test_an_in_place_buffer_update_happens_once() -> None:
    model, trace = _from_the_same_start(lambda: Wrapper(BufferCounter()), torch.ones(1, 4))
    assert model.inner.calls.item() == 1
    assert _reason(trace, "inner") == "Refused: writes in place into a tensor it did not create (aten::add_.Tensor)"


def test_a_python_counter_is_put_back_after_tracing() -> None:
    model, trace = _from_the_same_start(lambda: Wrapper(PythonCounter()), torch.ones(1, 4))
    assert model.inner.seen == 1
    assert _reason(trace, "inner").startswith("SideEffect: tracing the forward changes 'seen' of a module")


def test_a_cache_argument_is_updated_once_per_call() -> None:
    model = Wrapper(UsesCache())
    cache = ListCache()
    trace = graphtrace.capture(model, (torch.ones(1, 4), cache))
    assert len(cache.items) == 1
    assert _reason(trace, "inner") == "Refused: calls ListCache.update, which a replay would repeat"
    assert trace.find("Wrapper").strategy == "fx"  # passing the cache along is fine


def test_a_tensor_read_out_of_an_argument_is_written_once() -> None:
    holder = HoldsTensors()
    trace = graphtrace.capture(Wrapper(WritesIntoWhatItHolds()), (torch.ones(1, 4), holder))
    assert torch.equal(holder.tensors[0], torch.ones(4))
    assert _reason(trace, "inner").startswith("Refused: writes in place into a tensor it did not create (aten::add_")


def test_an_input_scaled_in_place_is_scaled_once() -> None:
    _, trace = _from_the_same_start(lambda: Wrapper(ScalesItsInput()), torch.ones(1, 4))
    x = torch.ones(1, 4)
    graphtrace.capture(Wrapper(ScalesItsInput()), x)
    assert torch.equal(x, torch.full((1, 4), 2.0))
    assert _reason(trace, "inner").startswith("Refused: writes in place into a tensor it did not create (aten::mul_")


def test_batch_norm_in_training_updates_its_statistics_once() -> None:
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    eager, auto = model(), model()
    graphtrace.capture(eager, x, strategy="eager")
    trace = graphtrace.capture(auto, x)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(auto[1], name), getattr(eager[1], name)), name
    assert auto[1].num_batches_tracked.item() == 1
    assert trace.fallbacks["Sequential.1"].startswith("Refused: writes in place into a tensor it did not create")


def test_dropout_in_training_draws_the_same_numbers_as_eager() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)).train()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    results = {}
    for strategy in ("eager", "auto"):
        torch.manual_seed(123)
        trace, output = run(model, {"input": x}, strategy)
        results[strategy] = (trace, output, torch.random.get_rng_state())
    (eager, eager_out, eager_rng), (auto, auto_out, auto_rng) = results["eager"], results["auto"]
    assert_same_output(auto_out, eager_out)
    assert torch.equal(auto_rng, eager_rng)
    assert module_tree(auto.root) == module_tree(eager.root)
    assert auto.fallbacks["Sequential.1"] == "Refused: draws random numbers (aten::bernoulli_.float)"


# -- graphs that would be silently wrong ------------------------------------------------------------------------------

_collector: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar("collector", default=None)


class CollectsWithHooks(nn.Module):
    """Collects a child's output with a forward hook, as transformers collects hidden states: hooks do not run
    while a graph is traced, so the graph returns nothing collected."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.a.register_forward_hook(self._collect)

    @staticmethod
    def _collect(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        collected = _collector.get()
        if collected is not None:
            collected.append(output)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        collected: list[torch.Tensor] = []
        token = _collector.set(collected)
        try:
            y = self.a(x)
        finally:
            _collector.reset(token)
        return y, tuple(collected)


class Box:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class MakesBox(nn.Module):
    def forward(self, x: torch.Tensor) -> Box:
        return Box(x * 2)


class SetsAttributeOnOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.make = MakesBox()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        box = self.make(x)
        box.scale = 3.0
        return box.value * box.scale


class ChecksIsinstance(nn.Module):
    """``isinstance(x, torch.Tensor)`` is False for a traced value: the graph takes the other branch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if isinstance(x, torch.Tensor) else 2.0
        return self.a(x) * scale


class ReturnsNone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.a(x), None


class ChecksChildOutputForNone(nn.Module):
    """``extra is not None`` on a child's output: always true for an fx proxy, resolved here by the child's plan."""

    def __init__(self) -> None:
        super().__init__()
        self.child = ReturnsNone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, extra = self.child(x)
        if extra is not None:
            hidden = hidden + extra
        return hidden * 2


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (CollectsWithHooks(), "Mismatch: the output: [1] has 0 items in the graph, 1 in the forward"),
        (
            SetsAttributeOnOutput(),
            "TraceError: assigns attribute 'scale' on a traced value, which torch.fx cannot record",
        ),
        (ChecksIsinstance(), "Mismatch: the output: tensor differs"),
    ],
    ids=["hooks-collect-outputs", "attribute-on-output", "isinstance-on-traced-value"],
)
def test_a_graph_that_would_be_silently_wrong_falls_back(model: nn.Module, reason: str) -> None:
    trace = check_auto_equals_eager(model, {"x": torch.randn(2, 4)})
    assert trace.root.strategy == "eager"
    assert trace.fallbacks[trace.root.path] == reason


def test_none_in_a_child_output_is_known_while_tracing() -> None:
    trace = check_auto_equals_eager(ChecksChildOutputForNone(), {"x": torch.randn(2, 4)})
    assert [node.strategy for node in trace.walk()] == ["fx", "fx", "fx"] and not trace.fallbacks


# -- residue ----------------------------------------------------------------------------------------------------------


def _state(model: nn.Module) -> list[tuple[str, dict[str, Any]]]:
    """Every module's attributes, and the items of those that are containers (hooks, parameters, buffers)."""
    state = []
    for name, module in model.named_modules():
        attributes = {}
        for key, value in module.__dict__.items():
            if isinstance(value, dict):
                value = (value, list(value.items()))
            elif isinstance(value, (list, set)):
                value = (value, list(value))
            attributes[key] = value
        state.append((name, attributes))
    return state


def _same_state(before: list[tuple[str, dict[str, Any]]], after: list[tuple[str, dict[str, Any]]]) -> bool:
    def identity(value: Any) -> Any:
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list):
            return id(value[0]), [
                (k, id(v)) if isinstance(item, tuple) else id(item)
                for item in value[1]
                for k, v in [item if isinstance(item, tuple) else (0, item)]
            ]
        return id(value)

    return [(n, {k: identity(v) for k, v in a.items()}) for n, a in before] == [
        (n, {k: identity(v) for k, v in a.items()}) for n, a in after
    ]


@pytest.mark.parametrize(
    "build", [lambda: (demo_model(), demo_inputs()), FX_ZOO["llama"], FX_ZOO["swin"]], ids=["demo", "llama", "swin"]
)
def test_auto_capture_leaves_nothing_behind(build: Any) -> None:
    model, inputs = build()
    with torch.no_grad():
        model(**inputs)  # transformers may set up things of its own on a first forward
    before = _state(model)
    options = dict(vars(PRINT_OPTS))
    module_call, module_getattr = nn.Module.__call__, nn.Module.__getattr__
    graphtrace.capture(model, inputs, ops=True)
    assert _same_state(before, _state(model))
    assert not any(name.startswith("_graphtrace") for _, module in model.named_modules() for name in vars(module))
    assert (nn.Module.__call__, nn.Module.__getattr__) == (module_call, module_getattr)
    assert dict(vars(PRINT_OPTS)) == options and torch.is_grad_enabled()
    assert not torch.fx._symbolic_trace.is_fx_tracing()


class ComputesThenFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(2)
        self.mismatched = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = (self.norm(x) * 2).relu()
        return self.mismatched(hidden)


def test_a_forward_that_raises_keeps_its_type_and_the_partial_trace() -> None:
    model = ComputesThenFails()
    before = _state(model)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as raised:
        with graphtrace.tracing(model, ops=True) as session:
            model(torch.ones(1, 2))
    assert "the call that raised: ComputesThenFails.mismatched@0" in raised.value.__notes__[-1]
    assert session.trace is not None
    assert [(n.id, n.kind, n.strategy) for n in session.trace.walk()] == [
        ("ComputesThenFails@0", "module", "eager"),
        ("ComputesThenFails.norm@0", "module", "fx"),
        ("ComputesThenFails#mul@0", "op", "eager"),
        ("ComputesThenFails#relu@0", "op", "eager"),
        ("ComputesThenFails.mismatched@0", "module", "eager"),
    ]  # the op tier records the ops the real forward ran before it raised, whether or not fx verified the graph
    assert session.trace.fallbacks == {}  # a forward that raises says nothing about fx
    assert _same_state(before, _state(model))


# -- plans per module and signature -----------------------------------------------------------------------------------


def test_plans_are_traced_once_per_module_key_and_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    traced: list[tuple[int, int]] = []
    trace_module = fx_dispatch.trace_module

    def counting(module: nn.Module, forward: Any, call: Any, context: Any) -> Any:
        traced.append((id(module), len(call.leaves)))
        return trace_module(module, forward, call, context)

    monkeypatch.setattr(fx_dispatch, "trace_module", counting)
    model = demo_model()
    # identical instances (the four decoder layers, their norms, projections) share one plan
    kinds = len({key for key in module_keys(model).values()}) - 1  # the ModuleList is never called
    with graphtrace.tracing(model) as session:
        with torch.no_grad():
            model(**demo_inputs(length=12, seed=0))
            model(**demo_inputs(length=12, seed=1))  # same signature: the plans are reused
            assert len(traced) == kinds < 20
            model(**demo_inputs(length=5))  # other shapes: traced again
            assert len(traced) == 2 * kinds
    assert session.trace is not None and len(session.trace.steps) == 3
    assert all(node.strategy == "fx" for node in session.trace.walk())


def test_generate_under_auto_equals_eager() -> None:
    model, inputs = FX_ZOO["gpt2"]()
    results = {}
    for strategy in ("eager", "auto"):
        with graphtrace.tracing(model, strategy=strategy) as session:  # type: ignore[arg-type]
            tokens = model.generate(**inputs, max_new_tokens=3, do_sample=False, pad_token_id=0)
        results[strategy] = (session.trace, tokens)
    (eager, eager_tokens), (auto, auto_tokens) = results["eager"], results["auto"]
    assert torch.equal(auto_tokens, eager_tokens) and len(auto.steps) == len(eager.steps) == 3
    for auto_step, eager_step in zip(auto.steps, eager.steps, strict=True):
        assert module_tree(auto_step) == module_tree(eager_step)
    assert auto.coverage().fx > 0.8 * auto.coverage().module_calls


def test_autocast_around_capture_reaches_the_replay_too() -> None:
    model, inputs = demo_model(), demo_inputs()
    traces = {}
    for strategy in ("eager", "auto"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            traces[strategy] = graphtrace.capture(model, inputs, strategy=strategy)  # type: ignore[arg-type]
    assert module_tree(traces["auto"].root) == module_tree(traces["eager"].root)
    assert traces["auto"].find("DemoTransformer.layers.0.attn.q_proj").outputs.dtype == "torch.bfloat16"
    assert traces["auto"].coverage().fx == traces["auto"].coverage().module_calls


def test_half_precision_and_inference_mode() -> None:
    model, inputs = FX_ZOO["vit"]()
    model = model.half()
    trace = check_auto_equals_eager(model, {"pixel_values": inputs["pixel_values"].half()})
    assert trace.coverage().fx == trace.coverage().module_calls
    assert trace.find("ViTModel.layers.0.attention.q_proj").outputs.dtype == "torch.float16"  # type: ignore[union-attr]
    with torch.inference_mode():
        auto = graphtrace.capture(demo_model(), demo_inputs())
        eager = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")
    assert module_tree(auto.root) == module_tree(eager.root)
    assert auto.coverage().fx == auto.coverage().module_calls


class CallCounter:
    """A plain Python object with a side effect: each ``bump`` counts."""

    def __init__(self) -> None:
        self.calls = 0

    def bump(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2


class HandsOut(nn.Module):
    """Returns a Python object, not a tensor: at trace time its caller cannot know what it is."""

    def __init__(self, counter: CallCounter) -> None:
        super().__init__()
        self.counter = counter

    def forward(self, x: torch.Tensor) -> CallCounter:
        return self.counter


class BumpsWhatItGets(nn.Module):
    def __init__(self, counter: CallCounter) -> None:
        super().__init__()
        self.source = HandsOut(counter)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.source(x).bump(x))


def test_a_method_call_on_a_value_unknown_at_trace_time_is_refused_by_the_replay() -> None:
    """The trace cannot tell that ``source(x).bump`` is a Python method with a side effect (the receiver is a child's
    output of unknown kind); the replay must refuse to run it rather than bump the counter a second time."""
    counter = CallCounter()
    model = BumpsWhatItGets(counter)
    x = torch.randn(2, 4)
    trace = graphtrace.capture(model, x)
    assert counter.calls == 1  # the forward's own call, and no replayed one
    assert trace.fallbacks["BumpsWhatItGets"] == "Refused: calls CallCounter.bump, which a replay would repeat"
    assert trace.steps[0].strategy == "eager" and trace.find("BumpsWhatItGets.proj").strategy == "fx"
