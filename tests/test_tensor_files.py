"""Full tensor values on disk: files identical to safetensors' own, bundles, the background writer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import graphtrace
from graphtrace.errors import OutputPathError
from graphtrace.io.file_writer import BackgroundWriter
from graphtrace.io.tensors import BundleSink, SafetensorsSink, load_tensor
from graphtrace.model import TensorRecord
from tests.zoo import llama

TENSORS = {
    "f32": torch.randn(3, 5),
    "scalar": torch.tensor(2.5, dtype=torch.float16),
    "empty": torch.zeros(0, 4),
    "bool": torch.tensor([True, False, True]),
    "bf16": torch.randn(7).to(torch.bfloat16),
    "i64": torch.arange(6).view(2, 3),
    "u8": torch.arange(5, dtype=torch.uint8),
    "transposed": torch.randn(4, 6).t(),
    "float8": torch.randn(4).to(torch.float8_e4m3fn),  # written by safetensors itself
}


def test_single_files_are_byte_for_byte_safetensors(tmp_path: Path) -> None:
    sink = SafetensorsSink(tmp_path / "ours")
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    for name, tensor in TENSORS.items():
        assert sink.store(tensor, name) == (None, f"./{name}.safetensors")
        save_file({"data": tensor.contiguous()}, str(tmp_path / "theirs" / f"{name}.safetensors"))
    sink.close()
    for name in TENSORS:
        ours = (tmp_path / "ours" / f"{name}.safetensors").read_bytes()
        assert ours == (tmp_path / "theirs" / f"{name}.safetensors").read_bytes(), name


def test_stored_value_is_the_value_at_store_time(tmp_path: Path) -> None:
    for sink in (SafetensorsSink(tmp_path), BundleSink(tmp_path, "M")):
        tensor = torch.ones(4, 4)
        _, file = sink.store(tensor, f"x_{type(sink).__name__}")
        tensor.mul_(3)  # the model changes it in place before the writer got to it
        sink.close()
        assert torch.equal(load_tensor(tmp_path, file), torch.ones(4, 4))


def test_bundle_holds_every_tensor_aligned_and_sharded_with_an_index(tmp_path: Path) -> None:
    sink = BundleSink(tmp_path, "M")
    sink.header_bytes = 1024  # a few entries per shard
    files = {name: sink.store(tensor, name)[1] for name, tensor in TENSORS.items() if name != "float8"}
    sink.close()
    shards = sorted(p.name for p in tmp_path.glob("M_tensors*.safetensors"))
    assert "M_tensors.safetensors" in shards and "M_tensors-00002.safetensors" in shards
    index = json.loads((tmp_path / "M_tensors.safetensors.index.json").read_text())
    for name, file in files.items():
        shard, _, key = file[2:].partition("#")
        assert key == name and index["weight_map"][key] == shard
        assert torch.equal(load_tensor(tmp_path, file), TENSORS[name].contiguous())
    assert set(index["weight_map"]) == set(files)  # padding holds no tensor: not indexed
    for shard in shards:
        with safe_open(str(tmp_path / shard), framework="pt") as handle:  # a valid file: no holes, no overlaps
            for key in handle.keys():
                tensor = handle.get_tensor(key)
                if not key.startswith("__padding__"):
                    assert tensor.data_ptr() % tensor.element_size() == 0


def test_capture_with_a_bundle(tmp_path: Path) -> None:
    model, inputs = llama()
    threads = threading.active_count()
    trace = graphtrace.capture(model, inputs, path=tmp_path, values="bundle")
    assert threading.active_count() == threads  # the writer's thread is gone
    bundle = load_file(str(tmp_path / "LlamaForCausalLM_tensors.safetensors"))
    records = [r for node in trace.walk() for _, r in [*node.input_tensors(), *node.output_tensors()] if r.file]
    assert records and all(r.file.startswith("./LlamaForCausalLM_tensors.safetensors#") for r in records)
    assert len(bundle) < len(records)  # a tensor passed on unchanged is stored once
    for record in records:
        value = load_tensor(tmp_path, record.file)
        assert tuple(value.shape) == record.shape and str(value.dtype) == record.dtype
        if record.stats is not None:
            assert value.float().mean().item() == pytest.approx(record.stats.mean, rel=1e-5, abs=1e-7)
    q, k = (trace.find(f"LlamaForCausalLM.model.layers.0.self_attn.{p}_proj") for p in "qk")
    assert q.args[0].file == k.args[0].file  # the same hidden states
    full = json.loads((tmp_path / "LlamaForCausalLM_debug_tree_FULL_TENSORS.json").read_text())
    assert full["inputs"]["kwargs"]["input_ids"]["value"].endswith("#LlamaForCausalLM_inputs_kwargs_input_ids")


def test_tracing_keeps_a_bundle_per_step(tmp_path: Path) -> None:
    model, inputs = llama()
    with graphtrace.tracing(model, path=tmp_path, values="bundle") as session:
        with torch.no_grad():
            model(**inputs)
            model(**inputs)
    assert len(session.trace.steps) == 2
    for step in ("step_0", "step_1"):
        assert (tmp_path / step / "LlamaForCausalLM_tensors.safetensors").is_file()
        assert (tmp_path / step / "LlamaForCausalLM_tensors.safetensors.index.json").is_file()
    loaded = graphtrace.load(str(tmp_path))
    record = loaded.find("LlamaForCausalLM.lm_head", step=1).outputs
    assert isinstance(record, TensorRecord)
    assert tuple(load_tensor(tmp_path / "step_1", record.file).shape) == record.shape


def test_writer_failures_reach_the_caller() -> None:
    writer = BackgroundWriter()

    def fail() -> None:
        raise OutputPathError("cannot write x: No space left on device")

    writer.submit(fail, 10)
    with pytest.raises(OutputPathError, match="No space left"):
        writer.drain()
    writer.submit(lambda: None, 10)  # usable again
    writer.close()


def test_bundle_needs_a_path_and_rejects_dtypes_it_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(graphtrace.GraphtraceError, match="needs path"):
        graphtrace.capture(torch.nn.Linear(2, 2), torch.ones(1, 2), values="bundle")
    sink = BundleSink(tmp_path, "M")
    with pytest.raises(graphtrace.GraphtraceError, match="values='safetensors'"):
        sink.store(TENSORS["float8"], "f8")
    sink.close()


def test_a_tensor_stored_under_several_names_is_written_once(tmp_path: Path) -> None:
    model, inputs = llama()
    trace = graphtrace.capture(model, inputs, path=tmp_path, values="safetensors")
    files = [trace.find(f"LlamaForCausalLM.model.layers.0.self_attn.{p}_proj").args[0].file for p in "qkv"]
    assert len(set(files)) == 3  # transformers' three names
    stats = [(tmp_path / file).stat() for file in files]
    assert len({s.st_ino for s in stats}) == 1 and stats[0].st_nlink >= 3  # one set of bytes on disk
    again = graphtrace.capture(model, inputs, path=tmp_path, values="safetensors")  # rewriting keeps names apart
    assert torch.equal(load_tensor(tmp_path, files[0]), load_tensor(tmp_path, files[2]))
    assert again.find("LlamaForCausalLM.lm_head").outputs.file == "./LlamaForCausalLM.lm_head_outputs.safetensors"


def test_a_failed_write_is_raised_after_the_trace_is_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import graphtrace.io.tensors as tensors

    def full_disk(fd: int, data: memoryview, offset: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensors, "_write_at", full_disk)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    with pytest.raises(OutputPathError, match="No space left on device") as raised:
        graphtrace.capture(model, torch.ones(1, 2), path=tmp_path, values="bundle")
    assert "Free some space" in str(raised.value)
    trace = graphtrace.load(str(tmp_path))  # the trace is kept, the call whose values failed is marked
    assert trace.find("Sequential.0").error.startswith("OutputPathError: cannot write")
    assert trace.find("Sequential.0").args[0].stats is not None


@pytest.mark.parametrize("values", ["safetensors", "bundle"])
def test_op_records_and_pruning_leave_exactly_the_referenced_files(tmp_path: Path, values: str) -> None:
    from graphtrace.io.trace_files import referenced_files

    model, inputs = llama()
    trace = graphtrace.capture(model, inputs, path=tmp_path, values=values, ops=True, prune_layers=True)
    saved = graphtrace.load(str(tmp_path))
    records = [r for n in saved.walk() for _, r in (*n.input_tensors(), *n.output_tensors()) if r.file]
    assert any("#" in r.file.split(".safetensors")[0] for r in records) or values == "bundle"  # op paths hold "#"
    for record in records:
        assert tuple(load_tensor(tmp_path, record.file).shape) == record.shape
    on_disk = {p.name for p in tmp_path.glob("*.safetensors")}
    kept = {f[2:] for step in saved.steps for f in referenced_files(step)}
    root_outputs = {name for name in on_disk if name.startswith("LlamaForCausalLM_outputs")}
    assert kept <= on_disk and on_disk - kept <= root_outputs  # pruned calls' and ops' files are gone
    assert len(trace.steps) == 1
