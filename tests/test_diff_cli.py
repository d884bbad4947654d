"""`graphtrace diff A B` as a user runs it: exit codes, the table, --json, --map; the table through rich: colour
only for a terminal (none with NO_COLOR), the same lines plain, never wrapped or cut."""

from __future__ import annotations

import io
import json
import re
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.cli.diff import console
from graphtrace.compare import Comparison
from graphtrace.compare.text import report_text
from tests.conftest import run_cli
from tests.gpt2_port import GPT2_RULES, port_of
from tests.zoo import gpt2, llama

ANSI = "\033["
ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def llamas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """original/ and changed/ (one weight of layer 1's input norm perturbed) with statistics only, so that the
    command needs no torch and starts fast; original-values/ and changed-values/ with safetensors values."""
    root = tmp_path_factory.mktemp("llamas")
    model, inputs = llama()
    graphtrace.capture(model, inputs, path=root / "original", values="none")
    graphtrace.capture(model, inputs, path=root / "original-values", values="safetensors")
    with torch.no_grad():
        model.model.layers[1].input_layernorm.weight[0] += 1.0
    graphtrace.capture(model, inputs, path=root / "changed", values="none")
    graphtrace.capture(model, inputs, path=root / "changed-values", values="safetensors")
    return root


def test_equal_traces_exit_0(llamas: Path) -> None:
    result = run_cli("diff", "original", "original", cwd=llamas)
    assert result.returncode == 0, result.stderr
    assert "EQUAL: all 45 matched calls agree within tolerance" in result.stdout
    assert "✓  … 45 calls agree" in result.stdout and ANSI not in result.stdout


def test_diverging_traces_exit_1_and_name_the_first_divergence(llamas: Path) -> None:
    result = run_cli("diff", "original", "changed", cwd=llamas)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert (
        "first divergence: model.layers.1.input_layernorm (LlamaRMSNorm): its inputs agree, its output does not" in out
    )
    row = next(line for line in out.splitlines() if line.endswith("◀ first divergence"))
    assert row.startswith("✗  model.layers.1.input_layernorm") and " stats " in row
    assert ANSI not in out  # piped: plain text
    # folded: the agreeing calls before it are one line, and the long tail is summed up
    assert "✓  … 15 calls agree" in out and "more calls" in out and "--all lists every call" in out
    everything = run_cli("diff", "original", "changed", "--all", cwd=llamas)
    assert everything.returncode == 1 and "calls agree" not in everything.stdout
    assert sum(line.startswith(("✓", "✗", "!", "·")) for line in everything.stdout.splitlines()) == 45


def test_json_report(llamas: Path) -> None:
    args = ("original-values", "changed-values", "--json", "--atol", "1e-4", "--rtol", "0")
    result = run_cli("diff", *args, cwd=llamas)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["first_divergence"]["a"] == "LlamaForCausalLM.model.layers.1.input_layernorm@0"
    assert report["tolerance"] == {"rtol": 0.0, "atol": 1e-4}
    assert report["a"] == {"trace": "original-values", "model_class": "LlamaForCausalLM", "steps": 1, "calls": 45}
    assert all(d["rtol"] == 0.0 and d["atol"] == 1e-4 for c in report["calls"] for d in c["outputs"])
    first = next(c for c in report["calls"] if c["a"] == report["first_divergence"]["a"])
    assert first["outputs"][0]["basis"] == "values" and first["outputs"][0]["outside"] == 7  # one feature, 7 tokens


