"""Shared fixtures: running transformers' own debugger (the oracle) and graphtrace's shim on the same model."""

from __future__ import annotations

import filecmp
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run_python(
    *args: str, cwd: Path | None = None, timeout: float = 300, **environment: str
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh process that imports this checkout's graphtrace."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **environment}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_cli(*args: str, cwd: Path | None = None, **environment: str) -> subprocess.CompletedProcess[str]:
    """``python -m graphtrace ARGS``, as a user runs the command."""
    return run_python("-m", "graphtrace", *args, cwd=cwd, **environment)


@pytest.fixture(scope="module")
def demo_trace() -> Any:
    """The demo transformer captured eagerly: data flow from tensor identity alone, with the gaps the renderer
    infers (fx would fill them)."""
    import graphtrace
    from graphtrace.demo import demo_inputs, demo_model

    return graphtrace.capture(demo_model(), demo_inputs(), strategy="eager")


@pytest.fixture(autouse=True)
def _isolate_print_options():
    """transformers' debugger changes torch's print options for the whole process; undo it after each test."""
    from torch._tensor_str import PRINT_OPTS

    saved = dict(vars(PRINT_OPTS))
    yield
    for key, value in saved.items():
        setattr(PRINT_OPTS, key, value)


def run_reference(model: torch.nn.Module, call: Callable[[], Any], directory: Path, **options: Any) -> Path:
    """Run ``call`` under transformers' model_addition_debugger_context writing into ``directory``."""
    from transformers.model_debugging_utils import model_addition_debugger_context

    directory.mkdir(parents=True, exist_ok=True)
    with model_addition_debugger_context(model, debug_path=str(directory), **options):
        call()
    # transformers leaves instance `forward` attributes behind; remove them so later runs start clean
    for module in model.modules():
        module.__dict__.pop("forward", None)
    return directory


def run_ours(model: torch.nn.Module, call: Callable[[], Any], directory: Path, **options: Any) -> Path:
    from graphtrace import model_addition_debugger_context

    with model_addition_debugger_context(model, debug_path=str(directory), **options):
        call()
    return directory


def spec_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".json") and "_debug_tree_" in p.name)


_CALL_SUFFIX = re.compile(r"@(\d+)_(inputs|outputs)")


def reference_name(name: str) -> str:
    """The name transformers gives the file we name ``path@N_...`` (it has one file for every call of a module)."""
    return _CALL_SUFFIX.sub(r"_\2", name)


def _call_number(name: str) -> int:
    match = _CALL_SUFFIX.search(name)
    return int(match.group(1)) if match else 0


def assert_same_trace_files(reference: Path, ours: Path) -> None:
    """Same JSON files byte for byte and the same tensors in the files, allowing for one deliberate difference: a
    module called more than once keeps each call's tensors in its own file (``path@N_...``), where transformers
    overwrites one file, so its content is the last call's."""
    assert spec_files(ours) == spec_files(reference) != []
    for name in spec_files(reference):
        ref_text = (reference / name).read_text(encoding="utf-8")
        our_text = reference_name((ours / name).read_text(encoding="utf-8"))
        if ref_text != our_text:  # show a readable difference first
            assert json.loads(our_text) == json.loads(ref_text), name
            assert our_text == ref_text, f"{name}: same JSON, different text"
    ours_tensors = {p.name for p in ours.glob("*.safetensors")}
    # the same set of files as transformers writes: those the JSON points at, the root's outputs (which the JSON
    # drops), and with pruning the files of the pruned layer blocks (only the JSON is pruned)
    assert {reference_name(name) for name in ours_tensors} == {p.name for p in reference.glob("*.safetensors")}
    assert referenced_values(ours) <= ours_tensors
    assert referenced_values(reference) == {reference_name(name) for name in referenced_values(ours)}
    last_call: dict[str, str] = {}
    for name in sorted(ours_tensors, key=_call_number):
        last_call[reference_name(name)] = name
    for ref_name, our_name in sorted(last_call.items()):
        assert filecmp.cmp(reference / ref_name, ours / our_name, shallow=False), our_name


def referenced_values(directory: Path) -> set[str]:
    """The ./file.safetensors values a FULL_TENSORS file points at."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            value = node.get("value")
            if isinstance(value, str) and value.endswith(".safetensors"):
                found.add(value[2:])
            for item in node.values():
                visit(item)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    for path in directory.glob("*_FULL_TENSORS.json"):
        visit(json.loads(path.read_text()))
    return found
