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
    # a fallback reason makes a line far wider than any terminal: rich neither wraps nor cuts it
    long = next(line for line in lines if "eager: " in line and "self_attn" in line)
    assert len(long) > 120 and long.endswith("eager: Refused: calls DynamicCache.update, which a replay would repeat")
    assert sum(1 for line in lines if line.endswith("would repeat")) == sum(
        1 for line in lines if "self_attn (" in line
    )


def test_colour_on_a_terminal_and_none_with_no_color(saved: Path) -> None:
    coloured = run_cli("show", str(saved), "--depth", "2", FORCE_COLOR="1")
    assert COLOUR.search(coloured.stdout)  # rich treats FORCE_COLOR as a terminal
    plain = run_cli("show", str(saved), "--depth", "2")
    assert ANSI.sub("", coloured.stdout) == plain.stdout  # the same text, only coloured
    no_color = run_cli("show", str(saved), "--depth", "2", FORCE_COLOR="1", NO_COLOR="1")
    assert not COLOUR.search(no_color.stdout)  # bold and dim may stay; no colour
    assert ANSI.sub("", no_color.stdout) == plain.stdout
