"""graphtrace.check (issue 26): every module of a live port run alone on the original's own inputs.

On the independent ports (tests/independent_gpt2.py, tests/independent_llama.py) with two bugs in different layers,
one of them a 1.0001x departure under the tolerance element by element, the check names both and only them, where
the diff of the two traces names one. Faithful ports give no departure. Modules that cannot be run alone (a write
into the port's buffers, a random draw, an attribute set, a key/value cache) are reported with their reason, and
nothing of the port changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import graphtrace
from graphtrace.check import judge as judge_module
from graphtrace.check.judge import _where
from graphtrace.check.memo import APART, SAME, Known, alike, likeness
from graphtrace.check.views import view_between
from graphtrace.errors import InvalidOptionError
from tests import independent_gpt2, independent_llama
from tests.check_ports import SMALL, TWO_BUGS, scaled, tiny_pair, two_bug_port


@pytest.fixture(scope="module")
def token_ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def originals() -> dict[str, torch.nn.Module]:
    return {"llama": independent_llama.hf_llama(), "gpt2": independent_gpt2.hf_gpt2()}


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, originals: dict[str, torch.nn.Module], token_ids: torch.Tensor
) -> Callable[[str], Path]:
    """The original's trace with full values, captured once per architecture."""
    root = tmp_path_factory.mktemp("originals")

    def get(arch: str) -> Path:
        path = root / arch
        if not path.exists():
            graphtrace.capture(originals[arch], {"input_ids": token_ids}, path=path, values="bundle")
        return path

    return get


def _rules(arch: str) -> tuple[str, ...]:
    return independent_llama.RULES if arch == "llama" else independent_gpt2.RULES


def _named(report: graphtrace.check.CheckReport) -> list[str]:
    return [report.port_path(check.port) for check in report.departures]


# -- the views ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("original", "port", "described"),
    [
        ((2, 3, 4), (2, 3, 4), ""),
        ((1, 5, 4), (5, 4), "size-1 dims"),
        ((2, 5, 4), (5, 2, 4), "another order"),
        ((2, 5, 12), (2, 5, 3, 4), "last dim split"),
        ((2, 5, 3, 4), (2, 5, 12), "last dim split"),
    ],
)
def test_a_view_lays_the_values_out_both_ways(original: tuple[int, ...], port: tuple[int, ...], described: str) -> None:
    view = view_between(original, port)
    assert view is not None and described in view.description
    values = torch.arange(float(torch.Size(original).numel())).reshape(original)
    laid_out = view.to_port(values)
    assert tuple(laid_out.shape) == port
    assert torch.equal(view.to_original(laid_out), values)
    if described == "another order":  # the port's [T, B, D]: element [t, b, d] is the original's [b, t, d]
        assert torch.equal(laid_out[3, 1], values[1, 3])


@pytest.mark.parametrize(
    ("original", "port", "reorder"),
    [
        ((2, 4, 4), (4, 2, 4), True),  # two dims of one size: which is which is not certain
        ((2, 5, 4), (5, 2, 4), False),  # the model's own output is read as it is laid out
        ((2, 5, 4), (2, 5, 5), True),  # padding: no view here
        ((20,), (4, 5), True),  # a flattened tensor fits whatever has as many elements: no split
    ],
)
def test_no_view_where_the_shapes_leave_it_uncertain(original: Any, port: Any, reorder: bool) -> None:
    assert view_between(original, port, reorder=reorder) is None


# -- faithful ports and two bugs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "fused"), [("gpt2", False), ("llama", False), ("llama", True)])
def test_a_faithful_port_departs_nowhere(
    originals: dict[str, torch.nn.Module],
    traced: Callable[[str], Path],
    token_ids: torch.Tensor,
    arch: str,
    fused: bool,
) -> None:
    port = (
        independent_llama.port_of(originals[arch], fused=fused)
        if arch == "llama"
        else independent_gpt2.port_of(originals[arch])
    )
    for rules in ((), _rules(arch)):
        report = graphtrace.check(port, (token_ids,), traced(arch), rules=rules)
        assert report.equal and report.departures == () and report.to_json()["departures"] == []
        counts = report.counts()
        assert counts["checked"] >= 30 and counts["agree"] == counts["checked"]
        # every module judged was given the original's values for its floating inputs
        assert all(check.given for check in report.modules if check.verdict != "skipped")
    if fused:  # the fused wqkv is compared with q_proj's output alone: no view of a slice yet
        assert {why for why, _ in report.skip_reasons()} == {"its outputs could not be compared"}
        assert all("wqkv" in check.port.path for check in report.skipped)


