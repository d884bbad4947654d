"""The op tier on every zoo architecture with default settings (use_cache included): each attention module records
its ops, cache-updating ones too, and the model's output stays bit for bit that of a plain forward."""

from __future__ import annotations

import re

import pytest
import torch

import graphtrace
from tests.fx_equivalence import assert_same_output
from tests.zoo import FX_ZOO

WITHOUT_ATTENTION = {"mamba", "resnet", "convnext", "data_dependent_branch", "shared_weights", "nested_outputs"}
ATTENTION = re.compile(r"Attention$|SelfAttention$|Attn$")


@pytest.mark.parametrize("name", sorted(set(FX_ZOO) - WITHOUT_ATTENTION))
def test_every_attention_module_records_its_ops(name: str) -> None:
    model, inputs = FX_ZOO[name]()
    with torch.no_grad():
        expected = model(**inputs)
    trace, output = graphtrace.capture(model, inputs, ops=True, return_output=True)
    assert_same_output(output, expected)
    attention = [
        node for node in trace.walk() if node.kind == "module" and not node.leaf and ATTENTION.search(node.type_name)
    ]
    assert attention, f"{name}: no attention module found"
    # ops inside each attention module (a wrapper such as BertAttention has them in its self-attention)
    counts = {node.id: sum(inner.kind == "op" for inner in node.walk()) for node in attention}
    assert all(count > 0 for count in counts.values()), counts
    assert all(inner.source is not None for node in attention for inner in node.walk() if inner.kind == "op")
