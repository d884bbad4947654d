"""The torch-free data model: walking, finding, layer pruning, and what it must not import."""

from __future__ import annotations

from graphtrace.model import CallNode, TensorRecord, Trace, TraceMeta, iter_tensors, prune_layer_blocks
from tests.conftest import ROOT, run_python


def _block(path: str, *children: str) -> CallNode:
    return CallNode(path=path, children=tuple(CallNode(path=f"{path}.{c}") for c in children))


def test_pruning_keeps_first_and_last_layer_blocks_of_all_sibling_lists() -> None:
    root = CallNode(
        path="M",
        children=(
            CallNode(path="M.embed"),
            *(_block(f"M.enc.{i}", "attn") for i in range(3)),
            *(_block(f"M.dec.{i}", "attn") for i in range(2)),
            CallNode(path="M.head.7"),  # numbered but no children: not a layer block
        ),
    )
    kept = [child.path for child in prune_layer_blocks(root).children]
    # transformers counts blocks of sibling lists together: enc.0 ... dec.1 is one run of five blocks
    assert kept == ["M.embed", "M.enc.0", "M.dec.1", "M.head.7"]


def test_pruning_is_recursive_and_leaves_two_blocks_alone() -> None:
    inner = CallNode(path="M.stack", children=tuple(_block(f"M.stack.layers.{i}", "mlp") for i in range(4)))
    pair = CallNode(path="M.pair", children=tuple(_block(f"M.pair.{i}", "mlp") for i in range(2)))
    pruned = prune_layer_blocks(CallNode(path="M", children=(inner, pair)))
    assert [c.path for c in pruned.children[0].children] == ["M.stack.layers.0", "M.stack.layers.3"]
    assert [c.path for c in pruned.children[1].children] == ["M.pair.0", "M.pair.1"]


def test_walk_order_find_and_failed_call() -> None:
    root = CallNode(
        path="M",
        error="ValueError: x",
        children=(
            CallNode(path="M.a", children=(CallNode(path="M.a.x"),)),
            CallNode(path="M.b", error="ValueError: x", children=(CallNode(path="M.b.y", error="ValueError: x"),)),
        ),
    )
    trace = Trace(steps=(root,), meta=TraceMeta(model_class="M"))
    assert [n.path for n in trace.walk()] == ["M", "M.a", "M.a.x", "M.b", "M.b.y"]
    assert trace.find("M.b").path == "M.b"
    assert trace.failed_call() is root.children[1].children[0]
    assert Trace(steps=(CallNode(path="M"),), meta=TraceMeta(model_class="M")).failed_call() is None


def test_iter_tensors_names_like_the_reference_files() -> None:
    t = TensorRecord(shape=(1,), dtype="torch.float32")
    value = (t, {"logits": t, "cache": "None"}, (t,))
    assert [name for name, _ in iter_tensors(value, "_outputs")] == ["_outputs_0", "_outputs_1_logits", "_outputs_2_0"]
    assert CallNode(path="M.layers.3").name == "layers.3" and CallNode(path="M.q_proj").name == "q_proj"


def test_data_model_writers_and_readers_do_not_import_torch() -> None:
    code = (
        "import sys; import graphtrace, graphtrace.model, graphtrace.io, graphtrace.io.spec_json, "
        "graphtrace.io.trace_json; assert 'torch' not in sys.modules, 'torch imported'; print(graphtrace.__file__)"
    )
    # this checkout's graphtrace, whatever the cwd pytest runs from and whichever graphtrace is installed
    result = run_python("-c", code, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "graphtrace" / "__init__.py")


def test_with_value_carries_every_field_of_the_record() -> None:
    import dataclasses

    from graphtrace.model import DTensorInfo, Stats

    values = {field.name: f"<{field.name}>" for field in dataclasses.fields(TensorRecord)}
    values.update(stats=Stats(0.0, 1.0, -1.0, 1.0), dtensor=DTensorInfo("(Shard(dim=0),)", (2,), (4, 4)))
    record = TensorRecord(**values)  # a distinct value in every field, so a dropped or swapped field shows
    copy = record.with_value(("tensor([1.])",), "./x.safetensors")
    assert copy == dataclasses.replace(record, value=("tensor([1.])",), file="./x.safetensors")
    assert copy is not record and record.with_value(record.value, record.file) == record