@pytest.mark.parametrize(("arch", "bug", "culprit", "small"), TWO_BUGS)
def test_two_bugs_are_both_named_where_the_diff_names_one(
    originals: dict[str, torch.nn.Module],
    traced: Callable[[str], Path],
    token_ids: torch.Tensor,
    tmp_path: Path,
    arch: str,
    bug: str,
    culprit: str,
    small: str,
) -> None:
    port = two_bug_port(originals[arch], arch, bug, small)
    graphtrace.capture(port, (token_ids,), path=tmp_path / "port", values="bundle")
    for rules in ((), _rules(arch)):
        diffed = graphtrace.compare(traced(arch), tmp_path / "port", rules=rules)
        report = graphtrace.check(port, (token_ids,), traced(arch), rules=rules)
        assert _named(report) == [small, culprit], report.table()
        found = diffed.first_divergence
        assert found is not None and found.b.path.partition(".")[2] in (small, culprit)
        listed = {departure["port"] for departure in report.to_json()["departures"]}
        assert listed == {small, culprit}
    # the notebook view is the diff's, of the local verdicts: the first departure named
    assert f"{type(port).__name__}.{small}@0" in report._repr_html_()
    # the small departure lies within tolerance element by element: only the lean of its differences shows it
    (first, _) = report.departures
    assert first.worst is not None and first.worst.outside == 0 and "lean one way" in first.worst.reason


def _every_block(path: str, blocks: int = 3) -> list[str]:
    """``path`` in each block (``layers.0.attention`` -> ``layers.0/1/2.attention``): a bug in every block."""
    head, number, tail = path.split(".", 2)
    return [f"{head}.{k}.{tail}" for k in range(blocks)]


# each single bug of the diff's cases (tests/independent_cases.py): every module whose own code departs
SINGLE_BUGS = [
    ("llama", "rope_base", False, _every_block("layers.0.attention")),  # the rotary table every attention is given
    ("llama", "scale_1_over_d", True, _every_block("layers.0.attention")),
    ("llama", "unpermuted_qk", False, ["layers.2.attention"]),
    ("llama", "eps", True, ["layers.2.attention_norm"]),
    ("llama", "gate_up_swapped", False, ["layers.2.feed_forward.w1", "layers.2.feed_forward.w3"]),
    ("llama", "wrong_norm", True, ["layers.2"]),
    ("llama", "bf16_attention", False, _every_block("layers.0.attention")),
    ("gpt2", "exact_gelu", False, _every_block("h.0.mlp.gelu")),
    ("gpt2", "scale_1_over_d", False, _every_block("h.0.attn")),
    ("gpt2", "post_norm", False, ["h.2"]),
    ("gpt2", "bf16_activation", False, ["h.2.mlp"]),
    ("gpt2", "eps", False, ["h.2.ln2"]),
    ("gpt2", "bf16_attention", False, _every_block("h.0.attn")),
]


@pytest.mark.parametrize(("arch", "bug", "fused", "named"), SINGLE_BUGS)
def test_each_bug_is_named_in_every_module_it_lives_in(
    originals: dict[str, torch.nn.Module],
    traced: Callable[[str], Path],
    token_ids: torch.Tensor,
    arch: str,
    bug: str,
    fused: bool,
    named: list[str],
) -> None:
    if arch == "llama":
        port = independent_llama.port_of(originals[arch], fused=fused, bug=bug)
    else:
        port = independent_gpt2.port_of(originals[arch], bug=bug)
    report = graphtrace.check(port, (token_ids,), traced(arch), rules=_rules(arch))
    assert _named(report) == named, report.table()


