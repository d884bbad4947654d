"""Aligning an original implementation with its port: GPT-2 from transformers against a re-implementation with other
module names and the same weights, matched by rename rules and by structure; rename rules on their own."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.cli import EXIT_BAD_INPUT, main
from graphtrace.compare import Comparison, align
from graphtrace.compare.fused import concatenated_record, find_fused
from graphtrace.compare.fused_layout import part_columns
from graphtrace.compare.rules import apply_rules, parse_rule, parse_rules
from graphtrace.errors import InvalidOptionError
from graphtrace.model import CallNode, Stats, TensorRecord
from tests.gpt2_port import GPT2_ONLY, GPT2_RULES, port_of
from tests.zoo import gpt2, llama


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Traces of GPT-2 and of ports of it, captured once for this file.

    The MLP's input weights are scaled so that activations reach the size of a trained model's, where GPT-2's tanh
    approximation of GELU and the exact GELU differ by more than float32 tolerance."""
    made: dict[tuple[str, str], Path] = {}

    def get(which: str, values: str = "safetensors") -> Path:
        if (which, values) not in made:
            model, inputs = gpt2()
            with torch.no_grad():
                for block in model.transformer.h:
                    block.mlp.c_fc.weight.mul_(10)
            subject = {
                "gpt2": model,
                "port": port_of(model),
                "buggy": port_of(model, approximate="none"),
                "no-residual": port_of(model, mlp_residual=False),
            }[which]
            path = tmp_path_factory.mktemp(f"{which}-{values}")
            graphtrace.capture(subject, inputs, path=path, values=values)
            made[which, values] = path
        return made[which, values]

    return get


def _pairs(result: Comparison) -> set[tuple[str, str]]:
    return {(call.a.id, call.b.id) for call in result.calls}


def test_rules_match_every_call_of_the_port(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("gpt2"), traces("port"), rules=GPT2_RULES, align="path")
    assert result.equal and not result.unused_rules
    assert result.matched_by() == {"path": 1, "rule": 34, "structure": 0, "fused": 0}  # the two roots match by path
    assert not result.only_in_b
    assert all(item.call.path.endswith(GPT2_ONLY) for item in result.only_in_a)
    assert ("GPT2LMHeadModel.transformer.h.1.attn.c_attn@0", "PortGPT.blocks.1.attention.qkv@0") in _pairs(result)
    # Conv1D against nn.Linear: the same numbers up to float32 rounding, compared on full values
    qkv = next(call for call in result.calls if call.b.path == "PortGPT.blocks.1.attention.qkv")
    assert qkv.outputs[0].basis == "values" and qkv.outputs[0].cosine == pytest.approx(1, abs=1e-6)


def test_structure_finds_the_pairs_the_rules_name(traces: Callable[..., Path]) -> None:
    by_rules = graphtrace.compare(traces("gpt2"), traces("port"), rules=GPT2_RULES, align="path")
    by_structure = graphtrace.compare(traces("gpt2"), traces("port"))  # auto: no rules, so structure
    assert by_structure.matched_by() == {"path": 1, "rule": 0, "structure": 34, "fused": 0}
    assert _pairs(by_structure) == _pairs(by_rules) and by_structure.equal
    # a module followed by a no-op (c_proj, then resid_dropout) pairs with the module
    out = next(call for call in by_structure.calls if call.b.path == "PortGPT.blocks.0.attention.out")
    assert out.a.path == "GPT2LMHeadModel.transformer.h.0.attn.c_proj"
    # statistics alone (no values saved) give the same alignment
    stats_only = graphtrace.compare(traces("gpt2", "none"), traces("port", "none"), align="structure")
    assert _pairs(stats_only) == _pairs(by_rules) and stats_only.equal


def test_rules_and_structure_together(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("gpt2"), traces("port"), rules=["transformer.h.{i}=blocks.{i}"])
    assert result.matched_by() == {"path": 1, "rule": 3, "structure": 31, "fused": 0}
    assert _pairs(result) == _pairs(graphtrace.compare(traces("gpt2"), traces("port"), rules=GPT2_RULES))


