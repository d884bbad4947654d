"""The fx engine's parts on their own: the side-effect guards, the bitwise comparison, the structures and the
signatures plans are cached under, and what tracing makes concrete."""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.immutable_collections import immutable_list

from graphtrace.engine.fx.containers import flatten, leaf_paths, unflatten
from graphtrace.engine.fx.guard import Refused, ReplayGuard, TraceGuard, difference
from graphtrace.engine.fx.lockstep import _registered_child
from graphtrace.engine.fx.signature import signature
from graphtrace.engine.fx.tracer import Plan, TraceContext, trace_module


def test_the_replay_guard_refuses_writes_into_protected_tensors_and_their_views() -> None:
    protected = torch.zeros(4)
    guard = ReplayGuard()
    guard.protect({"x": [protected]})
    with guard:
        fresh = protected + 1
        fresh.add_(1)  # the guarded code's own tensor
        with pytest.raises(Refused, match=r"writes in place into a tensor it did not create \(aten::add_"):
            protected.add_(1)
        with pytest.raises(Refused, match="aten::fill_"):
            protected[1:].fill_(3)  # a view shares the storage
        with pytest.raises(Refused, match="aten::add.out"):
            torch.add(fresh, fresh, out=protected)
    assert torch.equal(protected, torch.zeros(4)) and torch.equal(fresh, torch.full((4,), 2.0))


def test_a_random_draw_is_refused_and_undone() -> None:
    torch.manual_seed(7)
    state = torch.random.get_rng_state()
    with ReplayGuard(), pytest.raises(Refused, match="draws random numbers"):
        torch.randn(3)
    assert torch.equal(torch.random.get_rng_state(), state)
    q = torch.randn(1, 2, 3, 4)
    state = torch.random.get_rng_state()
    with ReplayGuard():  # tagged as drawing (its dropout_p is an argument) but does not at 0: allowed
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.0)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_the_trace_guard_allows_only_tensors_made_while_tracing() -> None:
    existing = torch.zeros(2)
    with TraceGuard():
        made = torch.ones(2)
        made.mul_(3)
        with pytest.raises(Refused):
            existing.add_(1)
    assert torch.equal(existing, torch.zeros(2))


@pytest.mark.parametrize(
    ("replayed", "actual", "found"),
    [
        (torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.nan]), None),
        (torch.tensor([0.0]), torch.tensor([-0.0]), "tensor differs"),
        (torch.tensor([1.0]), torch.tensor([1.0], dtype=torch.float64), "tensor differs"),
        (0.0, -0.0, "value is 0.0 in the graph, -0.0 in the forward"),
        (math.nan, math.nan, None),
        (immutable_list([1, None]), [1, None], None),
        ((1, 2), [1, 2], "value is tuple in the graph, list in the forward"),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, "mapping has keys ['a', 'b'] in the graph, ['b', 'a'] in the forward"),
        (
            {"x": [torch.ones(1), None]},
            {"x": [torch.ones(1), 3]},
            "['x'][1] is NoneType in the graph, int in the forward",
        ),
        (object(), object(), "value is another object object in the graph than in the forward"),
    ],
)
def test_difference_is_bitwise_and_structural(replayed: object, actual: object, found: str | None) -> None:
    assert difference(replayed, actual) == found


@dataclasses.dataclass
class Pair:
    first: torch.Tensor
    second: object = None


Point = namedtuple("Point", "x y")


def test_structures_round_trip_and_name_their_leaves() -> None:
    from transformers.modeling_outputs import BaseModelOutput

    t = torch.ones(1)
    value = (
        [t, {"a": None, "b": Point(t, 2)}],
        OrderedDict(k=t),
        Pair(t, second="s"),
        BaseModelOutput(last_hidden_state=t),
        immutable_list([t]),
    )
    leaves, structure = flatten(value)
    assert len(leaves) == 9 and leaves[1] is None and leaves[3] == 2
    rebuilt = unflatten(leaves, structure)
    assert difference(rebuilt, value[:4] + ([t],)) is None
    assert type(rebuilt[3]) is BaseModelOutput and type(rebuilt[2]) is Pair
    assert leaf_paths(structure)[:4] == [
        (("item", 0), ("item", 0)),
        (("item", 0), ("item", 1), ("item", "a")),
        (("item", 0), ("item", 1), ("item", "b"), ("item", 0)),
        (("item", 0), ("item", 1), ("item", "b"), ("item", 1)),
    ]
    assert leaf_paths(structure)[5:7] == [(("item", 2), ("attr", "first")), (("item", 2), ("attr", "second"))]
    assert flatten(immutable_list([t]))[1] == flatten([t])[1]