def test_the_small_departure_alone_is_named_at_its_source(
    originals: dict[str, torch.nn.Module], traced: Callable[[str], Path], token_ids: torch.Tensor
) -> None:
    port = independent_gpt2.port_of(originals["gpt2"])
    scaled(port.h[1].attn.out, SMALL)
    report = graphtrace.check(port, (token_ids,), traced("gpt2"))
    assert _named(report) == ["h.1.attn.out"]
    (departure,) = report.to_json()["departures"]
    assert departure["original"] == "transformer.h.1.attn.c_proj" and departure["port_call"] == "GPT.h.1.attn.out@0"
    assert departure["outside"] == 0 and departure["max_abs"] > 0 and len(departure["where"]) == 3


def test_a_departure_explained_by_a_module_inside_is_not_its_own(
    originals: dict[str, torch.nn.Module], traced: Callable[[str], Path], token_ids: torch.Tensor
) -> None:
    report = graphtrace.check(independent_gpt2.port_of(originals["gpt2"], bug="eps"), (token_ids,), traced("gpt2"))
    verdicts = {report.port_path(check.port): check for check in report.modules}
    assert verdicts["h.2.ln2"].own
    block = verdicts["h.2"]
    assert block.verdict == "departs" and not block.own and block.explained_by == ("GPT.h.2.ln2@0",)
    assert verdicts["h.1"].verdict == "agrees"


def test_a_block_that_calls_the_wrong_module_is_named_not_the_module(
    originals: dict[str, torch.nn.Module], traced: Callable[[str], Path], token_ids: torch.Tensor
) -> None:
    port = independent_llama.port_of(originals["llama"], fused=True, bug="wrong_norm")
    report = graphtrace.check(port, (token_ids,), traced("llama"))
    assert _named(report) == ["layers.2"]
    (block,) = report.departures
    (picked,) = report.port_calls(block.picked)
    assert picked.id == "Transformer.layers.2.attention_norm@1"
    assert (
        "it calls layers.2.attention_norm where the original calls model.layers.2.post_attention_layernorm"
        in report.table()
    )


def test_a_live_original_is_captured_for_the_check(
    originals: dict[str, torch.nn.Module], token_ids: torch.Tensor
) -> None:
    port = independent_gpt2.port_of(originals["gpt2"], bug="eps")
    report = graphtrace.check(port, (token_ids,), (originals["gpt2"], {"input_ids": token_ids}))
    assert _named(report) == ["h.2.ln2"]
    assert report.original_label == "GPT2LMHeadModel (captured for the check)"
    assert report.original.directory is None  # its temporary directory went with the check: none is named


# -- modules that cannot be run alone, and the port left as it was -------------------------------------------------


def _state(model: torch.nn.Module) -> dict[str, Any]:
    """Everything of a model the check must leave as it was."""
    return {
        "tensors": {name: value.clone() for name, value in model.state_dict().items()},
        "attributes": {name: dict(vars(module)) for name, module in model.named_modules()},
        "rng": torch.random.get_rng_state(),
        "grad": torch.is_grad_enabled(),
    }