@pytest.mark.parametrize("align", ["path", "structure"])
def test_a_porting_bug_is_named_in_both_names(traces: Callable[..., Path], align: str) -> None:
    rules = GPT2_RULES if align == "path" else ()
    result = graphtrace.compare(traces("gpt2"), traces("buggy"), rules=rules, align=align)  # type: ignore[arg-type]
    first = result.first_divergence
    assert first is not None and first.inputs_agree
    assert (first.a.id, first.b.id) == ("GPT2LMHeadModel.transformer.h.0.mlp.act@0", "PortGPT.blocks.0.ffn.act@0")
    assert first.a.type_name == "NewGELUActivation" and first.b.type_name == "GELU"
    table = result.table()
    assert "transformer.h.0.mlp.act ↔ blocks.0.ffn.act" in table and "◀ first divergence" in table


def test_a_bug_in_a_container_s_own_code_names_the_container(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("gpt2"), traces("no-residual"))
    first = result.first_divergence
    assert first is not None and first.inputs_agree and first.how == "structure"
    assert (first.a.id, first.b.id) == ("GPT2LMHeadModel.transformer.h.0@0", "PortGPT.blocks.0@0")
    inside = [call for call in result.calls if call.a.path.startswith("GPT2LMHeadModel.transformer.h.0.")]
    assert len(inside) == 9 and all(call.status == "equal" for call in inside)  # every module in it agrees
    assert first.outputs[0].basis == "stats"  # a container's output: statistics in graphtrace's own trace


def test_without_rules_or_structure_only_the_roots_match(traces: Callable[..., Path]) -> None:
    result = graphtrace.compare(traces("gpt2"), traces("port"), align="path", rules=["nothing.here=at.all"])
    assert [call.a.path for call in result.calls] == ["GPT2LMHeadModel"]
    assert result.unused_rules == ("nothing.here=at.all",)
    assert "rules that renamed no call of A: nothing.here=at.all" in result.table()
    assert result.equal  # the logits agree; the rest is unmatched
    assert not graphtrace.compare(traces("gpt2"), traces("port"), align="path", strict=True).equal


# -- rename rules --------------------------------------------------------------------------------------------------


