"""The torch-free data model: walking, finding, layer pruning, and what it must not import."""

from __future__ import annotations

import pytest

from graphtrace.model import (
    CallNode,
    Coverage,
    TensorRecord,
    Trace,
    TraceMeta,
    fallback_in_words,
    iter_tensors,
    prune_layer_blocks,
)
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


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        (
            "NotImplementedError: argument of type: <class 'transformers.cache_utils.DynamicCache'>",
            "the model passes a cache object",
        ),
        (
            "Refused: calls EncoderDecoderCache.get_seq_length, which a replay would repeat",
            "the model passes a cache object",
        ),
        ("Refused: calls Counter.step, which a replay would repeat", "it calls Counter.step, which must run only once"),
        ("Refused: draws random numbers (aten::bernoulli)", "it draws random numbers"),
        (
            "TraceError: symbolically traced variables cannot be used as inputs to control flow",
            "its code branches on tensor values",
        ),
        (
            "SideEffect: Block.forward() logs through <Logger x> (stopped before it ran while tracing, so that it "
            "runs once, in the real call)",
            "its code has a side effect: Block.forward() logs through <Logger x>",
        ),
        ("IndexError: tuple index out of range", "torch.fx cannot trace its code"),
    ],
)
def test_fallbacks_in_a_porters_words(reason: str, words: str) -> None:
    assert fallback_in_words(reason) == words


def test_hooks_explain_a_graph_that_did_not_reproduce_the_call() -> None:
    mismatch = "Mismatch: the output: tensor differs"
    assert fallback_in_words(mismatch) == "its graph did not reproduce the call"
    assert fallback_in_words(mismatch, hooks=True) == "its forward hooks change what its forward returns"


def test_coverage_in_words_counts_reasons_that_read_the_same_together() -> None:
    coverage = Coverage(
        module_calls=45,
        fx=41,
        eager={
            "Refused: calls DynamicCache.update, which a replay would repeat": 3,
            "NotImplementedError: argument of type: <class 'x.DynamicCache'>": 1,
        },
    )
    assert coverage.in_words() == (
        "torch.fx verified 41 of 45 module calls (91%); 4 recorded by wrapping forward: the model passes a cache "
        "object (4)"
    )
    eager = Coverage(module_calls=3, fx=0, eager={"strategy='eager'": 3})
    assert eager.in_words() == "all 3 module calls recorded by wrapping forward (strategy='eager')"