def _same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before["tensors"].keys() == after["tensors"].keys()
    for name, value in before["tensors"].items():
        assert torch.equal(value, after["tensors"][name]), name
    for name, attributes in before["attributes"].items():
        now = after["attributes"][name]
        assert now.keys() == attributes.keys(), name  # no forward left behind as an instance attribute
        assert all(now[key] is value for key, value in attributes.items()), name
    assert torch.equal(before["rng"], after["rng"]) and before["grad"] == after["grad"]


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ("cache", "it writes in place into a tensor it did not create"),
        ("counter", "it sets attributes of the port"),
        ("dropout", "it draws random numbers"),
    ],
)
def test_a_module_that_cannot_be_run_alone_is_reported_and_the_port_left_as_it_was(
    tmp_path: Path, state: str, why: str
) -> None:
    original, port, x = tiny_pair((None, state, None))
    scaled(port.blocks[0].proj, 1.01)  # a bug upstream: block 1 is given other inputs than in the port's own run
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    with torch.no_grad():  # the port's own forward changes its state: the check changes nothing more
        port(x)
    before = _state(port)
    report = graphtrace.check(port, (x,), tmp_path / "original")
    _same_state(before, _state(port))
    skipped = {report.port_path(check.port): check for check in report.skipped}
    assert list(skipped) == ["blocks.1"] and skipped["blocks.1"].why == why
    assert skipped["blocks.1"].reason.startswith("it ")
    assert report.to_json()["skipped"] == [
        {"why": why, "modules": [{**report.to_json()["skipped"][0]["modules"][0], "port": "blocks.1"}]}
    ]
    verdicts = {report.port_path(check.port): check.verdict for check in report.modules}
    assert verdicts["blocks.1.proj"] == verdicts["blocks.2"] == "agrees"
    assert _named(report) == ["blocks.0.proj"]
    # the model's own output departs, explained by blocks.0 (by its proj); blocks.1 was not judged inside it
    (model,) = [check for check in report.modules if check.port.path == "Tiny"]
    assert model.explained_by == ("Tiny.blocks.0@0",) and model.unchecked_inside == ("Tiny.blocks.1@0",)


def test_a_module_given_its_own_inputs_is_not_run_again(tmp_path: Path) -> None:
    original, port, x = tiny_pair((None, "dropout", None))
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    report = graphtrace.check(port, (x,), tmp_path / "original")
    # blocks.1 is given the port's own input bit for bit: its own output, drawn in the port's forward, is judged
    assert _named(report) == ["blocks.1"] and report.departures[0].reused
    reused = [report.port_path(check.port) for check in report.modules if check.reused]
    assert reused == ["blocks.0.norm", "blocks.0.proj", "blocks.0", "blocks.1.norm", "blocks.1.proj", "blocks.1", ""]


