"""The call graph as a networkx DiGraph: data flow, folding, depth, focus, marks, options."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.errors import InvalidOptionError
from graphtrace.model import CallNode, Trace
from graphtrace.render import boxes, call_graph, data_flow
from tests.conftest import run_reference
from tests.zoo import ORACLE_MODELS, llama

DEMO = "DemoTransformer"


def clusters(graph: nx.DiGraph) -> list[str]:
    return [node for node, cluster in graph.nodes(data="cluster") if cluster]


def drawn_flow(graph: nx.DiGraph, *, inferred: bool = True) -> nx.Graph:
    """The data flow between boxes as the picture shows it: an edge into or out of a cluster is drawn to its first
    box or from its last box (nesting alone links nothing)."""

    def enclosing(node: str) -> list[str]:
        found = []
        while node is not None:
            found.append(node)
            node = graph.nodes[node]["parent"]
        return found

    order = boxes(graph)
    members = {cluster: [box for box in order if cluster in enclosing(box)] for cluster in clusters(graph)}
    flow = nx.Graph()
    flow.add_nodes_from(order)
    for tail, head, flag in graph.edges(data="inferred"):
        if inferred or not flag:
            flow.add_edge(members[tail][-1] if tail in members else tail, members[head][0] if head in members else head)
    return flow


# -- data flow ------------------------------------------------------------------------------------------------------


def test_recorded_flow_comes_from_inputs_from_and_gaps_are_inferred_from_call_order(demo_trace: Trace) -> None:
    flows = {(f.producer, f.consumer): f.inferred for f in data_flow(demo_trace.root)}
    attn = f"{DEMO}.layers.1.attn"
    assert flows[(f"{DEMO}.layers.1.input_norm@0", f"{attn}.q_proj@0")] is False
    assert flows[(f"{DEMO}.layers.0@0", f"{DEMO}.layers.1@0")] is False
    # o_proj receives the attention context computed by tensor code from q, k and v: no recorded producer
    assert {p for (p, c), inferred in flows.items() if c == f"{attn}.o_proj@0"} == {
        f"{attn}.{name}_proj@0" for name in "qkv"
    }
    assert all(flows[(f"{attn}.{name}_proj@0", f"{attn}.o_proj@0")] for name in "qkv")
    # embed_tokens is first in its parent and receives the model's own input: nothing to infer
    assert not any(c == f"{DEMO}.embed_tokens@0" for _, c in flows)


@pytest.mark.parametrize("name", ["llama", "bert", "gpt2", "t5", "vit"])
def test_graph_of_a_transformers_model_is_connected(name: str) -> None:
    model, inputs = ORACLE_MODELS[name]()
    graph = call_graph(graphtrace.capture(model, inputs))
    assert nx.is_connected(drawn_flow(graph))
    if name == "llama":  # tensor identity alone leaves o_proj, down_proj, lm_head, ... without any edge
        eager = call_graph(graphtrace.capture(model, inputs, strategy="eager"))
        assert not nx.is_connected(drawn_flow(eager, inferred=False))
        assert nx.is_connected(drawn_flow(graph, inferred=False))  # the data flow of the fx graphs fills the gaps


def test_inferred_flow_never_feeds_positions_from_token_embeddings() -> None:
    """GPT-2 embeds tokens (wte) then positions (wpe): the positions come from the input, not from wte's output; both
    embeddings feed the dropout after them, whose input is their sum."""
    model, inputs = ORACLE_MODELS["gpt2"]()
    flows = data_flow(graphtrace.capture(model, inputs).root)
    into = {flow.producer.rpartition(".")[2] for flow in flows if flow.consumer.endswith("transformer.drop@0")}
    assert into == {"wte@0", "wpe@0"}
    assert not any(flow.consumer.endswith("transformer.wpe@0") for flow in flows)


def test_a_trace_written_by_transformers_is_drawn_from_call_order_alone(tmp_path: Path) -> None:
    model, inputs = llama()
    run_reference(model, lambda: model(**inputs), tmp_path, do_prune_layers=False)
    graph = call_graph(graphtrace.load(str(tmp_path)))
    assert graph.number_of_edges() > 0 and all(inferred for _, _, inferred in graph.edges(data="inferred"))
    assert graph.nodes["LlamaForCausalLM.model.layers.0@0"]["repeat"] == 3  # structure alone still folds
    assert nx.is_connected(drawn_flow(graph))


# -- folding, depth, focus ----------------------------------------------------------------------------------------


def test_identical_layers_fold_into_one_cluster_and_unfold_on_request(demo_trace: Trace) -> None:
    folded = call_graph(demo_trace)
    layers = folded.nodes[f"{DEMO}.layers.0@0"]
    assert layers["cluster"] and layers["repeat"] == 4 and layers["name"] == "layers.0–3"
    assert f"{DEMO}.layers.1@0" not in folded and len(boxes(folded)) == 14
    # the flow between successive layers stays inside the fold; the flow out of the last one leaves it
    assert folded.has_edge(f"{DEMO}.layers.0@0", f"{DEMO}.norm@0")

    unfolded = call_graph(demo_trace, unfold=True)
    assert [n for n in clusters(unfolded) if unfolded.nodes[n]["type_name"] == "DecoderLayer"] == [
        f"{DEMO}.layers.{i}@0" for i in range(4)
    ]
    assert all(data["repeat"] == 1 for _, data in unfolded.nodes(data=True))
    assert len(boxes(unfolded)) == 44 and unfolded.has_edge(f"{DEMO}.layers.0@0", f"{DEMO}.layers.1.input_norm@0")


def test_folding_never_hides_a_mark() -> None:
    model = demo_model()
    with torch.no_grad():
        model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")
    graph = call_graph(graphtrace.capture(model, demo_inputs()))
    layer_names = [graph.nodes[n]["name"] for n in clusters(graph) if graph.nodes[n]["type_name"] == "DecoderLayer"]
    assert layer_names == ["layers.0–1", "layers.2", "layers.3"]
    down_proj = graph.nodes[f"{DEMO}.layers.2.mlp.down_proj@0"]
    assert down_proj["nan"] == 12 and down_proj["inf"] == 0  # one NaN per token, in the first feature
    assert graph.nodes[f"{DEMO}.layers.0.mlp.down_proj@0"]["nan"] == 0

    shallow = call_graph(graphtrace.capture(model, demo_inputs()), depth=1)
    assert shallow.nodes[f"{DEMO}.layers.2@0"]["nonfinite_inside"] > 0
    assert shallow.nodes[f"{DEMO}.layers.0@0"]["nonfinite_inside"] == 0


def test_repeated_calls_of_one_module_fold_too() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
            self.head = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(5):
                x = self.block(x)
            return self.head(x)

    trace = graphtrace.capture(Shared(), torch.ones(2, 4))
    graph = call_graph(trace)
    block = graph.nodes["Shared.block@0"]
    assert block["repeat"] == 5 and block["name"] == "block #1–5"
    assert set(graph) == {"Shared@0", "Shared.block@0", "Shared.block.0@0", "Shared.block.1@0", "Shared.head@0"}
    assert graph.has_edge("Shared.block@0", "Shared.head@0")
    assert call_graph(trace, unfold=True).nodes["Shared.block@2"]["name"] == "block #3"


def test_depth_limit_collapses_calls_into_boxes(demo_trace: Trace) -> None:
    assert list(call_graph(demo_trace, depth=0)) == [f"{DEMO}@0"]
    graph = call_graph(demo_trace, depth=1)
    assert clusters(graph) == [f"{DEMO}@0"]
    layers = graph.nodes[f"{DEMO}.layers.0@0"]
    assert not layers["cluster"] and layers["repeat"] == 4 and layers["calls_inside"] == 12
    names = [graph.nodes[n]["name"] for n in boxes(graph)]
    assert names == ["rotary", "embed_tokens", "layers.0–3", "norm", "lm_head"]
    assert graph.has_edge(f"{DEMO}.embed_tokens@0", f"{DEMO}.layers.0@0")
    assert graph.has_edge(f"{DEMO}.rotary@0", f"{DEMO}.layers.0@0")


def test_without_a_depth_the_deepest_graph_within_the_box_budget_is_drawn(demo_trace: Trace) -> None:
    full = call_graph(demo_trace, unfold=True, max_boxes=None)
    assert len(boxes(full)) == 44 and full.graph["depth"] is None
    cut = call_graph(demo_trace, unfold=True, max_boxes=20)
    assert cut.graph["auto_depth"] and cut.graph["depth"] == 2 and len(boxes(cut)) <= 20
    assert len(boxes(call_graph(demo_trace, unfold=True, depth=3))) > 20  # one level deeper would not fit
    assert not call_graph(demo_trace, unfold=True, depth=3, max_boxes=20).graph["auto_depth"]  # explicit wins


def test_focus_draws_one_subtree_with_its_neighbours_as_context(demo_trace: Trace) -> None:
    graph = call_graph(demo_trace, focus="layers.2.attn")
    assert graph.graph["focus"] == f"{DEMO}.layers.2.attn@0"
    inside = {n for n, context in graph.nodes(data="context") if not context}
    assert inside == {f"{DEMO}.layers.2.attn@0"} | {f"{DEMO}.layers.2.attn.{p}_proj@0" for p in "qkvo"}
    context = {n: graph.nodes[n]["name"] for n, flag in graph.nodes(data="context") if flag}
    assert context == {
        f"{DEMO}.rotary@0": "rotary",
        f"{DEMO}.layers.2.input_norm@0": "layers.2.input_norm",
        f"{DEMO}.layers.2.post_attention_norm@0": "layers.2.post_attention_norm",
    }
    assert graph.has_edge(f"{DEMO}.layers.2.input_norm@0", f"{DEMO}.layers.2.attn.q_proj@0")
    assert graph.has_edge(f"{DEMO}.layers.2.attn@0", f"{DEMO}.layers.2.post_attention_norm@0")
    # the same call named with the model class and a call number
    assert set(call_graph(demo_trace, focus=f"{DEMO}.layers.2.attn@0")) == set(graph)


def test_focus_mistakes_name_the_remedy(demo_trace: Trace) -> None:
    with pytest.raises(InvalidOptionError, match=r"no such call.*Did you mean layers\.2\.attn"):
        call_graph(demo_trace, focus="layers.2.atn")
    with pytest.raises(InvalidOptionError, match=r"called 1 time\(s\); use @0\.\.@0"):
        call_graph(demo_trace, focus="layers.2.attn@3")
    with pytest.raises(InvalidOptionError, match="call number"):
        call_graph(demo_trace, focus="layers.2.attn@x")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"depth": -1}, "depth must be"),
        ({"max_boxes": 0}, "max_boxes must be"),
        ({"step": 1}, r"step 1 does not exist: the trace has 1 forward call\(s\)"),
        ({"unfold": "yes"}, "unfold must be True or False"),
    ],
)
def test_bad_options(demo_trace: Trace, options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        call_graph(demo_trace, **options)  # type: ignore[arg-type]


# -- marks, steps, ops -------------------------------------------------------------------------------------------


def test_errors_fallbacks_and_ops_are_carried_to_the_nodes(demo_trace: Trace) -> None:
    model = demo_model()
    model.layers[1].mlp.act.register_forward_pre_hook(lambda *_: 1 / 0)
    with pytest.raises(ZeroDivisionError), graphtrace.tracing(model) as session:
        model(**demo_inputs())
    assert session.trace is not None
    graph = call_graph(session.trace)
    assert graph.nodes[f"{DEMO}.layers.1.mlp@0"]["error"] == "ZeroDivisionError: division by zero"
    assert f"{DEMO}.layers.2@0" not in graph  # never ran

    fallback = dataclasses.replace(demo_trace, fallbacks={f"{DEMO}.layers.3.attn": "dynamic control flow"})
    graph = call_graph(fallback, depth=2)
    assert graph.nodes[f"{DEMO}.layers.3.attn@0"]["fallback"] == "dynamic control flow"
    assert graph.nodes[f"{DEMO}.layers.0.attn@0"]["fallback"] is None
    assert graph.nodes[f"{DEMO}.layers.0@0"]["repeat"] == 3  # the fallback splits the fold
    assert call_graph(fallback, depth=1).nodes[f"{DEMO}.layers.3@0"]["fallbacks_inside"] == 1

    norm = demo_trace.find(f"{DEMO}.norm")
    op = CallNode(
        path=f"{DEMO}.norm.mul", type_name="mul", kind="op", outputs=norm.outputs, inputs_from=(f"{DEMO}.layers.3@0",)
    )
    with_op = dataclasses.replace(
        demo_trace.root,
        children=tuple(
            dataclasses.replace(child, children=(op,), leaf=False) if child.path == norm.path else child
            for child in demo_trace.root.children
        ),
    )
    graph = call_graph(dataclasses.replace(demo_trace, steps=(with_op,)))
    assert graph.nodes[f"{DEMO}.norm.mul@0"]["kind"] == "op" and graph.nodes[f"{DEMO}.norm@0"]["cluster"]
    assert graph.has_edge(f"{DEMO}.layers.0@0", f"{DEMO}.norm.mul@0")


def test_each_step_of_a_multi_step_trace_can_be_drawn() -> None:
    model = demo_model()
    with graphtrace.tracing(model) as session:
        model(**demo_inputs(5))
        model(**demo_inputs(9))
    assert session.trace is not None
    last, first = call_graph(session.trace), call_graph(session.trace, step=0)
    assert last.graph["step"] == 1 and first.graph["step"] == 0
    assert last.nodes[f"{DEMO}.lm_head@0"]["outputs"][0][1] == (1, 9, 256)
    assert first.nodes[f"{DEMO}.lm_head@0"]["outputs"][0][1] == (1, 5, 256)


def test_trace_to_graph_is_call_graph(demo_trace: Trace) -> None:
    graph = demo_trace.to_graph(depth=2)
    assert nx.utils.graphs_equal(graph, call_graph(demo_trace, depth=2))
    assert graphtrace.render.call_graph is call_graph


def test_rendering_needs_neither_torch_nor_the_model(demo_trace: Trace, tmp_path: Path) -> None:
    demo_trace.save(tmp_path / "trace")
    code = (
        "import sys, graphtrace\n"
        "from graphtrace.render import call_graph, to_dot\n"
        "from graphtrace.cli import main\n"
        f"graph = call_graph(graphtrace.load({str(tmp_path / 'trace')!r}))\n"
        "assert graph.number_of_nodes() > 10 and 'digraph' in to_dot(graph)\n"
        f"assert main(['render', {str(tmp_path / 'trace')!r}, '-o', {str(tmp_path / 'g.svg')!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")