def test_rules_rename_whole_components_in_order() -> None:
    rules = parse_rules(["transformer.h.{i}=model.layers.{i}", "attn=self_attn", "c_{kind}={kind}_proj"])
    used: set = set()
    assert apply_rules(rules, "transformer.h.11.attn.c_attn", used) == "model.layers.11.self_attn.attn_proj"
    assert apply_rules(rules, "transformer.h.0.attn_norm", used) == "model.layers.0.attn_norm"  # not a component
    assert apply_rules(rules, "lm_head", used) == "lm_head"
    assert {rule.text for rule in used} == {
        "transformer.h.{i}=model.layers.{i}",
        "attn=self_attn",
        "c_{kind}={kind}_proj",
    }
    swap = parse_rule("blocks.{a}.{b}=stages.{b}.{a}")
    assert swap.apply("blocks.1.2.mlp") == "stages.2.1.mlp"
    assert parse_rule("h{i}=layers.{i}").apply("encoder.h12.norm") == "encoder.layers.12.norm"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            "layers.{i}=blocks",
            r"'layers\.\{i\}=blocks' gives model\.layers\.0 and model\.layers\.1 of trace A one name",
        ),
        ("q_proj=proj", r"gives model\.layers\.0\.self_attn\.q_proj and model\.layers\.0\.self_attn\.k_proj"),
    ],
)
def test_rules_that_give_two_modules_one_name_are_refused(rule: str, message: str) -> None:
    """A placeholder left out on the right side (every layers.N becomes blocks) or two rules onto one name: which of
    A's modules B's name stands for would be a guess."""
    model, inputs = llama()
    trace = graphtrace.capture(model, inputs, values="none")
    rules = [rule] if "{" in rule else [rule, "k_proj=proj"]
    with pytest.raises(InvalidOptionError, match=message):
        graphtrace.compare(trace, trace, rules=rules)
    # a placeholder left out where it matches one module at each place is a wildcard, not a merge (T5's
    # layer.{j}.DenseReluDense sits at layer.1 in the encoder's blocks and at layer.2 in the decoder's)
    assert graphtrace.compare(trace, trace, rules=["self_{kind}=attention"]).equal  # one self_attn per layer


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("transformer.h", "has no '='"),
        ("=model.layers", "the left side '' is not a dotted module name"),
        ("a..b=c", "the left side 'a..b' is not a dotted module name"),
        ("a=b c", "the right side 'b c' is not a dotted module name"),
        ("h.{i}=layers.{j}", r"uses \{j\}, which its left side does not define"),
        ("h.{i}.{i}=x", "uses a placeholder twice"),
        ("h.{=x", "not a dotted module name"),
        ("h.{0}=layers.{0}", r"the left side 'h\.\{0\}' is not a dotted module name"),  # a placeholder needs a name
        ("a=b=c", "the right side 'b=c' is not a dotted module name"),
        ("h.{i}.x=layers.{i}.{kind}", r"uses \{kind\}, which its left side does not define"),
    ],
)
def test_bad_rules_are_named_with_the_remedy(
    rule: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        parse_rule(rule)
    # compare() and `graphtrace diff --map` reject the rule itself: both traces exist, only the rule is wrong
    trace = graphtrace.capture(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.ones(1, 2), path=tmp_path / "t")
    with pytest.raises(InvalidOptionError, match=message) as raised:
        graphtrace.compare(trace, trace, rules=["attn=self_attn", rule])
    assert isinstance(raised.value, ValueError) and repr(rule) in str(raised.value)
    assert graphtrace.compare(trace, trace, rules=["attn=self_attn"]).equal  # the same call with good rules works
    directory = str(tmp_path / "t")
    assert main(["diff", directory, directory, "--map", "attn=self_attn", "--map", rule]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"graphtrace diff: error: rename rule {rule!r}") and re.search(message, err)
    assert "Traceback" not in err


# -- large gaps: banded and windowed alignment -----------------------------------------------------------------------


def _flat(root: str, prefix: str, leaves: int, extra_every: int = 0) -> CallNode:
    """Linear layers in a row (with a dropout after every n-th one): the statistics differ from layer to layer."""

    def tensor(seed: int) -> TensorRecord:
        return TensorRecord(shape=(1, 8), dtype="torch.float32", stats=Stats(seed * 1e-3, 1.0, -2.0, 2.0))

    children = []
    for i in range(leaves):
        children.append(
            CallNode(path=f"{root}.{prefix}{i}", type_name="Linear", args=(tensor(i),), outputs=tensor(i + 1))
        )
        if extra_every and i % extra_every == 0:
            children.append(
                CallNode(path=f"{root}.drop{i}", type_name="Dropout", args=(tensor(i + 1),), outputs=tensor(i + 1))
            )
    return CallNode(path=root, leaf=False, args=(tensor(0),), outputs=tensor(leaves), children=tuple(children))


@pytest.mark.parametrize("regime", ["exact", "banded", "windowed"])
def test_large_gaps_still_pair_every_call(monkeypatch: pytest.MonkeyPatch, regime: str) -> None:
    if regime != "exact":
        monkeypatch.setattr(align, "FULL_DP_CELLS", 100)
        monkeypatch.setattr(align, "BAND_MARGIN", 8)  # a band of 30 + 8 on each side of the diagonal, of 90
    if regime == "windowed":
        monkeypatch.setattr(align, "DP_CELL_LIMIT", 100)
        monkeypatch.setattr(align, "_WINDOW", 16)
    original, port = _flat("Original", "linear", 90, extra_every=3), _flat("Port", "fc", 90)
    alignment = align.align_calls(original, port)
    pairs = [(m.a.path.rsplit(".", 1)[-1], m.b.path.rsplit(".", 1)[-1]) for m in alignment.matches[1:]]
    assert pairs == [(f"linear{i}", f"fc{i}") for i in range(90)]
    assert all(node.type_name == "Dropout" for node in alignment.only_a) and len(alignment.only_a) == 30
    assert {m.how for m in alignment.matches[1:]} == {"structure"}


# -- fused projections -----------------------------------------------------------------------------------------------


def _record(width: int, seed: float = 0.0) -> TensorRecord:
    return TensorRecord(shape=(1, 4, width), dtype="torch.float32", stats=Stats(seed, 1.0, -2.0, 2.0))


def test_a_fused_projection_s_parts_are_projections_not_the_container_around_them() -> None:
    """A container that happens to take the fused call's input and return a part's width is not a part."""
    hidden = _record(8)
    qkv = CallNode(path="A.attn.qkv", type_name="Linear", args=(hidden,), outputs=_record(24, 0.5))
    a_attn = CallNode(path="A.attn", leaf=False, args=(hidden,), outputs=_record(8, 0.7), children=(qkv,))
    a_root = CallNode(path="A", leaf=False, args=(hidden,), outputs=_record(8, 0.9), children=(a_attn,))
    inner_leaf = CallNode(path="B.attn.inner.down", type_name="Linear", args=(hidden,), outputs=_record(4, 0.1))
    inner = CallNode(path="B.attn.inner", leaf=False, args=(hidden,), outputs=_record(8, 0.1), children=(inner_leaf,))
    parts = [CallNode(path=f"B.attn.{name}", type_name="Linear", args=(hidden,), outputs=_record(8)) for name in "qkv"]
    b_attn = CallNode(path="B.attn", leaf=False, args=(hidden,), outputs=_record(8, 0.7), children=(inner, *parts))
    b_root = CallNode(path="B", leaf=False, args=(hidden,), outputs=_record(8, 0.9), children=(b_attn,))
    unmatched_b = [inner, *parts]  # the container's own calls are paired elsewhere or carry no fitting output
    found = find_fused(a_root, b_root, [(a_root, b_root), (a_attn, b_attn)], [qkv], unmatched_b)
    assert [[part.path for part in match.parts] for match in found] == [["B.attn.q", "B.attn.k", "B.attn.v"]]


def _fused_per_group(parts: list[torch.Tensor], groups: int) -> torch.Tensor:
    """The parts laid out as ``groups`` groups of their chunks in order: [q0 k0 v0 q1 k1 v1 ...]."""
    chunks = [part.reshape(*part.shape[:-1], groups, -1) for part in parts]
    return torch.cat(chunks, dim=-1).flatten(-2)


def test_each_part_s_columns_are_found_in_any_grouping() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 32), torch.randn(2, 5, 16), torch.randn(2, 5, 16)  # grouped-query widths
    for groups in (1, 2, 4, 8):
        fused = _fused_per_group([q, k, v], groups)
        rotated = q[..., torch.randperm(32)]  # a port may hold a part's columns in another order (a rotary layout)
        layout = part_columns(fused, [rotated, k, v], rtol=1.3e-6, atol=1e-5)
        assert layout.groups == groups
        for part, columns in zip((q, k, v), layout.columns):
            assert torch.equal(fused.index_select(-1, columns), part)