def test_hooks_count_as_the_caller_sees_them(tmp_path: Path) -> None:
    """A module's forward hook and pre-hook are part of what its caller gives and gets, as capture records it: a
    faithful port with the same hooks departs nowhere, and a hook only the port has is named at its module."""

    def doubled(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * 2

    def halved(module: torch.nn.Module, args: Any) -> tuple[torch.Tensor, ...]:
        return tuple(arg * 0.5 for arg in args)

    original, port, x = tiny_pair((None, None, None))
    for model in (original, port):
        model.blocks[0].proj.register_forward_hook(doubled)
        model.blocks[1].register_forward_pre_hook(halved)
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    assert _named(graphtrace.check(port, (x,), tmp_path / "original")) == []
    port.blocks[2].proj.register_forward_hook(doubled)
    report = graphtrace.check(port, (x,), tmp_path / "original")
    assert _named(report) == ["blocks.2.proj"]
    assert repr(report).endswith("modules judged, 1 depart: blocks.2.proj)") and len(repr(report)) < 200


def test_a_block_run_alone_is_answered_by_what_its_modules_returned_on_the_same_inputs(tmp_path: Path) -> None:
    original, port, x = tiny_pair((None, None, None))
    scaled(port.blocks[0].proj, 1.01)  # block 1 and its modules run alone on other inputs than the port's own
    runs: list[torch.Tensor] = []
    counted = port.blocks[1].proj
    kind = type(counted)

    def forward(self: torch.nn.Module, tensor: torch.Tensor) -> torch.Tensor:
        runs.append(tensor)
        return kind.forward(self, tensor)

    counted.__class__ = type(kind.__name__, (kind,), {"forward": forward})
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    runs.clear()
    report = graphtrace.check(port, (x,), tmp_path / "original")
    # the port's own forward, then proj run alone; block 1 run alone gives proj that same input: answered
    assert len(runs) == 2 and not torch.equal(runs[0], runs[1])
    verdicts = {report.port_path(check.port): check for check in report.modules}
    assert verdicts["blocks.1"].verdict == verdicts["blocks.1.proj"].verdict == "agrees"
    assert not verdicts["blocks.1"].reused and _named(report) == ["blocks.0.proj"]


def test_a_known_run_answers_only_the_same_arguments_still_intact() -> None:
    known = Known()
    given, output = torch.ones(3), torch.zeros(2)
    known.add("M.layer@0", (given,), {"flag": True}, output)
    found, answer = known.output("M.layer@0", (torch.ones(3),), {"flag": True})
    assert found and torch.equal(answer, output) and answer is not output  # a copy: the caller may write into it
    assert known.output("M.layer@0", (torch.ones(3),), {"flag": False}) == (False, None)
    assert known.output("M.layer@0", (torch.ones(3) * 2,), {"flag": True}) == (False, None)
    assert known.output("M.layer@1", (torch.ones(3),), {"flag": True}) == (False, None)
    nan = torch.tensor([float("nan"), 1.0])
    known.add("M.nan@0", (nan,), {}, output)
    assert known.output("M.nan@0", (torch.tensor([float("nan"), 1.0]),), {})[0]  # NaN where both hold it
    given.add_(1)  # changed in place since: what the run was given is gone
    assert known.output("M.layer@0", (given,), {"flag": True}) == (False, None)


def test_a_known_run_answers_arguments_equal_up_to_rounding_until_told_to_be_exact() -> None:
    known = Known()
    given, output = torch.randn(64, generator=torch.Generator().manual_seed(0)), torch.zeros(2)
    known.add("M.layer@0", (given,), {}, output)
    unit = float(given.abs().max()) * torch.finfo(given.dtype).eps
    rounded = given + unit * torch.tensor([(-1.0) ** k for k in range(64)])  # a unit in the last place apart
    assert known.output("M.layer@0", (rounded,), {})[0] and known.approximations == 1
    assert known.output("M.layer@0", (given.clone(),), {})[0] and known.approximations == 1  # identical: exact
    assert known.output("M.layer@0", (given * 1.0001,), {}) == (False, None)  # a departure is not rounding
    known.add("M.block@0", (given,), {}, output, approximate=True)  # made through an approximate answer
    assert known.output("M.block@0", (given.clone(),), {})[0] and known.approximations == 2
    with known.exactly():
        assert known.output("M.layer@0", (rounded,), {}) == (False, None)
        assert known.output("M.block@0", (given.clone(),), {}) == (False, None)
        assert known.output("M.layer@0", (given.clone(),), {})[0]
    assert known.tolerant


def test_alike_is_what_the_measure_would_call_equal_with_margin() -> None:
    b = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    noise = torch.randint(0, 2, b.shape, generator=torch.Generator().manual_seed(1)).bool()
    rounded = torch.where(noise, b.nextafter(b + 1), b.nextafter(b - 1))  # a unit in the last place, either way
    assert alike(rounded, b)
    assert not alike(b * 1.0000005, b)  # within half the tolerance, but leaning: a scaling
    assert not alike(b + 3e-6, b)  # within half the tolerance, but leaning: an offset
    assert not alike(b + 1e-5 * torch.randn(b.shape, generator=torch.Generator().manual_seed(2)), b)  # beyond it
    overflowed = b.clone()
    overflowed[7] = math.inf
    assert not alike(b, overflowed) and not alike(overflowed, b)  # an infinity on either side is not rounding
    eight = b[:64].to(torch.float8_e4m3fn)
    assert alike(eight, eight.clone()) and not alike(eight, (b[:64] * 2).to(torch.float8_e4m3fn))
    eight[3] = math.nan  # NaN: bit for bit only, in a dtype torch cannot sum
    assert alike(eight, eight.clone()) and not alike(eight, (b[:64] * 2).to(torch.float8_e4m3fn))
    held = b.clone()
    held[5], held[9] = math.nan, math.inf  # among the first elements, which are read before the rest
    assert likeness(held, held.clone()) == SAME  # the same NaN and infinity on both sides: the same bits
    moved = held.clone()
    moved[20] += 1.0
    assert likeness(held, moved) == APART


def test_a_known_run_made_exactly_answers_before_one_made_through_an_approximation() -> None:
    known = Known()
    given = torch.randn(64, generator=torch.Generator().manual_seed(0))
    known.add("M.layer@0", (given,), {}, torch.zeros(1), approximate=True)
    known.add("M.layer@0", (given.clone(),), {}, torch.ones(1))
    found, answer = known.output("M.layer@0", (given.clone(),), {})
    assert found and torch.equal(answer, torch.ones(1)) and known.approximations == 0


def test_a_faithful_port_is_judged_on_its_own_outputs_where_its_inputs_differ_by_rounding_only(
    originals: dict[str, torch.nn.Module], traced: Callable[[str], Path], token_ids: torch.Tensor
) -> None:
    """Two faithful implementations hand each other values a few units in the last place apart: every module is
    judged on what it returned in the port's own forward, and no module runs again (the check costs a capture)."""
    port = independent_gpt2.port_of(originals["gpt2"])
    runs = []
    for module in port.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(lambda module, args: runs.append(module))
    report = graphtrace.check(port, (token_ids,), traced("gpt2"))
    linears = sum(isinstance(module, torch.nn.Linear) for module in port.modules())
    assert report.equal and len(runs) == linears  # the port's own forward only
    counts = report.counts()
    assert counts["reused"] == counts["checked"] >= 30
    rounded = [check for check in report.modules if check.worst is not None and (check.worst.max_abs or 0) > 0]
    assert rounded  # values that differ by rounding: bit for bit, they would all have run alone again


class _Rounding(torch.nn.Module):
    """Hands its input on: unchanged, or rounded once through a product and a quotient."""

    def __init__(self, exact: bool) -> None:
        super().__init__()
        self.exact = exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0 if self.exact else x * 3.0 / 3.0


class _Amplifying(torch.nn.Module):
    """How far its input lies from a fixed value, a million times: rounding in its input becomes a departure."""

    def __init__(self, centre: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("centre", centre)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.centre) * 1e6


class _Chain(torch.nn.Module):
    def __init__(self, exact: bool, centre: torch.Tensor) -> None:
        super().__init__()
        self.first, self.amplify = _Rounding(exact), _Amplifying(centre)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.amplify(self.first(x))


class _Projecting(torch.nn.Module):
    """Its output is its projection's: the same tensor, judged once as the projection's and once as the model's."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def test_the_model_s_own_output_is_not_excused_by_the_re_ordering_its_projection_is() -> None:
    """A projection whose output columns are re-ordered agrees (its caller may read them in that order), but the model
    returning that very tensor departs: the model's own output is read as it is laid out. One measurement serves both
    only when it found no re-ordering."""
    generator = torch.Generator().manual_seed(0)
    weight, x = torch.randn(16, 8, generator=generator), torch.randn(1, 6, 8, generator=generator)
    original = _Projecting(weight).eval()
    report = graphtrace.check(
        _Projecting(weight[torch.randperm(16, generator=generator)]).eval(), (x,), (original, (x,))
    )
    verdicts = {report.port_path(check.port): check for check in report.modules}
    assert verdicts["proj"].verdict == "agrees" and "permutation" in verdicts["proj"].outputs[0].equivalence
    assert verdicts[""].verdict == "departs"
    faithful = graphtrace.check(_Projecting(weight).eval(), (x,), (original, (x,)))
    assert faithful.equal and len(faithful.modules) == 2


def test_a_departure_found_through_rounding_is_judged_again_on_the_original_s_own_values(tmp_path: Path) -> None:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    original, port = _Chain(True, x.clone()).eval(), _Chain(False, x.clone()).eval()
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    assert not torch.equal(port.first(x), x)  # the port's own input to amplify is the original's up to rounding
    report = graphtrace.check(port, (x,), tmp_path / "original")
    verdicts = {report.port_path(check.port): check for check in report.modules}
    # its own output departs (rounding times a million); run alone on the original's input, it agrees
    assert verdicts["amplify"].verdict == "agrees" and not verdicts["amplify"].reused
    assert verdicts["first"].verdict == "agrees" and verdicts["first"].reused


class _Marked(torch.nn.Module):
    """Hands its input on (unchanged, or rounded once) with a column of NaN after it: a tensor with a NaN is matched
    bit for bit only, so whatever is given it runs alone."""

    def __init__(self, exact: bool) -> None:
        super().__init__()
        self.rounding = _Rounding(exact)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rounding(x)
        return torch.cat([y, torch.full_like(y[:, :1], float("nan"))], dim=1)


class _Head(torch.nn.Module):
    def __init__(self, centre: torch.Tensor) -> None:
        super().__init__()
        self.first, self.amplify = _Rounding(True), _Amplifying(centre)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.amplify(self.first(h[:, :-1]))


class _Marking(torch.nn.Module):
    def __init__(self, exact: bool, centre: torch.Tensor) -> None:
        super().__init__()
        self.marked, self.head = _Marked(exact), _Head(centre)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.marked(x))


def test_a_container_that_departs_through_an_answer_given_up_to_rounding_is_judged_again(tmp_path: Path) -> None:
    """``head`` runs alone (its input holds a NaN); inside, ``first`` is answered from the port's own run, whose
    input was the original's up to rounding, and ``amplify`` from its own run on that: rounding times a million.
    Judged again on identical values only, ``head`` agrees."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    original, port = _Marking(True, x.clone()).eval(), _Marking(False, x.clone()).eval()
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    report = graphtrace.check(port, (x,), tmp_path / "original")
    verdicts = {report.port_path(check.port): check for check in report.modules}
    assert verdicts["head"].verdict == "agrees" and not verdicts["head"].reused
    assert verdicts["head.amplify"].verdict == verdicts["marked"].verdict == "agrees"


class _Handing(torch.nn.Module):
    """Hands its input to ``child``: as it is, times ``factor``, or with ``offset`` added to elements under 10."""

    def __init__(self, factor: float = 1.0, offset: float = 0.0) -> None:
        super().__init__()
        self.child, self.factor, self.offset = torch.nn.Linear(64, 64), factor, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.child(x * self.factor + self.offset * (x.abs() < 10).to(x.dtype))


class _Handed(torch.nn.Module):
    def __init__(self, scale: float = 1.0, **handing: float) -> None:
        super().__init__()
        self.block, self.scale = _Handing(**handing), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x * self.scale)


