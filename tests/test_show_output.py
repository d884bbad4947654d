"""`graphtrace show` through rich: colour on a terminal, none with NO_COLOR, plain uncut lines in a pipe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import graphtrace
from tests.conftest import run_cli
from tests.zoo import llama

ANSI = re.compile(r"\x1b\[[0-9;]*m")
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|9[0-7])(?:;[0-9;]*)?m")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("show") / "llama"
    model, inputs = llama()
    graphtrace.capture(model, inputs, path=path)
    return path


def test_plain_in_a_pipe_with_whole_lines(saved: Path) -> None:
    shown = run_cli("show", str(saved))
    assert shown.returncode == 0, shown.stderr
    assert not ANSI.search(shown.stdout)
    lines = shown.stdout.splitlines()
    assert lines[2].startswith("LlamaForCausalLM (LlamaForCausalLM) -> ([1, 7, 99] float32, DynamicCache(")
    assert "│   ├── embed_tokens (Embedding) -> [1, 7, 32] float32  mean " in shown.stdout
    # a fallback makes a line far wider than any terminal: rich neither wraps nor cuts it
    long = next(line for line in lines if "recorded by wrapping" in line and "self_attn" in line)
    assert len(long) > 120 and long.endswith("recorded by wrapping forward: the model passes a cache object")
    wrapped = [line for line in lines if line.endswith("passes a cache object")]
    assert len(wrapped) == 1 + sum(1 for line in lines if "self_attn (" in line)  # the model and each attention


def test_colour_on_a_terminal_and_none_with_no_color(saved: Path) -> None:
    coloured = run_cli("show", str(saved), "--depth", "2", FORCE_COLOR="1")
    assert COLOUR.search(coloured.stdout)  # rich treats FORCE_COLOR as a terminal
    plain = run_cli("show", str(saved), "--depth", "2")
    assert ANSI.sub("", coloured.stdout) == plain.stdout  # the same text, only coloured
    no_color = run_cli("show", str(saved), "--depth", "2", FORCE_COLOR="1", NO_COLOR="1")
    assert not COLOUR.search(no_color.stdout)  # bold and dim may stay; no colour
    assert ANSI.sub("", no_color.stdout) == plain.stdout


def test_focus_looks_one_call_up_with_min_max_and_parameters(saved: Path) -> None:
    shown = run_cli("show", str(saved), "--focus", "model.layers.1.mlp")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    trace = graphtrace.load(saved)
    mlp = trace.find("model.layers.1.mlp")
    record = mlp.outputs
    assert isinstance(record, graphtrace.TensorRecord) and record.stats is not None
    stats = record.stats
    assert lines[2] == (
        f"LlamaForCausalLM.model.layers.1.mlp (LlamaMLP) -> [1, 7, 32] float32  mean {stats.mean:.3g} "
        f"std {stats.std:.3g} min {stats.min:.3g} max {stats.max:.3g}  {3 * 32 * 64:,} params"
    )
    assert [line.split(" (")[0][4:] for line in lines[3:]] == ["gate_proj", "act_fn", "up_proj", "down_proj"]
    assert trace.parameters["LlamaForCausalLM"] == sum(p.numel() for p in llama()[0].parameters())


def test_paths_are_what_a_grep_for_a_path_finds(saved: Path) -> None:
    shown = run_cli("show", str(saved), "--paths")
    assert [line for line in shown.stdout.splitlines() if "model.layers.0.mlp.up_proj (" in line]
    assert "model.layers.0.mlp.up_proj" not in run_cli("show", str(saved)).stdout


def test_repeated_layers_fold_as_the_graph_folds_them(tmp_path: Path) -> None:
    model, inputs = llama(layers=24)
    graphtrace.capture(model, inputs, path=tmp_path)
    folded = run_cli("show", str(tmp_path)).stdout.splitlines()
    unfolded = run_cli("show", str(tmp_path), "--unfold").stdout.splitlines()
    assert len(unfolded) > 24 * 13 and len(folded) < 50
    for number in range(24):  # every layer keeps its line, with its own statistics
        assert sum(f"── layers.{number} (LlamaDecoderLayer)" in line for line in folded) == 1
    assert "(first of 24 identical blocks; --unfold shows the others' calls)" in folded[6]
    assert folded[19].endswith("(12 calls inside, as in layers.0)")


def test_a_step_that_does_not_exist_is_a_clear_error(saved: Path) -> None:
    shown = run_cli("show", str(saved), "--step", "3")
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert "step 3 does not exist: the trace has 1 forward call(s), numbered 0..0" in shown.stderr
    missing = run_cli("show", str(saved), "--focus", "model.layers.1.mpl")
    assert missing.returncode == 2 and "Did you mean model.layers.1.mlp" in missing.stderr


def test_fallbacks_read_as_notes_and_why_gives_the_technical_reason(saved: Path) -> None:
    shown = run_cli("show", str(saved), FORCE_COLOR="1").stdout
    attention = next(line for line in shown.splitlines() if "self_attn" in line)
    assert "Refused" not in shown and "NotImplementedError" not in shown and "eager:" not in shown
    assert "\x1b[33m" not in attention  # no warning colour (yellow) on a call that is only not verified by fx
    why = run_cli("show", str(saved), "--why").stdout
    assert any(
        line.endswith(
            "recorded by wrapping forward: the model passes a cache object (why: Refused: calls "
            "DynamicCache.update, which a replay would repeat)"
        )
        for line in why.splitlines()
    )
