"""The fx engine's promise, checked on one model: strategy="auto" records the module tree, every statistic and
value, and returns the output, exactly as strategy="eager" does, and the model's output equals a plain forward's."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

import graphtrace
from graphtrace.model import CallNode, Trace

REASON = re.compile(r"^[A-Za-z_][\w.]*: \S")
"""A fallback reason: ``"ExceptionType: first line"``."""


def module_tree(node: CallNode) -> CallNode:
    """``node`` as eager capture records it: op children removed, capture strategy and data flow cleared (the two
    things fx adds)."""
    children = tuple(module_tree(child) for child in node.children if child.kind == "module")
    return dataclasses.replace(node, strategy="", inputs_from=(), children=children)


def assert_same_output(actual: Any, expected: Any, where: str = "output") -> None:
    """Bit for bit for tensors, item for item for containers, attribute for attribute for other objects (a cache
    built by each forward is another object with the same contents)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert torch.equal(_bytes(actual), _bytes(expected)), where
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), where
        for key in expected:
            assert_same_output(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_output(a, e, f"{where}[{i}]")
    elif dataclasses.is_dataclass(expected) or hasattr(expected, "__dict__"):
        assert type(actual) is type(expected), where
        assert_same_output(_state(actual), _state(expected), where)
    else:
        assert actual == expected, where


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _state(value: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return {k: v for k, v in vars(value).items() if not callable(v)}


def run(model: torch.nn.Module, inputs: dict[str, Any], strategy: str, **options: Any) -> tuple[Trace, Any]:
    with graphtrace.tracing(model, strategy=strategy, **options) as session:  # type: ignore[arg-type]
        with torch.no_grad():
            output = model(**inputs)
    assert session.trace is not None
    return session.trace, output


def check_auto_equals_eager(model: torch.nn.Module, inputs: dict[str, Any]) -> Trace:
    """Capture ``model`` both ways and check the promise; returns the auto trace."""
    with torch.no_grad():
        plain = model(**inputs)
    eager, eager_output = run(model, inputs, "eager")
    auto, auto_output = run(model, inputs, "auto")
    assert module_tree(auto.root) == module_tree(eager.root)
    assert_same_output(auto_output, plain)
    assert_same_output(eager_output, plain)

    ids = {node.id for node in auto.walk()}
    for node in auto.walk():
        assert set(node.inputs_from) <= ids, node.id  # data flow names calls of this trace
        if node.strategy == "eager":
            assert node.path in auto.fallbacks, node.id  # every eager call says why
    assert all(REASON.match(reason) for reason in auto.fallbacks.values()), auto.fallbacks
    return auto


def check_zoo_model(name: str, fx_at_least: int) -> Trace:
    """:func:`check_auto_equals_eager` on a zoo model, and fx serves at least ``fx_at_least`` of its module calls."""
    from tests.zoo import FX_ZOO

    model, inputs = FX_ZOO[name]()
    trace = check_auto_equals_eager(model, inputs)
    assert trace.coverage().fx >= fx_at_least, trace.coverage()
    return trace