@pytest.mark.parametrize(
    ("dtype", "handing", "outlier"),
    [
        (torch.bfloat16, {"factor": 1.2}, False),  # 32 units of bfloat16 would be a quarter of a value
        (torch.float16, {"factor": 1.01}, False),
        (torch.float32, {"offset": 0.002}, True),  # one element of 3000 must not set the scale of the others
    ],
)
def test_what_a_block_hands_its_module_wrong_is_never_taken_for_rounding(
    tmp_path: Path, dtype: torch.dtype, handing: dict[str, float], outlier: bool
) -> None:
    torch.manual_seed(0)
    original = _Handed().to(dtype).eval()
    port = _Handed(scale=1.5, **handing).to(dtype).eval()  # a departure before the block: it runs alone
    port.load_state_dict(original.state_dict())
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    if outlier:
        x[0, 0] = 3000.0
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="safetensors")
    report = graphtrace.check(port, (x,), tmp_path / "original")
    assert "block" in _named(report)


def test_the_port_keeps_its_forwards_also_when_its_forward_raises(tmp_path: Path) -> None:
    original, port, x = tiny_pair((None, None, None))
    graphtrace.capture(original, (x,), path=tmp_path / "original", values="bundle")
    wrong = torch.ones(1, 3, 5)  # the wrong width: the port's Linear raises
    before = _state(port)
    with pytest.raises(RuntimeError):
        graphtrace.check(port, (wrong,), tmp_path / "original")
    _same_state(before, _state(port))


