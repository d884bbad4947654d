"""The call graph drawn: golden DOT, real Graphviz SVG, the files capture writes, the command, a missing `dot`."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace import saving
from graphtrace.demo import demo_inputs, demo_model
from graphtrace.errors import GraphvizNotFoundError, GraphvizWarning, InvalidOptionError, TraceFormatError
from graphtrace.model import Trace
from graphtrace.render import boxes, call_graph, to_dot, write_call_graph
from tests.conftest import run_cli
from tests.zoo import llama

GOLDEN = Path(__file__).parent / "golden"
SVG = "{http://www.w3.org/2000/svg}"


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GRAPHTRACE_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), (
        f"{name} changed; if that is intended, rerun with GRAPHTRACE_UPDATE_GOLDEN=1 and review the diff"
    )


def svg_groups(path: Path) -> dict[str, list[ET.Element]]:
    """The SVG's node, cluster and edge groups (the file must be well-formed XML)."""
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    groups: dict[str, list[ET.Element]] = {"node": [], "cluster": [], "edge": []}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") in groups:
            groups[group.get("class")].append(group)
    return groups


def titles(groups: list[ET.Element]) -> list[str]:
    return [group.findtext(f"{SVG}title") or "" for group in groups]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class Check(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.isnan().any():
            raise ValueError("NaN in the input of the check")
        return x


class Faulty(nn.Module):
    """Three blocks, the last with a NaN weight, then a check that raises on NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.check = Check()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.check(x))


def faulty_trace() -> Trace:
    torch.manual_seed(0)
    model = Faulty()
    with torch.no_grad():
        model.blocks[2].fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN in the input"), graphtrace.tracing(model, strategy="eager") as session:
        model(torch.ones(2, 3))
    assert session.trace is not None
    return dataclasses.replace(session.trace, fallbacks={"Faulty.proj": "torch.fx: cannot trace this module"})


# -- DOT -----------------------------------------------------------------------------------------------------------


def test_golden_dot_of_the_demo_model(demo_trace: Trace) -> None:
    assert_golden("demo.dot", to_dot(call_graph(demo_trace)))
    assert_golden("demo_depth2.dot", to_dot(call_graph(demo_trace, depth=2)))


def parse_dot(text: str) -> tuple[dict[str, str | None], dict[str, str], dict[tuple[str, str], dict[str, str]]]:
    """The DOT source read back by pydot: clusters (id -> enclosing cluster id), boxes (id -> enclosing cluster id)
    and edges ((tail, head) -> attributes), with call ids as plain ``path@N`` strings."""
    import warnings

    import pydot

    with warnings.catch_warnings():  # pydot's parser uses pyparsing's old method names
        warnings.simplefilter("ignore", DeprecationWarning)
        (graph,) = pydot.graph_from_dot_data(text)
    unquote = lambda name: name.strip('"')  # noqa: E731
    clusters: dict[str, str | None] = {}
    nodes: dict[str, str] = {}

    def visit(subgraph: pydot.Graph, parent: str | None) -> None:
        for node in subgraph.get_nodes():
            if unquote(node.get_name()) not in ("node", "edge", "graph"):
                assert parent is not None, node.get_name()
                nodes[unquote(node.get_name())] = parent
        for child in subgraph.get_subgraphs():
            name = unquote(child.get_name()).removeprefix("cluster_")
            clusters[name] = parent
            visit(child, name)

    visit(graph, None)
    edges = {
        (unquote(edge.get_source()), unquote(edge.get_destination())): {
            key: unquote(value) for key, value in edge.get_attributes().items()
        }
        for edge in graph.get_edges()
    }
    return clusters, nodes, edges


def test_the_demo_dot_means_the_demo_model(demo_trace: Trace) -> None:
    """Independent of the golden files: what the demo model's code says, read back from the DOT. The root holds
    embed_tokens, rotary, the final norm and lm_head and the four identical layers folded into one cluster; a layer
    holds its two norms and the attn and mlp clusters. Data flow follows forward(): rotary's cos/sin and the input
    norm feed the projections, the MLP's product feeds down_proj, the last layer feeds the final norm; what is
    computed between module calls (attention, residual adds, the gate's product) is drawn dashed, as inferred."""
    root, layer = "DemoTransformer", "DemoTransformer.layers.0"
    attn, mlp = f"{layer}.attn", f"{layer}.mlp"
    clusters, nodes, edges = parse_dot(to_dot(call_graph(demo_trace)))
    assert clusters == {
        f"{root}@0": None,
        f"{layer}@0": f"{root}@0",
        f"{attn}@0": f"{layer}@0",
        f"{mlp}@0": f"{layer}@0",
    }
    expected_nodes = {f"{root}.{name}@0": f"{root}@0" for name in ("embed_tokens", "rotary", "norm", "lm_head")}
    expected_nodes |= {f"{layer}.{name}@0": f"{layer}@0" for name in ("input_norm", "post_attention_norm")}
    expected_nodes |= {f"{attn}.{name}_proj@0": f"{attn}@0" for name in "qkvo"}
    expected_nodes |= {f"{mlp}.{name}@0": f"{mlp}@0" for name in ("gate_proj", "up_proj", "act", "down_proj")}
    assert nodes == expected_nodes  # layers 1-3 are folded into layers.0: no box of theirs
    recorded = {
        (f"{root}.rotary", f"{attn}.q_proj"),  # cos and sin enter the attention cluster
        (f"{root}.embed_tokens", f"{layer}.input_norm"),
        *((f"{layer}.input_norm", f"{attn}.{name}_proj") for name in "qkv"),
        (f"{layer}.post_attention_norm", f"{mlp}.gate_proj"),
        (f"{layer}.post_attention_norm", f"{mlp}.up_proj"),
        (f"{mlp}.gate_proj", f"{mlp}.act"),
        (f"{mlp}.down_proj", f"{root}.norm"),  # the last layer's output
        (f"{root}.norm", f"{root}.lm_head"),
    }
    inferred = {
        *((f"{attn}.{name}_proj", f"{attn}.o_proj") for name in "qkv"),  # the attention itself
        (f"{attn}.o_proj", f"{layer}.post_attention_norm"),  # the residual add
        (f"{mlp}.act", f"{mlp}.down_proj"),  # act * up
        (f"{mlp}.up_proj", f"{mlp}.down_proj"),
    }
    assert set(edges) == {(f"{a}@0", f"{b}@0") for a, b in recorded | inferred}
    for a, b in recorded | inferred:
        assert (edges[f"{a}@0", f"{b}@0"].get("style") == "dashed") == ((a, b) in inferred), (a, b)
    # an edge into or out of a cluster is clipped at its border
    assert edges[f"{root}.rotary@0", f"{attn}.q_proj@0"]["lhead"] == f"cluster_{attn}@0"
    assert edges[f"{mlp}.down_proj@0", f"{root}.norm@0"]["ltail"] == f"cluster_{layer}@0"
    assert edges[f"{attn}.o_proj@0", f"{layer}.post_attention_norm@0"]["ltail"] == f"cluster_{attn}@0"

    # two levels deep: attn and mlp become boxes, each counting the four calls inside it
    clusters, nodes, edges = parse_dot(to_dot(call_graph(demo_trace, depth=2)))
    assert clusters == {f"{root}@0": None, f"{layer}@0": f"{root}@0"}
    assert set(nodes) == {name for name in expected_nodes if name.count(".") <= 3} | {f"{attn}@0", f"{mlp}@0"}
    assert nodes[f"{attn}@0"] == nodes[f"{mlp}@0"] == f"{layer}@0"
    dot = to_dot(call_graph(demo_trace, depth=2))
    for box in (attn, mlp):
        line = next(line for line in dot.splitlines() if line.startswith(f'"{box}@0" ['))
        assert "+4 calls inside" in line
    assert set(edges) == {
        (f"{root}.rotary@0", f"{attn}@0"),
        (f"{root}.embed_tokens@0", f"{layer}.input_norm@0"),
        (f"{layer}.input_norm@0", f"{attn}@0"),
        (f"{attn}@0", f"{layer}.post_attention_norm@0"),
        (f"{layer}.post_attention_norm@0", f"{mlp}@0"),
        (f"{mlp}@0", f"{root}.norm@0"),
        (f"{root}.norm@0", f"{root}.lm_head@0"),
    }


def test_golden_dot_of_a_model_with_nan_an_error_and_a_fallback() -> None:
    dot = to_dot(call_graph(faulty_trace()))
    assert_golden("faulty.dot", dot)
    assert "NaN 2 · Inf 0" in dot and "<B>raised</B> ValueError: NaN in the input of the check" in dot
    # a note, not an alarm: grey and dashed, the reason in words and technically in the tooltip
    assert (
        "recorded by wrapping forward: torch.fx cannot trace its code (why: torch.fx: cannot trace this module)" in dot
    )
    assert "#e07b00" not in dot and "eager fallback" not in dot


def test_edges_into_clusters_are_clipped_and_redundant_ones_left_out(demo_trace: Trace) -> None:
    dot = to_dot(call_graph(demo_trace))
    edges = [line for line in dot.splitlines() if " -> " in line]
    layer = "DemoTransformer.layers.0"
    # rotary feeds the attention cluster: drawn to its first box, clipped at its border
    assert f'"DemoTransformer.rotary@0" -> "{layer}.attn.q_proj@0" [lhead="cluster_{layer}.attn@0"];' in edges
    # embed feeds layer 0 and its input_norm: only the more specific edge is drawn
    assert f'"DemoTransformer.embed_tokens@0" -> "{layer}.input_norm@0";' in edges
    assert not any(f'lhead="cluster_{layer}@0"' in line for line in edges)
    # the layers' output leaves the fold from its last box
    assert f'"{layer}.mlp.down_proj@0" -> "DemoTransformer.norm@0" [ltail="cluster_{layer}@0"];' in edges
    assert sum("style=dashed" in line for line in edges) == 6  # q, k, v -> o; attn -> norm; act, up -> down


# -- Graphviz ------------------------------------------------------------------------------------------------------


def test_dot_draws_a_valid_svg_with_one_box_per_node(demo_trace: Trace, tmp_path: Path) -> None:
    graph = call_graph(demo_trace, unfold=True)
    written = write_call_graph(demo_trace, tmp_path / "graph.svg", unfold=True)
    assert written == [tmp_path / "graph.dot", tmp_path / "graph.svg"]
    groups = svg_groups(tmp_path / "graph.svg")
    assert sorted(titles(groups["node"])) == sorted(map(str, boxes(graph)))
    assert len(groups["cluster"]) == graph.number_of_nodes() - len(boxes(graph)) == 13
    dot_edges = sum(" -> " in line for line in (tmp_path / "graph.dot").read_text().splitlines())
    assert len(groups["edge"]) == dot_edges > 40
    assert "layers.3" in (tmp_path / "graph.svg").read_text()


def test_default_graph_of_a_16_layer_llama_fits_a_screen(tmp_path: Path) -> None:
    model, inputs = llama(layers=16)
    trace = graphtrace.capture(model, inputs)
    write_call_graph(trace, tmp_path / "llama.svg")
    groups = svg_groups(tmp_path / "llama.svg")
    assert len(groups["node"]) == 14  # embed, rotary, the folded layer's 10 leaf calls, norm, lm_head
    text = (tmp_path / "llama.svg").read_text()
    assert "layers.0–15" in text and "LlamaDecoderLayer ×16" in text
    assert len(boxes(call_graph(trace, unfold=True, max_boxes=None))) == 164  # what folding saves
    unfolded = call_graph(trace, unfold=True)
    assert len(boxes(unfolded)) <= 150 and unfolded.graph["auto_depth"]
    # drawn unfolded, each layer sits below the one before it (dot's default ranking put 7 of them side by side)
    (tmp_path / "unfolded.dot").write_text(to_dot(unfolded))
    plain = subprocess.run(["dot", "-Tplain", str(tmp_path / "unfolded.dot")], capture_output=True, text=True)
    heights = {}
    for line in plain.stdout.splitlines():
        match = re.match(r'node "LlamaForCausalLM\.model\.layers\.(\d+)\.input_layernorm@0" \S+ (\S+)', line)
        if match:
            heights[int(match.group(1))] = float(match.group(2))
    assert len(heights) == 16 and all(heights[i] > heights[i + 1] for i in range(15))


@pytest.mark.parametrize("suffix", [".png", ".pdf"])
def test_other_picture_formats(demo_trace: Trace, tmp_path: Path, suffix: str) -> None:
    write_call_graph(demo_trace, tmp_path / f"graph{suffix}", depth=1)
    magic = {".png": b"\x89PNG", ".pdf": b"%PDF"}[suffix]
    assert (tmp_path / f"graph{suffix}").read_bytes().startswith(magic)
    with pytest.raises(InvalidOptionError, match=r"end the file name with \.svg, \.png, \.pdf, \.dot"):
        write_call_graph(demo_trace, tmp_path / "graph.jpeg")


# -- beside a saved trace ------------------------------------------------------------------------------------------


def test_capture_writes_the_call_graph_beside_the_json_and_render_redraws_it(tmp_path: Path) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "trace")
    svg = tmp_path / "trace" / "DemoTransformer_call_graph.svg"
    assert len(svg_groups(svg)["node"]) == 14
    # what rendering needs is saved: the saved trace draws exactly the graph of the live one
    loaded = graphtrace.load(str(tmp_path / "trace"))
    assert to_dot(call_graph(loaded)) == to_dot(call_graph(trace))
    assert (tmp_path / "trace" / "DemoTransformer_call_graph.dot").read_text() == to_dot(call_graph(trace))


def test_render_command(tmp_path: Path) -> None:
    graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "trace")
    result = run_cli("render", "trace", "-o", "attn.svg", "--focus", "layers.1.attn", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "graphtrace render: 7 boxes of 57 calls" in result.stdout and "wrote attn.svg" in result.stdout
    assert len(svg_groups(tmp_path / "attn.svg")["node"]) == 7  # q, k, v, o and three neighbours
    result = run_cli("render", "trace", "-o", "all.svg", "--unfold", "--depth", "2", cwd=tmp_path)
    assert result.returncode == 0 and "20 boxes of 57 calls, cut at depth 2" in result.stdout
    result = run_cli("render", "trace", "--depth", "1", "-o", "new/dir/top.png", cwd=tmp_path)
    assert result.returncode == 0 and (tmp_path / "new/dir/top.png").read_bytes().startswith(b"\x89PNG")
    result = run_cli("render", "trace", "--focus", "layers.9", cwd=tmp_path)
    assert result.returncode == 2 and "focus 'layers.9': no such call" in result.stderr
    result = run_cli("render", "trace", "-o", "attn.svg/inside.svg", cwd=tmp_path)
    assert result.returncode == 2 and "cannot write the call graph to 'attn.svg/inside.dot'" in result.stderr


def test_without_dot_the_trace_and_the_dot_source_are_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # a PATH on which there is no Graphviz
    with pytest.warns(GraphvizWarning, match=r"apt-get install -y graphviz.*The trace itself is saved"):
        graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "trace")
    names = {path.name for path in (tmp_path / "trace").iterdir()}
    assert names == {
        "DemoTransformer_debug_tree_FULL_TENSORS.json",
        "DemoTransformer_debug_tree_SUMMARY.json",
        "DemoTransformer_graphtrace.json",
        "DemoTransformer_call_graph.dot",
    }
    with pytest.raises(GraphvizNotFoundError, match="not on PATH"):
        write_call_graph(graphtrace.load(str(tmp_path / "trace")), tmp_path / "graph.svg")
    assert (tmp_path / "graph.dot").is_file() and not (tmp_path / "graph.svg").exists()

    result = run_cli("render", "trace", "-o", "cli.svg", cwd=tmp_path, PATH=str(empty))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "sudo apt-get install -y graphviz" in result.stderr and "its DOT source is in cli.dot" in result.stderr
    assert (tmp_path / "cli.dot").is_file()