def test_a_departing_part_does_not_hide_the_layout_of_the_others() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(3, 7, 24) for _ in range(3))
    fused = _fused_per_group([q, k, v], 4)
    layout = part_columns(fused, [q, k, v + 0.5], rtol=1.3e-6, atol=1e-5)
    assert layout.groups == 4
    assert torch.equal(fused.index_select(-1, layout.columns[0]), q)


@pytest.mark.parametrize("rows", [1, 6])
def test_parts_are_found_in_one_row_with_non_finite_values_and_in_another_order(rows: int) -> None:
    """A decode step of generate() has one row; a model hunting a NaN carries it in both traces; a port may run
    v before q."""
    torch.manual_seed(2)
    q, k, v = torch.randn(1, rows, 16), torch.randn(1, rows, 8), torch.randn(1, rows, 8)
    q[0, 0, 3], v[0, 0, 1] = math.nan, -math.inf
    fused = _fused_per_group([q, k, v], 4)
    layout = part_columns(fused, [v, k, q], rtol=1.3e-6, atol=1e-5)  # in the order the port ran them
    assert layout.groups == 4
    for part, columns in zip((v, k, q), layout.columns):
        assert torch.equal(fused.index_select(-1, columns).nan_to_num(), part.nan_to_num())
    assert layout.where(2) == "[..., 0:4 of each of 4 head groups]"