def test_a_key_value_cache_keeps_a_module_from_being_run_alone(
    originals: dict[str, torch.nn.Module], traced: Callable[[str], Path], token_ids: torch.Tensor
) -> None:
    model = originals["gpt2"]  # the original checked against its own trace
    report = graphtrace.check(model, {"input_ids": token_ids}, traced("gpt2"))
    assert report.equal
    skipped = {why for why, _ in report.skip_reasons()}
    assert "it is given a key/value cache" in skipped
    assert all("use_cache=False" in check.reason for check in report.skipped)
    without = graphtrace.check(model, {"input_ids": token_ids, "use_cache": False}, traced("gpt2"))
    assert without.equal and without.skipped == () and without.counts()["checked"] == len(without.modules)


# -- bad input ----------------------------------------------------------------------------------------------------


def test_a_trace_without_full_values_is_refused_with_the_remedy(
    originals: dict[str, torch.nn.Module], token_ids: torch.Tensor, tmp_path: Path
) -> None:
    graphtrace.capture(originals["gpt2"], {"input_ids": token_ids}, path=tmp_path / "repr")
    port = independent_gpt2.port_of(originals["gpt2"])
    with pytest.raises(InvalidOptionError, match="values='bundle' or 'safetensors'"):
        graphtrace.check(port, (token_ids,), tmp_path / "repr")
    with pytest.raises(InvalidOptionError, match="reference must be"):
        graphtrace.check(port, (token_ids,), 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="rtol must be a finite number"):
        graphtrace.check(port, (token_ids,), tmp_path / "repr", rtol=-1.0)


