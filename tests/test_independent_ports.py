"""diff on independently written ports (issue 12): a faithful port compares equal, each injected bug is named at the
module where it lives, in every value mode, with and without rename rules, with and without op records.

The ports (tests/independent_llama.py, tests/independent_gpt2.py) are written in styles unlike transformers':
Meta-style names and interleaved complex rotary, a fused ``wqkv``, a nanoGPT GPT-2 with ``[T]`` positions, manual
attention and dropout modules the original lacks. Expected culprits are paths relative to the port.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_gpt2, independent_llama
from tests.independent_cases import CASES, COMPOUND_CASES, FAITHFUL, MODES, SPLIT_CASES


@pytest.fixture(scope="module")
def originals() -> dict[str, torch.nn.Module]:
    return {"llama": independent_llama.hf_llama(), "gpt2": independent_gpt2.hf_gpt2()}


@pytest.fixture(scope="module")
def token_ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))


def _port(originals: dict[str, torch.nn.Module], arch: str, bug: str | None, fused: bool) -> torch.nn.Module:
    if arch == "llama":
        return independent_llama.port_of(originals["llama"], fused=fused, bug=bug)
    return independent_gpt2.port_of(originals["gpt2"], bug=bug)


@pytest.fixture(scope="module")
def captured(
    tmp_path_factory: pytest.TempPathFactory, originals: dict[str, torch.nn.Module], token_ids: torch.Tensor
) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (arch, bug, fused, mode, ops)."""
    root = tmp_path_factory.mktemp("ports")
    done: dict[tuple[object, ...], tuple[Path, Path]] = {}

    def get(arch: str, bug: str | None, fused: bool, values: str, ops: bool = False) -> tuple[Path, Path]:
        key = (arch, bug, fused, values, ops)
        if key not in done:
            original = root / f"{arch}-original-{values}-{ops}"
            if not original.exists():
                graphtrace.capture(originals[arch], {"input_ids": token_ids}, path=original, values=values, ops=ops)
            port = root / f"{arch}-{bug}-{fused}-{values}-{ops}"
            graphtrace.capture(_port(originals, arch, bug, fused), (token_ids,), path=port, values=values, ops=ops)
            done[key] = (original, port)
        return done[key]

    return get


def _rules(arch: str) -> tuple[str, ...]:
    return independent_llama.RULES if arch == "llama" else independent_gpt2.RULES


def _named(result: graphtrace.compare.Comparison) -> str | None:
    found = result.first_divergence
    return None if found is None else found.b.path.partition(".")[2]


def test_the_ports_are_faithful_and_each_bug_changes_the_logits(
    originals: dict[str, torch.nn.Module], token_ids: torch.Tensor
) -> None:
    with torch.no_grad():
        for arch, fused in FAITHFUL:
            reference = originals[arch](token_ids, use_cache=False).logits
            assert torch.allclose(_port(originals, arch, None, fused)(token_ids), reference, atol=1e-5)
        for arch, bug, fused, _ in CASES:
            reference = originals[arch](token_ids, use_cache=False).logits
            changed = (_port(originals, arch, bug, fused)(token_ids) - reference).abs().max().item()
            assert changed > 1e-6, bug  # exact GELU moves GPT-2's logits by ~1e-5 only: the subtle case


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize(("arch", "fused"), FAITHFUL)
def test_a_faithful_port_compares_equal(
    captured: Callable[..., tuple[Path, Path]], arch: str, fused: bool, values: str
):
    original, port = captured(arch, None, fused, values)
    for rules in ((), _rules(arch)):
        result = graphtrace.compare(original, port, rules=rules)
        assert result.equal, (rules, result.divergence)
        assert result.first_divergence is None


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize(("arch", "bug", "fused", "culprit"), CASES)
def test_each_bug_is_named_where_it_lives(
    captured: Callable[..., tuple[Path, Path]], arch: str, bug: str, fused: bool, culprit: str, values: str
) -> None:
    original, port = captured(arch, bug, fused, values)
    for rules in ((), _rules(arch)):
        result = graphtrace.compare(original, port, rules=rules)
        assert not result.equal
        assert _named(result) == culprit, (rules, result.divergence)


@pytest.mark.parametrize(("arch", "fused"), FAITHFUL)
def test_op_records_raise_no_false_positive(captured: Callable[..., tuple[Path, Path]], arch: str, fused: bool):
    original, port = captured(arch, None, fused, "safetensors", ops=True)
    assert graphtrace.compare(original, port).equal


@pytest.mark.parametrize(("arch", "bug", "fused", "culprit"), [CASES[0], CASES[9]])
def test_with_op_records_the_culprit_is_the_same(
    captured: Callable[..., tuple[Path, Path]], arch: str, bug: str, fused: bool, culprit: str
) -> None:
    original, port = captured(arch, bug, fused, "safetensors", ops=True)
    assert _named(graphtrace.compare(original, port)) == culprit


def test_the_report_explains_the_equivalences_it_applied(captured: Callable[..., tuple[Path, Path]]) -> None:
    original, port = captured("llama", None, True, "safetensors")
    result = graphtrace.compare(original, port)
    notes = {d.equivalence for call in result.calls for d in (*call.inputs, *call.outputs)}
    assert any("per-head interleaved->half-split layout (head size 16)" in note for note in notes)
    assert any("of the fused wqkv" in note for note in notes)
    assert result.matched_by()["fused"] == 9  # q, k and v of three layers against slices of wqkv
    table = result.table()
    assert "equivalences applied" in table and "differ only by size-1 dims" in table
    report = result.to_json()
    assert report["version"] == 2 and report["equal"] is True


