"""Op-level records (``ops=True``) and data flow from the graphs: what they hold, where they go in the files, and
that records of a graph that failed verification are withdrawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.model import CallNode, TensorRecord
from tests.fx_equivalence import module_tree


@pytest.fixture(scope="module")
def demo_ops() -> graphtrace.Trace:
    return graphtrace.capture(demo_model(), demo_inputs(), ops=True)


def test_ops_are_children_of_their_module_in_the_order_they_ran(demo_ops: graphtrace.Trace) -> None:
    attn = demo_ops.find("DemoTransformer.layers.0.attn")
    names = [(child.kind, child.name) for child in attn.children]
    assert names[:3] == [("module", "q_proj"), ("op", "view"), ("op", "transpose")]
    assert names[-6:] == [
        ("op", "masked_fill"),
        ("op", "softmax"),
        ("op", "matmul_1"),
        ("op", "transpose_4"),
        ("op", "reshape"),
        ("module", "o_proj"),
    ]
    softmax = demo_ops.find("DemoTransformer.layers.0.attn#softmax")
    assert (softmax.kind, softmax.type_name, softmax.strategy, softmax.leaf) == ("op", "softmax", "fx", True)
    assert softmax.inputs_from == ("DemoTransformer.layers.0.attn#masked_fill@0",)
    out = softmax.outputs
    assert isinstance(out, TensorRecord) and out.shape == (1, 4, 12, 12) and out.stats is not None
    assert out.stats.mean == pytest.approx(1 / 12)  # each row of 12 attention weights sums to one
    assert out.value is not None and out.value[0].startswith("tensor([[[[")
    assert softmax.kwargs == {"dim": "-1"}


def test_module_calls_keep_their_place_among_the_ops(demo_ops: graphtrace.Trace) -> None:
    attn = demo_ops.find("DemoTransformer.layers.0.attn")
    kinds = [child.name for child in attn.children]
    assert kinds.index("q_proj") < kinds.index("view") < kinds.index("k_proj") < kinds.index("matmul")
    assert kinds.index("softmax") < kinds.index("o_proj") == len(kinds) - 1
    layer = demo_ops.find("DemoTransformer.layers.0")
    assert [child.name for child in layer.children] == [
        "input_norm",
        "attn",
        "add",
        "post_attention_norm",
        "mlp",
        "add_1",  # the two residual adds
    ]


def test_a_module_that_is_one_op_records_none(demo_ops: graphtrace.Trace) -> None:
    assert demo_ops.find("DemoTransformer.layers.0.attn.q_proj").children == ()
    norm = demo_ops.find("DemoTransformer.layers.0.input_norm")
    assert [child.type_name for child in norm.children] == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert norm.leaf and isinstance(norm.outputs, TensorRecord)


def test_ops_do_not_change_the_module_tree(demo_ops: graphtrace.Trace) -> None:
    plain = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")
    assert module_tree(demo_ops.root) == module_tree(plain.root)


def test_op_paths_never_collide_with_module_paths(demo_ops: graphtrace.Trace) -> None:
    modules = {node.path for node in demo_ops.walk() if node.kind == "module"}
    ops = {node.path for node in demo_ops.walk() if node.kind == "op"}
    assert ops and not ops & modules and all("#" in path for path in ops)


def test_data_flow_follows_the_graph_through_functional_code(demo_ops: graphtrace.Trace) -> None:
    no_ops = graphtrace.capture(demo_model(), demo_inputs())
    eager = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")
    down = "DemoTransformer.layers.0.mlp.down_proj"
    # down_proj(act(gate_proj(x)) * up_proj(x)): its input was computed in the MLP's own code
    assert eager.find(down).inputs_from == ()
    assert no_ops.find(down).inputs_from == (
        "DemoTransformer.layers.0.mlp.act@0",
        "DemoTransformer.layers.0.mlp.up_proj@0",
    )
    assert demo_ops.find(down).inputs_from == ("DemoTransformer.layers.0.mlp#mul@0",)
    assert demo_ops.find("DemoTransformer.layers.0.mlp#mul").inputs_from == (
        "DemoTransformer.layers.0.mlp.act@0",
        "DemoTransformer.layers.0.mlp.up_proj@0",
    )
    o_proj = no_ops.find("DemoTransformer.layers.0.attn.o_proj").inputs_from
    assert {f"DemoTransformer.layers.0.attn.{name}_proj@0" for name in "qkv"} | {"DemoTransformer.rotary@0"} == set(
        o_proj
    )


def test_the_call_graph_of_a_trace_served_by_fx_needs_no_inferred_edges() -> None:
    from graphtrace.render import call_graph

    eager = call_graph(graphtrace.capture(demo_model(), demo_inputs(), strategy="eager"))
    served = call_graph(graphtrace.capture(demo_model(), demo_inputs()))
    assert any(inferred for _, _, inferred in eager.edges(data="inferred"))
    assert not any(inferred for _, _, inferred in served.edges(data="inferred"))
    assert served.has_edge("DemoTransformer.layers.0.attn.q_proj@0", "DemoTransformer.layers.0.attn.o_proj@0")


def test_spec_files_with_ops_keep_leaf_outputs_beside_op_children(tmp_path: Path) -> None:
    graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path, ops=True)
    tree = json.loads((tmp_path / "DemoTransformer_debug_tree_SUMMARY.json").read_text())
    nodes: dict[str, dict] = {}

    def index(node: dict) -> None:
        nodes[node["module_path"]] = node
        for child in node.get("children", ()):
            index(child)

    index(tree)
    norm = nodes["DemoTransformer.layers.0.input_norm"]
    assert list(norm) == ["module_path", "inputs", "outputs", "children"]
    assert norm["children"][0]["module_path"] == "DemoTransformer.layers.0.input_norm#pow_1"
    assert "outputs" in norm["children"][0]
    layer = nodes["DemoTransformer.layers.0"]
    assert "outputs" not in layer and layer["children"][2]["module_path"] == "DemoTransformer.layers.0#add"
    loaded = graphtrace.load(str(tmp_path))
    assert loaded.find("DemoTransformer.layers.0#add").kind == "op"


class DivergesAtTheEnd(nn.Module):
    """Its graph computes its ops, then returns another value than the forward (``isinstance`` of a traced value)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.a(x).softmax(dim=-1) + 1
        return hidden * (1.0 if isinstance(x, torch.Tensor) else 2.0)


def test_ops_of_a_graph_that_fails_verification_are_withdrawn(tmp_path: Path) -> None:
    trace = graphtrace.capture(DivergesAtTheEnd(), torch.randn(2, 4), ops=True, values="safetensors", path=tmp_path)
    assert trace.root.strategy == "eager" and trace.fallbacks["DivergesAtTheEnd"].startswith("Mismatch")
    assert [child.id for child in trace.root.children] == ["DivergesAtTheEnd.a@0"]
    assert not [file for file in tmp_path.iterdir() if "#" in file.name]
    assert (tmp_path / "DivergesAtTheEnd.a_outputs.safetensors").is_file()


def test_ops_of_a_verified_graph_are_saved_as_safetensors(tmp_path: Path) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), ops=True, values="safetensors", path=tmp_path)
    softmax: CallNode = trace.find("DemoTransformer.layers.0.attn#softmax")
    record = softmax.outputs
    assert (
        isinstance(record, TensorRecord)
        and record.file == "./DemoTransformer.layers.0.attn#softmax_outputs.safetensors"
    )
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / record.file))["data"]
    assert torch.allclose(stored.sum(dim=-1), torch.ones(1, 4, 12))