def test_the_worked_example_of_the_docs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpy

    root = Path(__file__).resolve().parent.parent
    example = runpy.run_path(str(root / "examples" / "check_port.py"))
    monkeypatch.chdir(tmp_path)
    assert example["main"](Path("ex")) == 1
    out = capsys.readouterr().out
    first, table = out.split("\n\n", 1)
    assert first == "the diff names the first departure only: LlamaForCausalLM.model.layers.0.input_layernorm"
    docs = (root / "docs" / "check.md").read_text()
    shown = docs.split("# the same check from the shell\n```\n\n```\n")[1].split("```")[0]
    assert shown.splitlines() == table.rstrip("\n").splitlines()  # the docs show the example's real output


def test_tensors_whose_operators_communicate_are_never_compared_by_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DTensor's comparison all-reduces over its mesh, outside the replay guard too: the check never compares one
    (a module handed one runs alone, where the guard refuses it with its reason), so it never issues a collective
    the other ranks would not join."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(probe.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        sharded = distribute_tensor(torch.randn(4, 8), init_device_mesh("cpu", (1,)), [Replicate()])
        collectives: list[str] = []
        real = dist.all_reduce
        monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: collectives.append("all_reduce") or real(*a, **k))
        assert likeness(sharded, sharded.clone()) == APART and not collectives
        torch.equal(sharded, sharded.clone())  # what the check never does: it communicates
        assert collectives
    finally:
        dist.destroy_process_group()


def test_the_model_s_own_output_is_measured_once_when_its_projection_returned_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same tensor, a projection's output and the model's, differing from the original's by rounding: measured
    once, allowing re-orderings for the projection; that found none, so the model's own reading is the same."""
    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(16, 8, generator=generator), torch.randn(1, 6, 8, generator=generator)
    measured: list[tuple[int, ...]] = []
    real = judge_module.measure

    def counting(*args: Any, **kwargs: Any) -> Any:
        measured.append(tuple(args[3].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(judge_module, "measure", counting)
    port = _Projecting(weight.nextafter(weight * 2)).eval()  # a unit in the last place: outputs differ by rounding
    report = graphtrace.check(port, (x,), (_Projecting(weight).eval(), (x,)))
    assert report.equal and len(report.modules) == 2 and measured == [(1, 6, 16)]


def test_where_a_departure_is_largest_counts_a_non_finite_value_on_one_side_and_takes_the_first_of_ties() -> None:
    original = torch.zeros(2, 3)
    port = original.clone()
    port[0, 1] = port[1, 2] = 1.0
    assert _where(original, port) == (0, 1)  # ties: the first
    port[1, 0] = math.nan
    assert _where(original, port) == (1, 0)  # NaN on one side only: infinitely far
    original[1, 0] = math.nan
    port[1, 1] = -math.inf
    assert _where(original, port) == (1, 1)  # NaN on both sides is the same; an infinity on one side is not
    eight = torch.zeros(2, 3, dtype=torch.float8_e4m3fn)
    assert _where(eight, torch.ones(2, 3).tril().to(torch.float8_e4m3fn)) == (0, 0)  # read in float32
