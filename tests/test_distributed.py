"""Ranks and DTensors: real torch.distributed jobs of 2 gloo processes on CPU, a Llama sharded by tensor parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.errors import InvalidOptionError, TraceFormatError
from graphtrace.io.tensors import load_tensor
from tests import zoo
from tests.distributed_run import RankResult, run_ranks, sharded_job

GATE = "LlamaForCausalLM.model.layers.0.mlp.gate_proj"
DOWN = "LlamaForCausalLM.model.layers.0.mlp.down_proj"


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RankResult]]:
    """One 2-rank job: the sharded captures, then a forward in which rank 1 raises."""
    directory = tmp_path_factory.mktemp("sharded")
    return directory, run_ranks(sharded_job, directory)


@pytest.fixture(scope="module")
def sharded(job: tuple[Path, list[RankResult]]) -> tuple[Path, list[dict]]:
    """What each rank reported from the captures that went well."""
    directory, results = job
    captured = [directory / f"captured_{rank}.json" for rank in (0, 1)]
    assert all(file.is_file() for file in captured), results
    return directory, [json.loads(file.read_text()) for file in captured]


def test_by_default_only_rank_0_records_and_the_others_attach_nothing(sharded: tuple[Path, list[dict]]) -> None:
    directory, (rank0, rank1) = sharded
    assert rank0["logits_match"] and rank1["logits_match"]  # tracing did not disturb the sharded forward
    assert rank0["default_steps"] == 1 and rank1["default_steps"] == 0
    assert rank0["patched_inside"] > 0 and rank1["patched_inside"] == 0  # rank 1 ran the model untouched
    assert rank0["patched_after"] == rank0["patched_before"] and rank1["patched_after"] == rank1["patched_before"]
    default = directory / "default"
    assert not list(default.glob("rank_*"))
    assert json.loads((default / "LlamaForCausalLM_graphtrace.json").read_text())["meta"]["rank"] == 0


def test_ranks_all_writes_one_trace_per_rank_with_differing_local_shards(sharded: tuple[Path, list[dict]]) -> None:
    directory, results = sharded
    assert [(r["all_rank"], r["all_world_size"]) for r in results] == [(0, 2), (1, 2)]
    traces = [graphtrace.load(str(directory / "all" / f"rank_{rank}")) for rank in (0, 1)]
    assert [trace.meta.rank for trace in traces] == [0, 1]
    # tensor parallelism's own hooks redistribute inputs and outputs: plumbing, neither marked nor recorded around
    assert [trace.hooks for trace in traces] == [{}, {}]

    model, inputs = zoo.llama()  # the same weights, unsharded
    whole: dict[str, torch.Tensor] = {}
    for path in (GATE, DOWN):
        module = model.get_submodule(path.split(".", 1)[1])
        module.register_forward_hook(lambda _m, _i, output, path=path: whole.__setitem__(path, output))
    with torch.no_grad():
        model(**inputs)

    def value(trace: graphtrace.Trace, path: str) -> torch.Tensor:
        record = trace.find(path).outputs
        assert isinstance(record, graphtrace.TensorRecord) and record.file is not None
        return load_tensor(trace.directory, record.file)  # type: ignore[arg-type]

    # gate_proj is column-wise: each rank holds its half of the output features
    gate = [trace.find(GATE).outputs for trace in traces]
    assert [record.shape for record in gate] == [(1, 7, 32), (1, 7, 32)]  # type: ignore[union-attr]
    for record in gate:
        info = record.dtensor  # type: ignore[union-attr]
        assert info is not None and (info.placements, info.mesh_shape, info.global_shape) == (
            "(Shard(dim=2),)",
            (2,),
            (1, 7, 64),
        )
    halves = [value(trace, GATE) for trace in traces]
    assert not torch.allclose(halves[0], halves[1])
    assert torch.allclose(torch.cat(halves, dim=-1), whole[GATE], atol=1e-6)
    # down_proj is row-wise: each rank holds a partial sum of the full output
    down = traces[0].find(DOWN).outputs
    assert down.dtensor is not None and down.dtensor.placements == "(Partial(sum),)"  # type: ignore[union-attr]
    partials = [value(trace, DOWN) for trace in traces]
    assert not torch.allclose(partials[0], partials[1])
    assert torch.allclose(partials[0] + partials[1], whole[DOWN], atol=1e-6)
    # the spec files stay as transformers writes them: the local shape, no DTensor keys
    summary = (directory / "all" / "rank_1" / "LlamaForCausalLM_debug_tree_SUMMARY.json").read_text()
    assert '"shape": "torch.Size([1, 7, 32])"' in summary and "placements" not in summary and "dtensor" not in summary


def test_generate_on_every_rank(sharded: tuple[Path, list[dict]]) -> None:
    directory, results = sharded
    assert [r["generate_phases"] for r in results] == [["prefill", "decode"]] * 2
    for rank in (0, 1):
        trace = graphtrace.load(str(directory / "generate" / f"rank_{rank}"))
        keys = trace.step_info[0].cache["layers"][0]["keys"]  # type: ignore[index]
        assert keys.shape == (1, 1, 7, 8)  # each rank caches its own key/value head of the two
    with pytest.raises(TraceFormatError, match="one trace per rank .rank_0, rank_1.; pass the folder"):
        graphtrace.load(str(directory / "generate"))


def test_a_rank_that_raises_does_not_leave_the_other_hanging(job: tuple[Path, list[RankResult]]) -> None:
    directory, (rank0, rank1) = job
    # both processes ended by themselves (none was killed at the deadline), each with its own error
    assert rank1.exitcode == 0 and rank1.error == "RuntimeError: rank 1 fails on purpose"
    assert rank0.exitcode == 0 and rank0.error is not None and rank0.error != rank1.error
    failing = "LlamaForCausalLM.model.layers.1.mlp.act_fn@0"
    assert any(f"saved to {directory / 'trace' / 'rank_1'}" in n and failing in n for n in rank1.notes), rank1.notes
    partial = graphtrace.load(str(directory / "trace" / "rank_1"))
    assert partial.failed_call().id == failing  # type: ignore[union-attr]
    assert partial.find("LlamaForCausalLM.model.layers.0.mlp.down_proj").error is None
    # rank 0 saved what it recorded until the collective its peer never joined failed
    waited = graphtrace.load(str(directory / "trace" / "rank_0"))
    assert waited.failed_call() is not None and waited.failed_call().path.startswith(  # type: ignore[union-attr]
        "LlamaForCausalLM.model.layers.1"
    )


def test_ranks_option_is_checked_before_the_forward(tmp_path: Path) -> None:
    model, inputs = zoo.llama()
    for bad in ("every", [], [-1], True, 1.0, [0, "1"], {0: 1}):
        with pytest.raises(InvalidOptionError, match="is not a rank, a list of ranks or 'all'"):
            graphtrace.capture(model, inputs, ranks=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match=r"names rank 1, but this is one process"):
        graphtrace.capture(model, inputs, ranks={1, 0}, path=tmp_path / "never")
    assert not (tmp_path / "never").exists()
    assert all("forward" not in module.__dict__ for module in model.modules())


def test_ranks_all_in_a_single_process_writes_rank_0(tmp_path: Path) -> None:
    model, inputs = zoo.llama()
    trace = graphtrace.capture(model, inputs, path=tmp_path, ranks="all")
    assert trace.meta.rank == 0 and trace.meta.world_size == 1
    assert (tmp_path / "rank_0" / "LlamaForCausalLM_graphtrace.json").is_file()
    assert graphtrace.load(str(tmp_path / "rank_0")).root.id == "LlamaForCausalLM@0"


def test_fx_passes_dtensors_along_and_never_computes_on_them(sharded: tuple[Path, list[dict]]) -> None:
    # the default capture used strategy="auto": a replay on one rank must never run a DTensor's operators, which
    # would wait for the other rank (the logits matching above shows the forward was not disturbed)
    directory, _ = sharded
    trace = graphtrace.load(str(directory / "default"))
    assert trace.find(GATE).strategy == "eager"
    assert trace.fallbacks[GATE] == (
        "Refused: computes on DTensor values, whose operators may communicate with other processes"
    )
    assert trace.coverage().fx > 0  # what is not sharded is still served
