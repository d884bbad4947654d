"""The command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli


def test_demo_writes_the_trace_and_says_where(tmp_path: Path) -> None:
    result = run_cli("demo", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out_dir = tmp_path / "graphtrace-demo"
    for suffix in ("_debug_tree_SUMMARY.json", "_debug_tree_FULL_TENSORS.json", "_graphtrace.json"):
        assert (out_dir / f"DemoTransformer{suffix}").is_file()
        assert f"DemoTransformer{suffix}" in result.stdout
    assert "wrote graphtrace-demo/" in result.stdout and result.stderr == ""  # no progress line on a pipe
    # the call count it reports is the number of calls in the tree it wrote, and the model's: the root; embed_tokens,
    # rotary, norm, lm_head; per layer itself, two norms, attn with 4 projections, mlp with 4 modules
    summary = json.loads((out_dir / "DemoTransformer_debug_tree_SUMMARY.json").read_text())

    def calls(node: dict) -> int:
        return 1 + sum(calls(child) for child in node.get("children", []))

    assert calls(summary) == 1 + 4 + 4 * 13
    assert result.stdout.startswith("graphtrace demo: traced DemoTransformer (1 forward call, 57 module calls) in ")

    shown = run_cli("show", "graphtrace-demo", "--depth", "1", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "layers.3 (DecoderLayer) -> [1, 12, 64] float32" in shown.stdout
    assert "q_proj" not in shown.stdout  # below the depth limit


def test_bad_input_exits_2_with_a_message(tmp_path: Path) -> None:
    result = run_cli("show", "nowhere", cwd=tmp_path)
    assert (
        result.returncode == 2 and "error: no trace at 'nowhere'" in result.stderr and "Traceback" not in result.stderr
    )
    result = run_cli("capture", "not-a-target", "-o", "out", cwd=tmp_path)
    assert result.returncode == 2 and "must look like" in result.stderr


def test_capture_a_model_from_a_factory_file(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3)\n"
    )
    result = run_cli("capture", "factory.py:build", "-o", "out", "--values", "safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "Sequential_debug_tree_SUMMARY.json").is_file()
    assert (tmp_path / "out" / "Sequential.0_outputs.safetensors").is_file()


def test_capture_ranks_option(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(3, 2)), torch.ones(1, 3)\n"
    )
    result = run_cli("capture", "factory.py:build", "-o", "out", "--ranks", "all", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "rank_0" / "Sequential_debug_tree_SUMMARY.json").is_file()  # one folder per rank
    bad = run_cli("capture", "factory.py:build", "-o", "out2", "--ranks", "first", cwd=tmp_path)
    assert bad.returncode == 2 and "'first' is not a rank" in bad.stderr
    outside = run_cli("capture", "factory.py:build", "-o", "out3", "--ranks", "0,1", cwd=tmp_path)
    assert outside.returncode == 2 and "names rank 1" in outside.stderr and not (tmp_path / "out3").exists()


def test_capture_without_dot_warns_in_one_line_and_passes_other_warnings_through(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text(
        "import warnings, torch\n"
        "class Warns(torch.nn.Linear):\n"
        "    def forward(self, x):\n"
        "        warnings.warn('the model speaks', UserWarning)\n"
        "        return super().forward(x)\n"
        "def build():\n"
        "    return Warns(3, 2), torch.ones(1, 3)\n"
    )
    (tmp_path / "bin").mkdir()
    result = run_cli(
        "capture", "factory.py:build", "-o", "out", "--strategy", "eager", cwd=tmp_path, PATH=str(tmp_path / "bin")
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert sum("graphtrace capture: warning:" in line and "graphviz" in line for line in lines) == 1
    assert "Traceback" not in result.stderr and "UserWarning: the model speaks" in result.stderr
    assert (tmp_path / "out" / "Warns_call_graph.dot").is_file()


_RAISES = (
    "import dataclasses, torch\n"
    "@dataclasses.dataclass\n"
    "class Config:\n"
    "    width: int = 4\n"
    "class Block(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.proj = torch.nn.Linear(4, 4)\n"
    "    def forward(self, x):\n"
    "        return self.proj(x) @ torch.ones(3, 3)  # the model's own bug\n"
    "def build():\n"
    "    return torch.nn.Sequential(torch.nn.Linear(Config().width, 4), Block()), torch.ones(2, 4)\n"
)


def test_a_model_that_raises_reads_its_own_error_first(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text(_RAISES)  # a dataclass in the file, as in any model's config
    result = run_cli("capture", "factory.py:build", "-o", "out", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "graphtrace capture: the model raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 3x3)"
    )
    assert lines[1] == "graphtrace: partial trace of 4 calls saved to out; the call that raised: Sequential.1@0"
    assert "return self.proj(x) @ torch.ones(3, 3)  # the model's own bug" in result.stderr
    assert "graphtrace/" not in result.stderr.replace("graphtrace capture", "") and "_call_impl" not in result.stderr
    assert len(lines) < 15 and (tmp_path / "out" / "Sequential_graphtrace.json").is_file()
    full = run_cli("capture", "factory.py:build", "-o", "out", "--traceback", cwd=tmp_path)
    assert full.returncode == 1 and full.stderr.startswith("Traceback (most recent call last):")
    assert "graphtrace/engine/eager.py" in full.stderr and "_call_impl" in full.stderr


def test_a_factory_that_raises_is_named(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text("def build():\n    raise FileNotFoundError('no weights at ./llama')\n")
    result = run_cli("capture", "factory.py:build", "-o", "out", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("graphtrace capture: factory.py:build raised FileNotFoundError: no weights at ")
