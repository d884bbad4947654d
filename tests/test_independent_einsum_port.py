"""diff on a Flax-style Gemma port of transformers' GemmaForCausalLM (tests/independent_einsum_port.py). The port has
no nn.Linear: its projections are einsums over weights in einsum shape, returning ``[B, T, H, Dh]`` where
transformers returns ``[B, T, H*Dh]``, with k and v (and gate and up) stacked on a new leading axis of one output;
it passes a boolean mask where transformers adds a floating one. A faithful port compares equal in every value mode;
each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_einsum_port as port
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return port.hf_gemma()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = port.token_ids()
    return port_traces(tmp_path_factory.mktemp("einsum"), original, {"input_ids": ids}, port.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = port.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(port.port_of(original)(ids), reference, atol=1e-5)
        for bug in port.BUGS:
            moved = (port.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-4, bug
    assert not any(isinstance(m, torch.nn.Linear) for m in port.port_of(original).modules())


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize("variant", [None, *port.VARIANTS])
def test_a_faithful_einsum_port_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, variant: str | None
) -> None:
    """k and v stacked on a leading axis ([2, B, T, K, Dh]) or side by side in a split last dim ([B, T, 2, K, Dh],
    the variant) against transformers' k_proj and v_proj."""
    a, b = captured(variant, values)
    result = graphtrace.compare(a, b, rules=port.RULES if mapped else ())
    assert result.equal, result.table()
    fused = {
        (call.a.path.rpartition(".")[2], call.b.path.rpartition(".")[2]) for call in result.calls if call.how == "fused"
    }
    assert fused == {
        ("k_proj", "kv_einsum"),
        ("v_proj", "kv_einsum"),
        ("gate_proj", "gating_einsum"),
        ("up_proj", "gating_einsum"),
    }, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["model.layers.1.self_attn.q_proj"] == "blocks.1.attn.q_einsum", result.table()
    assert pairs["model.layers.1.self_attn.o_proj"] == "blocks.1.attn.attn_vec_einsum", result.table()
    q = next(call for call in result.calls if call.b.path.endswith("blocks.1.attn.q_einsum"))
    assert q.outputs[0].shape_b == (1, 8, 4, 16) and q.outputs[0].basis in ("values", "stats"), result.table()
    if values != "repr":  # [B, T, H, Dh] against [B, T, H*Dh] by values; v is the second of the stacked parts
        assert "a last dim split" in q.outputs[0].equivalence, q.outputs[0]
        v = next(call for call in result.calls if call.a.path.endswith("layers.1.self_attn.v_proj"))
        where = "[1]" if variant is None else "[..., 32:64]"
        assert v.outputs[0].equivalence.startswith(f"a slice {where} of the fused kv_einsum"), v.outputs[0]


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(
    ("bug", "expected"), [(bug, expected) for _, bug, _, expected in port.CASES + port.COMPOUND_CASES]
)
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=port.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    if values == "repr":
        expected = port.STATS_EXPECTED.get(("einsum", bug), expected)
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_stacked_parts_after_a_divergence_still_pair_with_the_fused_call(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """Block 1 departs; block 2's kv_einsum and both blocks' gating_einsum read hidden states that differ from the
    original's, but they read the outputs of norms paired with the ones k_proj, v_proj, gate_proj and up_proj read."""
    a, b = captured("kv_swapped", "repr")
    result = graphtrace.compare(a, b)
    fused = {call.b.path.partition(".")[2] for call in result.calls if call.how == "fused"}
    assert {"blocks.2.attn.kv_einsum", "blocks.1.mlp.gating_einsum", "blocks.2.mlp.gating_einsum"} <= fused
    assert not result.only_in_b, result.table()


class HeadsApart(torch.nn.Module):
    """A projection whose output keeps its heads on an axis of their own (``[B, T, H, Dh]``), or not; ``factor``
    scales one token's output by a few parts in a million."""

    def __init__(self, split: bool, factor: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(64, 64)
        self.split, self.factor = split, factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        y = torch.cat([y[:, :3], y[:, 3:4] * self.factor, y[:, 4:]], dim=1)
        return (y.view(*y.shape[:-1], 4, 16) if self.split else y).relu()


class Model(torch.nn.Module):
    def __init__(self, split: bool, factor: float = 1.0) -> None:
        super().__init__()
        self.heads = HeadsApart(split, factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads(x).flatten(2) + 1.0


def test_the_fingerprint_compares_across_a_split_last_dim(tmp_path: Path) -> None:
    """[1, 8, 64] keeps 8 row groups, [1, 8, 4, 16] 16: two of the finer side's sum to one of the coarser side's."""
    x = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1))
    for name, split, factor in (("a", False, 1.0), ("same", True, 1.0), ("b", True, 1 + 4e-6)):
        graphtrace.capture(Model(split, factor), x, path=tmp_path / name)  # values="repr": no files
    same = graphtrace.compare(tmp_path / "a", tmp_path / "same")
    assert same.equal, same.table()
    first = graphtrace.compare(tmp_path / "a", tmp_path / "b").first_divergence
    assert first is not None and first.a.path == "Model.heads", first
    assert "the value fingerprint; statistics of the whole agree" in first.reason, first.reason
