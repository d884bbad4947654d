"""The op tier (``ops=True``, engine/ops.py): the ops a module's own code calls, recorded during the real forward
with their source lines, under every engine, inside cache-updating attention, and only in graphtrace's own file."""

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

ATTN = "DemoTransformer.layers.0.attn"


@pytest.fixture(scope="module")
def demo_ops() -> graphtrace.Trace:
    return graphtrace.capture(demo_model(), demo_inputs(), ops=True)


def test_ops_are_children_of_their_module_in_the_order_they_ran(demo_ops: graphtrace.Trace) -> None:
    attn = demo_ops.find(ATTN)
    names = [(child.kind, child.name) for child in attn.children]
    assert names[:4] == [("module", "q_proj"), ("module", "k_proj"), ("module", "v_proj"), ("op", "mul")]
    assert names[-5:] == [
        ("op", "triu"),
        ("op", "masked_fill"),
        ("op", "softmax"),
        ("op", "matmul"),
        ("module", "o_proj"),
    ]
    softmax = demo_ops.find(f"{ATTN}#softmax")
    assert (softmax.kind, softmax.type_name, softmax.strategy, softmax.leaf) == ("op", "softmax", "eager", True)
    assert softmax.inputs_from == (f"{ATTN}#masked_fill@0",)
    out = softmax.outputs
    assert isinstance(out, TensorRecord) and out.shape == (1, 4, 12, 12) and out.stats is not None
    assert out.stats.mean == pytest.approx(1 / 12)  # each row of 12 attention weights sums to one
    assert out.value is not None and out.value[0].startswith("tensor([[[[")
    matmuls = [child.id for child in attn.children if child.name == "matmul"]
    assert matmuls == [f"{ATTN}#matmul@0", f"{ATTN}#matmul@1"]  # repeated ops are numbered like repeated calls


def test_each_op_knows_the_line_of_code_that_called_it(demo_ops: graphtrace.Trace) -> None:
    softmax = demo_ops.find(f"{ATTN}#softmax")
    assert softmax.source is not None
    assert softmax.source.file.endswith("graphtrace/demo.py") and softmax.source.function == "forward"
    assert "softmax(dim=-1)" in softmax.source.text
    assert str(softmax.source).startswith(f"demo.py:{softmax.source.line} in forward: `")
    assert all(node.source is not None for node in demo_ops.walk() if node.kind == "op")


def test_views_and_torchs_own_modules_record_no_op(demo_ops: graphtrace.Trace) -> None:
    assert demo_ops.find(f"{ATTN}.q_proj").children == ()  # nn.Linear is one op: its module record says it all
    norm = demo_ops.find("DemoTransformer.layers.0.input_norm")
    assert [child.type_name for child in norm.children] == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert norm.leaf and isinstance(norm.outputs, TensorRecord)
    names = {node.type_name for node in demo_ops.walk() if node.kind == "op"}
    assert not names & {"view", "transpose", "reshape", "contiguous", "size", "unsqueeze"}


def test_ops_do_not_change_the_module_tree_or_the_values(demo_ops: graphtrace.Trace) -> None:
    plain = graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")

    def modules(trace: graphtrace.Trace) -> list[tuple[str, str, list[object]]]:
        tree = module_tree(trace.root)  # a container may now refer to an op's stored value: compare statistics
        return [(n.id, n.type_name, [r.stats for _, r in n.output_tensors()]) for n in tree.walk()]

    assert modules(demo_ops) == modules(plain)
    model, inputs = demo_model(), demo_inputs()
    with torch.no_grad():
        expected = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    for strategy in ("auto", "eager"):
        _, output = graphtrace.capture(model, inputs, ops=True, strategy=strategy, return_output=True)
        assert torch.equal(output, expected)  # bit for bit the plain forward's values


def test_the_same_ops_under_both_engines(demo_ops: graphtrace.Trace) -> None:
    eager = graphtrace.capture(demo_model(), demo_inputs(), ops=True, strategy="eager")
    ops_auto = [(n.id, n.source) for n in demo_ops.walk() if n.kind == "op"]
    ops_eager = [(n.id, n.source) for n in eager.walk() if n.kind == "op"]
    assert ops_auto == ops_eager and len(ops_auto) > 40


def test_op_paths_never_collide_with_module_paths(demo_ops: graphtrace.Trace) -> None:
    modules = {node.path for node in demo_ops.walk() if node.kind == "module"}
    ops = {node.path for node in demo_ops.walk() if node.kind == "op"}
    assert ops and not ops & modules and all("#" in path for path in ops)


def test_data_flow_runs_through_the_ops(demo_ops: graphtrace.Trace) -> None:
    down = "DemoTransformer.layers.0.mlp.down_proj"
    # down_proj(act(gate_proj(x)) * up_proj(x)): its input was computed by the MLP's own mul
    assert demo_ops.find(down).inputs_from[0] == "DemoTransformer.layers.0.mlp#mul@0"
    assert demo_ops.find("DemoTransformer.layers.0.mlp#mul").inputs_from == (
        "DemoTransformer.layers.0.mlp.act@0",
        "DemoTransformer.layers.0.mlp.up_proj@0",
    )