def test_port_with_rules_and_by_structure(tmp_path: Path) -> None:
    model, inputs = gpt2()  # statistics only: the comparison needs no torch, the command starts fast
    graphtrace.capture(model, inputs, path=tmp_path / "gpt2", values="none")
    graphtrace.capture(port_of(model), inputs, path=tmp_path / "port", values="none")
    maps = [arg for rule in GPT2_RULES for arg in ("--map", rule)]
    by_rule = run_cli("diff", "gpt2", "port", *maps, "--align", "path", cwd=tmp_path)
    assert by_rule.returncode == 0, by_rule.stdout + by_rule.stderr
    assert "matched 35 calls (1 by path, 34 by rule); only in A: 8, only in B: 0" in by_rule.stdout
    strict = run_cli("diff", "gpt2", "port", "--all", "--strict", cwd=tmp_path)
    assert strict.returncode == 1 and "34 by structure" in strict.stdout
    assert re.search(
        r"^✓  transformer\.h\.2\.mlp\.c_proj ↔ blocks\.2\.ffn\.down +structure +\[1, 7, 32\] +stats ",
        strict.stdout,
        re.M,
    )
    assert "only in A (8): transformer, transformer.drop, transformer.h.0.attn.resid_dropout" in strict.stdout
    assert "DIVERGED: the calls match but some have no counterpart (strict)" in strict.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["original", "nowhere"], "error: no trace at 'nowhere'"),
        (["original", "changed", "--map", "h.{i}=layers.{j}"], "uses {j}, which its left side does not define"),
        (["original", "changed", "--map", "layers.{i}=blocks"], "Its {i} is not used on the right side: carry it over"),
        (["original", "changed", "--atol", "-1"], "atol must be a finite number >= 0"),
        (["original", "changed", "--step", "3"], "step 3 does not exist in trace A"),
    ],
)
def test_bad_input_exits_2(llamas: Path, args: list[str], message: str) -> None:
    result = run_cli("diff", *args, cwd=llamas)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _printed(comparison: Comparison, stream: io.StringIO) -> str:
    """What the CLI prints for ``comparison`` on ``stream``."""
    console(stream).print(report_text(comparison))
    return stream.getvalue()