def test_signatures_key_on_what_a_graph_is_specialised_on() -> None:
    module = nn.Linear(2, 2)
    base = signature(module, (torch.ones(3, 2),), {"flag": True, "scale": 0.5})
    assert base.kinds == ("tensor", "constant", "constant")
    assert signature(module, (torch.zeros(3, 2),), {"flag": True, "scale": 0.5}).key == base.key  # values do not count
    for other in (
        signature(module, (torch.ones(4, 2),), {"flag": True, "scale": 0.5}),  # shape
        signature(module, (torch.ones(3, 2, dtype=torch.float64),), {"flag": True, "scale": 0.5}),  # dtype
        signature(module, (torch.ones(3, 2).t().contiguous().t(),), {"flag": True, "scale": 0.5}),  # strides
        signature(module, (torch.ones(3, 2),), {"flag": False, "scale": 0.5}),  # a constant
        signature(module, (torch.ones(3, 2),), {"flag": True, "scale": -0.5}),
        signature(module, (torch.ones(3, 2),), {"scale": 0.5, "flag": True}),  # keyword order
    ):
        assert other.key != base.key
    fake = FakeTensorMode().from_tensor(torch.ones(3, 2))
    assert signature(module, (fake,), {"flag": True, "scale": 0.5}).key == base.key  # a parent's trace finds it
    module.train(False)
    assert signature(module, (torch.ones(3, 2),), {"flag": True, "scale": 0.5}).key != base.key
    assert signature(module, (torch.ones(1), object()), {}).kinds == ("tensor", "opaque")


def test_a_call_with_positional_tensors_only_keys_as_its_fake_counterpart() -> None:
    """``module(x)`` skips taking its arguments apart; a parent's trace (fake tensors, taken apart) must still find
    the plan the real call is cached under, and no argument may be dropped or reordered."""
    module = nn.Linear(2, 2)
    x, y = torch.ones(3, 2), torch.ones(2, dtype=torch.float64)
    fake_mode = FakeTensorMode()
    for args in ((x,), (x, y), ()):
        real = signature(module, args, {})
        fake = signature(module, tuple(fake_mode.from_tensor(arg) for arg in args), {})
        assert real.key == fake.key and real.structure == fake.structure and real.kinds == fake.kinds
        assert real.leaves == list(args)
    assert signature(module, (x, y), {}).key != signature(module, (y, x), {}).key


class UsesShapes(nn.Module):
    """Shape unpacking and a shape test, which plain fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *batch, width = x.shape
        heads = self.proj(x).view(*batch, 2, width // 2)
        if heads.shape[-2] > 1:
            heads = heads.transpose(-1, -2)
        return heads.reshape(*batch, width) * math.sqrt(width)


def _trace(module: nn.Module, *args: object) -> Plan | str:
    context = TraceContext(
        FakeTensorMode(), lambda child, a, k: trace_module(child, child.forward, signature(child, a, k), context)
    )
    return trace_module(module, module.forward, signature(module, args, {}), context)


def test_tracing_makes_shapes_and_child_outputs_concrete() -> None:
    plan = _trace(UsesShapes(), torch.randn(2, 3, 8))
    assert isinstance(plan, Plan)
    targets = [node.target for node in plan.graph.nodes if node.op == "call_method"]
    assert targets == ["view", "transpose", "reshape"]
    view = next(node for node in plan.graph.nodes if node.target == "view")
    assert view.args[1:] == (2, 3, 2, 4)  # the shape, made concrete
    assert tuple(plan.output_meta.shape) == (2, 3, 8)


def test_tracing_refuses_what_it_cannot_replay() -> None:
    class DataDependent(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x

    assert _trace(DataDependent(), torch.ones(2)) == (
        "TraceError: symbolically traced variables cannot be used as inputs to control flow"
    )

    class Remembers(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.last = x
            return x

    module = Remembers()
    assert _trace(module, torch.ones(2)).startswith("SideEffect: tracing the forward changes 'last' of a module")
    assert "last" not in vars(module)


class Shadowed(nn.Module):
    """A registered child ``a`` that attribute lookup does not reach: the class's property answers first."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(1, 1)
        self.b = nn.Linear(1, 1)

    @property  # type: ignore[misc]
    def a(self) -> nn.Module:  # noqa: F811
        return self.b


class LooksUpItself(nn.Module):
    def __getattr__(self, name: str) -> object:
        return nn.Module.__getattr__(self, "b" if name == "a" else name)


def test_a_child_is_taken_from_its_registry_only_where_attribute_lookup_would_find_it_there() -> None:
    """The replays resolve a graph's ``call_module`` target as ``get_submodule`` does; the shortcut answers only
    when that is the registered child."""
    outer = nn.Sequential(nn.Linear(1, 1))
    assert _registered_child(outer, "0") is outer.get_submodule("0")
    assert _registered_child(nn.Sequential(outer), "0.0") is None  # a dotted path: get_submodule walks it
    shadowed = Shadowed()
    assert shadowed._modules["a"] is not shadowed.get_submodule("a") and _registered_child(shadowed, "a") is None
    custom = LooksUpItself()
    custom.a, custom.b = nn.Linear(1, 1), nn.Linear(1, 1)
    assert custom.get_submodule("a") is custom.b and _registered_child(custom, "a") is None
    assert _registered_child(outer, "missing") is None