def test_the_call_graph_of_a_trace_served_by_fx_needs_no_inferred_edges() -> None:
    from graphtrace.render import call_graph

    eager = call_graph(graphtrace.capture(demo_model(), demo_inputs(), strategy="eager"))
    served = call_graph(graphtrace.capture(demo_model(), demo_inputs()))
    assert any(inferred for _, _, inferred in eager.edges(data="inferred"))
    assert not any(inferred for _, _, inferred in served.edges(data="inferred"))
    assert served.has_edge("DemoTransformer.layers.0.attn.q_proj@0", "DemoTransformer.layers.0.attn.o_proj@0")


def test_op_records_stay_out_of_the_transformers_files(tmp_path: Path) -> None:
    graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "ops", ops=True)
    graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "plain")
    for name in ("DemoTransformer_debug_tree_SUMMARY.json", "DemoTransformer_debug_tree_FULL_TENSORS.json"):
        assert (tmp_path / "ops" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert "#" not in (tmp_path / "ops" / "DemoTransformer_debug_tree_SUMMARY.json").read_text()
    loaded = graphtrace.load(str(tmp_path / "ops"))
    softmax = loaded.find(f"{ATTN}#softmax")
    assert softmax.kind == "op" and softmax.source is not None and "softmax" in softmax.source.text
    own = json.loads(next((tmp_path / "ops").glob("*_graphtrace.json")).read_text())
    assert '"source"' in json.dumps(own)


class ComputesThenFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = (self.a(x) * 2).relu()
        return hidden @ torch.ones(3, 3)  # shapes cannot be multiplied


def test_a_forward_that_raises_keeps_its_ops_and_leaves_no_mode_behind() -> None:
    from torch.overrides import _get_current_function_mode_stack

    before = list(_get_current_function_mode_stack())
    with pytest.raises(RuntimeError) as raised:
        graphtrace.capture(ComputesThenFails(), torch.randn(2, 4), ops=True)
    assert _get_current_function_mode_stack() == before
    trace = raised.value.graphtrace_trace  # type: ignore[attr-defined]
    assert [child.name for child in trace.root.children] == ["a", "mul", "relu"]


def test_ops_are_saved_as_safetensors(tmp_path: Path) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), ops=True, values="safetensors", path=tmp_path)
    softmax: CallNode = trace.find(f"{ATTN}#softmax")
    record = softmax.outputs
    assert isinstance(record, TensorRecord) and record.file == f"./{ATTN}#softmax_outputs.safetensors"
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / record.file))["data"]
    assert torch.allclose(stored.sum(dim=-1), torch.ones(1, 4, 12))


def test_ops_inside_cache_updating_attention() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation="eager",
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    trace = graphtrace.capture(model, {"input_ids": torch.tensor([[1, 2, 3, 4]])}, ops=True)  # use_cache=True
    assert "DynamicCache" in trace.fallbacks["LlamaForCausalLM.model.layers.0.self_attn"]  # fx refuses it...
    attn = trace.find("LlamaForCausalLM.model.layers.0.self_attn")
    ops = [child for child in attn.children if child.kind == "op"]
    assert {"matmul", "softmax", "cat"} <= {op.name for op in ops}  # ...the op tier records inside it
    cache = [op for op in ops if op.source is not None and op.source.function == "update"]
    assert cache and cache[0].source is not None and cache[0].source.file.endswith("cache_utils.py")


def test_a_compiled_submodule_keeps_its_values_and_compiles_without_the_op_tier_in_the_way() -> None:
    class Inner(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 3).relu() + 1

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.compiled = torch.compile(Inner(), backend="eager")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.compiled(self.a(x) * 2)

    model = Outer().eval()
    with torch.no_grad():
        expected = model(torch.ones(2, 4))
    with _no_frame_warning():
        trace, output = graphtrace.capture(model, torch.ones(2, 4), ops=True, strategy="eager", return_output=True)
    assert torch.equal(output, expected)
    ops = [node.id for node in trace.walk() if node.kind == "op"]
    assert ops[0] == "Outer#mul@0"  # the ops outside; inside, only what dynamo leaves to run as Python


class _no_frame_warning:
    """The op tier must not make dynamo stumble over its frame walk (``sys._getframe``) inside compiled code."""

    def __enter__(self) -> None:
        import warnings

        self._catcher = warnings.catch_warnings(record=True)
        self._seen = self._catcher.__enter__()
        warnings.simplefilter("always")

    def __exit__(self, *exc: object) -> None:
        self._catcher.__exit__(*exc)
        assert not [w for w in self._seen if "sys._getframe" in str(w.message)]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_records_the_ops_of_every_step(cache: str) -> None:
    from tests.zoo import llama

    model, inputs = llama()
    options = {"max_new_tokens": 3, "do_sample": False, "cache_implementation": cache}
    with torch.no_grad():
        expected = model.generate(**inputs, **options)
    with graphtrace.tracing(model, ops=True) as session:
        output = model.generate(**inputs, **options)
    assert torch.equal(output, expected)
    assert session.trace is not None and len(session.trace.steps) == 3
    for step in session.trace.steps:  # prefill and both decode steps: ops inside every attention
        attention = [node for node in step.walk() if node.path.endswith("self_attn")]
        assert attention and all(any(child.kind == "op" for child in node.children) for node in attention)
