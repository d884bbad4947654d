"""diff on a litgpt style port of transformers' grouped-query LlamaForCausalLM (tests/independent_litgpt_port.py).
The port fuses q, k and v into one ``attn`` Linear laid out per query group (each group's query heads, then its key
head, then its value head), builds its rope and mask caches once in ``GPT`` and hands them to every block, and names
everything as litgpt does. A faithful port compares equal in every value mode; each injected bug is named in the
port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_litgpt_port as litgpt
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return litgpt.hf_llama_gqa()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = litgpt.token_ids()
    return port_traces(tmp_path_factory.mktemp("litgpt"), original, {"input_ids": ids}, litgpt.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = litgpt.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(litgpt.port_of(original)(ids), reference, atol=1e-5)
        for bug in litgpt.BUGS:
            moved = (litgpt.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-4, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_with_a_per_group_fused_projection_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=litgpt.RULES if mapped else ())
    assert result.equal, result.table()
    fused = {call.a.path.rpartition(".")[2] for call in result.calls if call.how == "fused"}
    assert fused == {"q_proj", "k_proj", "v_proj"}, result.table()
    if values != "repr":  # each part against its own columns of each query group, not a third of the output
        notes = {d.equivalence for call in result.calls if call.how == "fused" for d in call.outputs}
        assert any("of each of 2 head groups" in note for note in notes), notes


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in litgpt.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=litgpt.RULES if mapped else ())
    if values == "repr":
        expected = litgpt.STATS_EXPECTED.get(("litgpt", bug), expected)
    assert not result.equal, result.table()
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_masks_in_other_conventions_compare_by_the_positions_they_keep(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """transformers gives each layer an additive float mask [2, 1, 8, 8] (0 kept, the dtype's lowest value masked),
    the port a boolean [1, 1, 8, 8] broadcast over the batch: the same quantity, compared by what it keeps. A mask
    that lets each token see the next one is then a departure in GPT's own code, before block 0."""
    a, b = captured(None, "bundle")
    block = next(c for c in graphtrace.compare(a, b).calls if c.b.path.endswith("transformer.h.0"))
    (mask,) = [d for d in block.inputs if d.dtype_b == "torch.bool"]
    assert mask.status == "equal" and mask.equivalence == "masks compared by the positions they keep", mask
    a, b = captured("mask_diagonal", "bundle")
    found = graphtrace.compare(a, b).divergence
    assert found is not None and found.call.b.path == "GPT" and found.inside, found
    assert found.before is not None and found.before.b.path == "GPT.transformer.h.0", found
    (mask,) = [d for d in found.before.inputs if d.dtype_b == "torch.bool"]
    assert mask.status == "diverged" and "14 of 128 positions kept on one side only" in mask.reason, mask


def test_measure_masks_reads_a_boolean_mask_either_way() -> None:
    from graphtrace.compare.measure import measure_masks
    from graphtrace.model import Stats, TensorRecord

    keep = torch.ones(4, 4, dtype=torch.bool).tril()
    additive = torch.zeros(2, 1, 4, 4).masked_fill(~keep, torch.finfo(torch.float32).min)
    stats = Stats(mean=float("-inf"), std=float("inf"), min=torch.finfo(torch.float32).min, max=0.0)
    a = TensorRecord(shape=(2, 1, 4, 4), dtype="torch.float32", stats=stats)
    b = TensorRecord(shape=(1, 1, 4, 4), dtype="torch.bool")
    verdicts = {
        name: measure_masks("a", a, "b", b, (additive, mask.view(1, 1, 4, 4))).status
        for name, mask in (("kept", keep), ("masked", ~keep), ("next_too", torch.ones(4, 4, dtype=torch.bool).tril(1)))
    }
    assert verdicts == {"kept": "equal", "masked": "equal", "next_too": "diverged"}
    assert measure_masks("a", a, "b", b, None).status == "unchecked"  # statistics cannot tell patterns apart


@pytest.mark.parametrize("values", ["bundle", "repr"])
def test_a_fused_call_of_the_port_still_pairs_with_its_parts_after_a_divergence(
    captured: Callable[..., tuple[Path, Path]], values: str
) -> None:
    """The mask departs before block 0, so blocks 1 and 2 are given hidden states that differ from the original's;
    their fused attn (in B, the port) still reads the output of the norm paired with the one q_proj, k_proj and
    v_proj (in A) read."""
    a, b = captured("mask_diagonal", values)
    result = graphtrace.compare(a, b)
    fused = {call.b.path.partition(".")[2] for call in result.calls if call.how == "fused"}
    assert {f"transformer.h.{i}.attn.attn" for i in range(3)} <= fused, result.table()
    assert not [u.call.path for u in result.only_in_b], result.table()
