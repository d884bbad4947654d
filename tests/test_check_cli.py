"""`graphtrace check TARGET ORIGINAL` as a user runs it: exit codes 0 / 1 / 2 as the diff's, the table, --json,
--html, --map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import graphtrace
from graphtrace.cli.capture import load_factory
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent

FACTORY = f"""
import sys
import torch
sys.path.insert(0, {str(ROOT)!r})
from tests import independent_gpt2
from tests.check_ports import SMALL, scaled

IDS = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))

def original():
    return independent_gpt2.hf_gpt2(), {{"input_ids": IDS}}

def faithful():
    return independent_gpt2.port_of(original()[0]), (IDS,)

def two_bugs():
    port = independent_gpt2.port_of(original()[0], bug="eps")
    scaled(port.h[0].attn.out, SMALL)
    return port, (IDS,)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ports.py (the factories); original/, the original's trace with full values, and plain/, one without."""
    root = tmp_path_factory.mktemp("check-cli")
    (root / "ports.py").write_text(FACTORY)
    model, inputs = load_factory(f"{root / 'ports.py'}:original")()
    graphtrace.capture(model, inputs, path=root / "original", values="bundle")
    graphtrace.capture(model, inputs, path=root / "plain")
    return root


def test_a_faithful_port_exits_0(folder: Path) -> None:
    result = run_cli("check", "ports.py:faithful", "original", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "AGREES: all 42 modules judged agree within tolerance" in result.stdout
    assert "without counterpart in the original (3): h.0.attn.attn_drop" in result.stdout


def test_two_bugs_exit_1_and_both_are_named_in_the_table_and_the_page(folder: Path) -> None:
    result = run_cli("check", "ports.py:two_bugs", "original", "--html", "check.html", cwd=folder)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    own = [line.split()[1] for line in lines if line.rstrip().endswith("◀")]
    assert own == ["h.0.attn.out", "h.2.ln2"]
    assert "departs on its own (2), innermost first, in execution order:" in lines
    assert lines[-1] == "DEPARTS: 2 module(s) depart on their own"
    assert "wrote check.html" in result.stderr and "\x1b[" not in result.stdout  # a pipe gets plain text
    page = (folder / "check.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "GPT.h.2.ln2@0" in page


def test_the_json_report_with_rules_and_a_tolerance(folder: Path) -> None:
    rules = ["--map", "transformer.h.{i}=h.{i}", "--map", "attn.c_proj=attn.out"]
    result = run_cli("check", "ports.py:two_bugs", "original", *rules, "--atol", "0.5", "--json", cwd=folder)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["format"] == "graphtrace-check" and report["equal"] is False
    assert report["rules"] == ["transformer.h.{i}=h.{i}", "attn.c_proj=attn.out"] and report["unused_rules"] == []
    assert report["tolerance"] == {"rtol": None, "atol": 0.5}
    assert report["counts"]["checked"] == 42 and report["counts"]["depart_on_their_own"] == 2
    assert [(d["port"], d["original"]) for d in report["departures"]] == [
        ("h.0.attn.out", "transformer.h.0.attn.c_proj"),
        ("h.2.ln2", "transformer.h.2.ln_2"),
    ]
    # both departures lie far within an absolute tolerance of 0.5, but lean one way: systematic shifts
    small, eps = report["departures"]
    assert all(d["atol"] == 0.5 and d["outside"] == 0 and "lean one way" in d["reason"] for d in (small, eps))
    assert eps["max_abs"] > small["max_abs"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ports.py:two_bugs", "nowhere"], "no trace at 'nowhere'"),
        (["ports.py:faithful", "original", "--rtol", "-1"], "rtol must be a finite number >= 0"),
        (["ports.py:faithful", "plain"], "keeps no full values"),
        # options are checked before the port is built (here it could not be): the bad option is what is said
        (["unwritten.py:build", "original", "--rtol", "-1"], "rtol must be a finite number >= 0"),
        (["unwritten.py:build", "original", "--map", "noequals"], "rename rule 'noequals' has no '='"),
    ],
)
def test_bad_input_exits_2(folder: Path, args: list[str], message: str) -> None:
    result = run_cli("check", *args, cwd=folder)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_port_that_raises_reads_its_own_error_first_and_exits_3(folder: Path) -> None:
    (folder / "raising.py").write_text(
        "import torch\n"
        "class Broken(torch.nn.Module):\n"
        "    def forward(self, ids):\n"
        "        raise ValueError('the port is not finished')  # the port's own error\n"
        "def build():\n"
        "    return Broken(), (torch.zeros(1, 8, dtype=torch.long),)\n"
    )
    result = run_cli("check", "raising.py:build", "original", cwd=folder)
    assert result.returncode == 3, result.stderr
    assert "ValueError: the port is not finished" in result.stderr.splitlines()[0]
    assert "graphtrace/" not in result.stderr.replace("graphtrace check", "").replace("graphtrace:", "")
    full = run_cli("check", "raising.py:build", "original", "--traceback", cwd=folder)
    assert full.returncode == 1 and full.stderr.startswith("Traceback (most recent call last):")