def test_a_layout_taught_elsewhere_keeps_two_swapped_parts_apart() -> None:
    """k's rows loaded as v's and v's as k's (grouped-query: the same width) agree with the fused output's columns in
    another order; the layout the same projection showed in another block sets each part against the columns its
    code treats as its own, the grouping included."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 5, 32), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    fused = _fused_per_group([q, k, v], 2)
    taught = part_columns(fused, [q, k, v], rtol=1.3e-6, atol=1e-5)
    found = part_columns(fused, [q, v, k], rtol=1.3e-6, atol=1e-5)
    assert taught.proven and found.proven and taught.key != found.key
    assert taught.groups == found.groups == 2
    imposed = taught.like([32, 16, 16], fused)
    assert imposed is not None and imposed.key == taught.key
    assert torch.equal(fused.index_select(-1, imposed.columns[1]), k)  # the part loaded as v: against k's columns
    assert taught.like([32, 32], fused) is None  # another projection's parts


def test_leaves_of_another_shape_pair_without_a_quadratic_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of unmatched leaves given the same input, each returning another shape than every leaf of the other
    trace: none pairs (none is the only one), and finding that out costs a few comparisons per leaf, not one per
    pair of leaves (a 10k-call trace would take minutes)."""

    def tensor(width: int, seed: float) -> TensorRecord:
        return TensorRecord(shape=(1, width), dtype="torch.float32", stats=Stats(seed, 1.0, -2.0, 2.0))

    def root(path: str, width: int) -> CallNode:
        leaves = tuple(
            CallNode(path=f"{path}.{prefix}{i}", type_name="Linear", args=(tensor(8, 0.0),), outputs=tensor(width, i))
            for i, prefix in ((i, "a" if width == 8 else "b") for i in range(300))
        )
        return CallNode(path=path, leaf=False, args=(tensor(8, 0.0),), outputs=tensor(8, width), children=leaves)

    a, b = list(root("A", 8).walk()), list(root("B", 9).walk())
    compared = 0
    close = align._Scorer.close

    def counted(self: align._Scorer, x: object, y: object) -> bool:
        nonlocal compared
        compared += 1
        return close(self, x, y)  # type: ignore[arg-type]

    monkeypatch.setattr(align._Scorer, "close", counted)
    found: dict[int, tuple[int, align.MatchKind]] = {0: (0, "path")}
    assert align._reshaping_leaves(found, a, b, (set(), set()), align.DEFAULT_TOLERANCE) == set()
    assert compared <= 4 * 300, compared


def test_the_statistics_of_parts_beyond_float64_s_squares_combine_without_overflow() -> None:
    """Parts whose means lie near 1e300 apart: their spread is infinite, never an OverflowError."""
    parts = [
        TensorRecord(shape=(1, 4), dtype="torch.float64", stats=Stats(mean=mean, std=0.0, min=mean, max=mean))
        for mean in (1e300, -1e300)
    ]
    whole = concatenated_record(parts)
    assert whole is not None and whole.stats is not None
    assert whole.stats.mean == 0.0 and whole.stats.std == math.inf