# -- Graphviz beside the writing of the trace ----------------------------------------------------------------------


def _spy_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str) -> Path:
    """A `dot` first on PATH that notes its process id, then runs the shell lines ``then`` (``REAL`` stands for
    Graphviz's own `dot`, ``NOTE`` for the note). Returns the note's path."""
    real = shutil.which("dot")
    assert real is not None
    spy = tmp_path / "bin"
    spy.mkdir()
    note = tmp_path / "dot_started.txt"
    script = spy / "dot"
    script.write_text(f"#!/bin/sh\necho $$ > {note}\n" + then.replace("REAL", real).replace("NOTE", str(note)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{spy}{os.pathsep}{os.environ['PATH']}")
    return note


def test_dot_draws_while_the_trace_files_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    note = _spy_dot(tmp_path, monkeypatch, 'exec REAL "$@"\n')
    dot_running = []
    write_trace_files = saving.save_trace

    def save_trace(*args: Any, **kwargs: Any) -> list[str]:
        deadline = time.monotonic() + 10
        while not note.exists() and time.monotonic() < deadline:  # dot, if started, says so within milliseconds
            time.sleep(0.01)
        dot_running.append(note.exists())
        return write_trace_files(*args, **kwargs)

    monkeypatch.setattr(saving, "save_trace", save_trace)
    graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "trace")
    assert dot_running == [True]  # started before the trace files were written
    # and the picture is in place, whole, when capture returns, with no temporary file beside it
    assert len(svg_groups(tmp_path / "trace" / "DemoTransformer_call_graph.svg")["node"]) == 14
    assert sorted(path.name for path in (tmp_path / "trace").iterdir()) == [
        "DemoTransformer_call_graph.dot",
        "DemoTransformer_call_graph.svg",
        "DemoTransformer_debug_tree_FULL_TENSORS.json",
        "DemoTransformer_debug_tree_SUMMARY.json",
        "DemoTransformer_graphtrace.json",
    ]
    with pytest.raises(ProcessLookupError):  # reaped: a zombie would still answer
        os.kill(int(note.read_text()), 0)


def test_a_save_that_fails_stops_dot_and_leaves_no_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = graphtrace.capture(demo_model(), demo_inputs(), path=tmp_path / "trace", values="safetensors")
    next((tmp_path / "trace").glob("*.safetensors")).unlink()
    note = _spy_dot(tmp_path, monkeypatch, "exec sleep 60\n")
    with pytest.raises(TraceFormatError, match="which is missing"):
        trace.save(tmp_path / "copy")
    assert list((tmp_path / "copy").iterdir()) == []  # no DOT source, no picture, no temporary file
    pid = int(note.read_text().split()[0])
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left drawing or as a zombie
        os.kill(pid, 0)


def test_an_interrupt_before_dot_starts_leaves_no_temporary_file_and_saves_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from graphtrace.render import dot

    trace = graphtrace.capture(demo_model(), demo_inputs())

    def interrupted(target: Path) -> Path:
        raise KeyboardInterrupt  # Ctrl-C while the picture's temporary file is being made

    monkeypatch.setattr(dot, "temporary_beside", interrupted)
    with pytest.raises(KeyboardInterrupt):
        trace.save(tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # neither the DOT source's temporary file nor a trace file