@pytest.fixture
def terminal_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No colour setting inherited from the shell that runs the tests; a terminal that knows colours."""
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "COLORTERM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    return monkeypatch


def test_colour_only_for_a_terminal(terminal_environment: pytest.MonkeyPatch, llamas: Path) -> None:
    result = graphtrace.compare(llamas / "original", llamas / "changed")
    on_terminal = _printed(result, Terminal())
    assert "\033[1;31m✗  model.layers.1.input_layernorm" in on_terminal  # the first divergence: bold red
    piped = _printed(result, io.StringIO())
    assert ANSI not in piped and piped == result.table() + "\n"
    assert ESCAPE.sub("", on_terminal) == piped


def test_no_color_leaves_no_escape_code_on_a_terminal(terminal_environment: pytest.MonkeyPatch, llamas: Path) -> None:
    result = graphtrace.compare(llamas / "original", llamas / "changed")
    terminal_environment.setenv("NO_COLOR", "1")
    printed = _printed(result, Terminal())
    assert ANSI not in printed  # no colour, and no bold or dim either
    assert printed == _printed(result, io.StringIO())
    forced = run_cli("diff", "original", "changed", cwd=llamas, FORCE_COLOR="1", NO_COLOR="1")
    assert forced.returncode == 1 and ANSI not in forced.stdout
    assert forced.stdout == run_cli("diff", "original", "changed", cwd=llamas).stdout


def test_table_with_color_is_styled_whatever_the_environment(
    terminal_environment: pytest.MonkeyPatch, llamas: Path
) -> None:
    terminal_environment.setenv("NO_COLOR", "1")  # the caller of table() decides, not the environment
    result = graphtrace.compare(llamas / "original", llamas / "changed")
    coloured = result.table(color=True).splitlines()
    assert coloured[5].startswith("\033[1m   call (in the order calls returned)")  # the header: bold
    assert coloured[6] == "\033[2m✓  … 15 calls agree\033[0m"  # a fold: dim
    assert coloured[7].startswith("\033[1;31m✗  model.layers.1.input_layernorm")
    assert coloured[7].endswith("◀ first divergence\033[0m")  # the first divergence: bold red
    assert coloured[8].startswith("\033[31m✗  ") and coloured[-1].startswith("\033[1;31mDIVERGED: ")
    plain = result.table()
    assert ANSI not in plain and plain == str(result)


@pytest.mark.parametrize("show_all", [False, True])
def test_plain_text_is_the_coloured_text_without_its_escape_codes(llamas: Path, show_all: bool) -> None:
    for a, b in (("original", "changed"), ("original-values", "changed-values"), ("original", "original")):
        result = graphtrace.compare(llamas / a, llamas / b)
        coloured = result.table(color=True, show_all=show_all)
        assert ESCAPE.search(coloured)
        assert ESCAPE.sub("", coloured) == result.table(show_all=show_all)
    args = ("diff", "original", "changed", *(["--all"] if show_all else []))
    on_terminal = run_cli(*args, cwd=llamas, FORCE_COLOR="1")  # rich treats FORCE_COLOR as a terminal
    assert on_terminal.returncode == 1 and ESCAPE.search(on_terminal.stdout)
    assert ESCAPE.sub("", on_terminal.stdout) == run_cli(*args, cwd=llamas).stdout


NAMES = (
    "encoder_stack_with_a_rather_long_and_descriptive_name",
    "transformer_block_number_zero_of_a_great_many",
    "attention_mechanism_holding_its_projection_layers",
    "output_projection_after_all_the_attention_heads",
)
LONG_PATH = ".".join(NAMES)  # 200 characters: far wider than the table's other rows, and than a terminal


def _nested(changed: bool) -> nn.Module:
    torch.manual_seed(0)
    model: nn.Module = nn.Linear(4, 4)
    if changed:
        with torch.no_grad():
            model.weight[0, 0] += 1.0
    for name in reversed(NAMES):
        model = nn.Sequential(OrderedDict([(name, model)]))
    return model


def test_a_long_module_path_is_neither_wrapped_nor_cut(tmp_path: Path) -> None:
    inputs = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    graphtrace.capture(_nested(False), inputs, path=tmp_path / "a", values="none")
    graphtrace.capture(_nested(True), inputs, path=tmp_path / "b", values="none")
    row = re.compile(rf"^✗  {re.escape(LONG_PATH)}  +path  +\[2, 4\]  +stats  +\S+ .*◀ first divergence$", re.M)
    verdict = f"first divergence: {LONG_PATH} (Linear): its inputs agree, its output does not"
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert row.search(result.table()) and verdict in result.table().splitlines()
    assert row.search(ESCAPE.sub("", result.table(color=True)))
    # a terminal 40 columns wide: its lines are its own to wrap, rich cuts nothing
    shown = run_cli("diff", "a", "b", cwd=tmp_path, COLUMNS="40", FORCE_COLOR="1")
    assert shown.returncode == 1 and row.search(ESCAPE.sub("", shown.stdout))
    assert verdict in ESCAPE.sub("", shown.stdout).splitlines()


def test_the_largest_difference_says_whether_it_is_of_values_or_of_statistics(llamas: Path) -> None:
    def header(a: str, b: str) -> str:
        lines = run_cli("diff", a, b, "--all", cwd=llamas).stdout.splitlines()
        return next(line for line in lines if line.lstrip().startswith("call (in the order"))

    assert "  max |Δstat|  " in header("original", "changed")  # statistics only: the deltas of mean, std, min, max
    assert "  max |Δ| / |Δstat|  " in header("original-values", "changed-values")  # values, and stats where none


def test_two_models_that_share_little_are_warned_about(tmp_path: Path) -> None:
    """GPT-2 against Llama is no port: the few calls structure pairs up (a norm with a projection) are coincidences
    of shape, and the report says so before its table; a real port (other names, paired by structure) is not."""
    model, inputs = gpt2()
    graphtrace.capture(model, inputs, path=tmp_path / "gpt2", values="none")
    graphtrace.capture(port_of(model), inputs, path=tmp_path / "port", values="none")
    graphtrace.capture(*llama(), path=tmp_path / "llama", values="none")
    result = run_cli("diff", "gpt2", "llama", cwd=tmp_path)
    warning = result.stdout.splitlines()[4]
    assert warning.startswith(
        "warning: A and B share little: only 16 of A's 43 module calls and of B's 45 have a counterpart (14 of them "
        "by structure alone); pairs such as transformer.h.0.ln_2 ↔ model.layers.0.self_attn.o_proj "
        "(LayerNorm ↔ Linear) may be coincidences of shape."
    )
    assert "warning" not in run_cli("diff", "gpt2", "port", cwd=tmp_path).stdout