def test_a_bug_inside_a_module_is_explained_as_such(captured: Callable[..., tuple[Path, Path]]) -> None:
    original, port = captured("gpt2", "bf16_activation", False, "safetensors")
    found = graphtrace.compare(original, port, rules=independent_gpt2.RULES).divergence
    assert found is not None and found.inside and found.before is not None
    assert found.before.b.path.endswith("h.2.mlp.proj")
    assert found.explanation.startswith("inside transformer.h.2.mlp ↔ h.2.mlp, before transformer.h.2.mlp.c_proj")
    report = graphtrace.compare(original, port).to_json()["first_divergence"]
    assert report["inside"] is True and report["before"]["b"].endswith("h.2.mlp.proj@0")


@pytest.mark.parametrize(
    ("arch", "bug", "op", "line"),
    [
        ("llama", "rope_base", "mul", "torch.view_as_real(cq * f)"),
        ("llama", "scale_1_over_d", "mul", "torch.matmul(xq, keys.transpose(2, 3)) * scale"),
        ("llama", "bf16_attention", "bfloat16", "xq.bfloat16()"),
        ("gpt2", "scale_1_over_d", "mul", "att = (q @ k.transpose(-2, -1)) *"),
        ("gpt2", "bf16_attention", "bfloat16", "q.bfloat16()"),
        ("gpt2", "bf16_activation", "to", "h.to(torch.bfloat16)"),
    ],
)
def test_the_op_and_its_source_line_are_named_inside_the_module(
    captured: Callable[..., tuple[Path, Path]], arch: str, bug: str, op: str, line: str
) -> None:
    original, port = captured(arch, bug, False, "safetensors", ops=True)
    result = graphtrace.compare(original, port)
    found = result.divergence
    assert found is not None and found.op_locus is not None
    locus = found.op_locus
    assert locus.op.name == op and locus.op.source is not None
    assert line in locus.op.source.text and locus.op.source.file.endswith(f"independent_{arch}.py")
    assert "has no counterpart in the original" in result.table()
    assert result.to_json()["first_divergence"]["op_locus"].startswith(f"port independent_{arch}.py:")


@pytest.mark.parametrize("values", ["safetensors", "repr"])
def test_separate_projections_pair_with_gpt2s_fused_c_attn(
    originals: dict[str, torch.nn.Module], token_ids: torch.Tensor, tmp_path: Path, values: str
) -> None:
    port = independent_gpt2.split_port_of(originals["gpt2"])
    with torch.no_grad():
        reference = originals["gpt2"](token_ids, use_cache=False).logits
        assert torch.allclose(port(token_ids), reference, atol=1e-5)
    graphtrace.capture(originals["gpt2"], {"input_ids": token_ids}, path=tmp_path / "a", values=values)
    graphtrace.capture(port, (token_ids,), path=tmp_path / "b", values=values)
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert result.equal, result.divergence
    assert result.matched_by()["fused"] == 9  # c_attn of three blocks against q, k and v


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in SPLIT_CASES])
def test_a_port_without_an_mlp_module_is_blamed_where_the_bug_lives(
    originals: dict[str, torch.nn.Module], token_ids: torch.Tensor, tmp_path: Path, values: str, bug: str, expected: str
) -> None:
    """The inlined MLP leaves GPT-2's mlp container without counterpart; a norm or the block's own code is still
    named, not the attention before it (leaves pair by what they were given when their outputs differ)."""
    graphtrace.capture(originals["gpt2"], {"input_ids": token_ids}, path=tmp_path / "a", values=values)
    graphtrace.capture(
        independent_gpt2.split_port_of(originals["gpt2"], bug), (token_ids,), path=tmp_path / "b", values=values
    )
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert _named(result) == expected, result.table()


@pytest.mark.parametrize("values", ["bundle", "repr"])
def test_a_port_computing_v_k_q_in_another_order_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str
) -> None:
    """No order-preserving alignment pairs q_proj with wq when the port calls wv first: inside an attention whose
    output agrees, its projections pair by what they compute, in whatever order they run."""
    a, b = captured("llama", "vkq_order", False, values)
    result = graphtrace.compare(a, b)
    assert result.equal, result.table()
    pairs = {call.a.path.rpartition(".")[2]: call.b.path.rpartition(".")[2] for call in result.calls}
    assert (pairs["q_proj"], pairs["k_proj"], pairs["v_proj"]) == ("wq", "wk", "wv")


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(
    ("bug", "expected"), [(bug, expected) for arch, bug, _, expected in COMPOUND_CASES if arch == "llama"]
)
def test_a_port_in_another_order_with_a_bug_is_blamed_where_the_bug_lives(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    """The port computes v, k, q and departs inside the same attention (or MLP): the projections pair by the order
    its agreeing layers show, or by what they compute where the shapes rule out the original's order, and swapped
    weights are still blamed at the projection."""
    a, b = captured("llama", bug, False, values)
    result = graphtrace.compare(a, b, rules=_rules("llama") if mapped else ())
    assert _named(result) == expected, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["model.layers.0.self_attn.q_proj"] == "layers.0.attention.wq", result.table()
    assert pairs["model.layers.2.self_attn.v_proj"] == "layers.2.attention.wv", result.table()
