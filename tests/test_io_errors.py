"""Output and input paths that do not work: each is one graphtrace error naming the path (OutputPathError for where
a trace is written, TraceFormatError for what a trace lacks), exit code 2 from the command line, no traceback."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import OutputPathError, TraceFormatError
from graphtrace.io import trace_files
from tests.conftest import run_cli

FACTORY = "import torch\ndef build():\n    return torch.nn.Sequential(torch.nn.Linear(3, 2)), torch.ones(1, 3)\n"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def _one_line_error(result: object, *parts: str) -> None:
    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    for part in parts:
        assert part in stderr, (part, stderr)


@pytest.fixture()
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A directory nobody may write into (skipped where the permission is not enforced, as for root)."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        if os.access(directory, os.W_OK):
            pytest.skip("this user can write into a directory of mode 0o500 (root): the permission is not enforced")
        yield directory
    finally:
        directory.chmod(0o700)


@pytest.mark.parametrize("below", ["", "new"], ids=["existing", "to-create"])
def test_an_unwritable_output_directory_is_an_output_path_error(read_only: Path, below: str) -> None:
    target = read_only / below if below else read_only
    with pytest.raises(OutputPathError, match=f"cannot write into trace directory {str(target)!r}: Permission denied"):
        graphtrace.capture(_model(), torch.ones(1, 4), path=target)
    trace = graphtrace.capture(_model(), torch.ones(1, 4))
    with pytest.raises(OutputPathError, match="Permission denied"):
        trace.save(target)
    assert list(read_only.iterdir()) == []
    (read_only.parent / "factory.py").write_text(FACTORY)
    result = run_cli("capture", "factory.py:build", "-o", str(target), cwd=read_only.parent)
    _one_line_error(result, f"cannot write into trace directory {str(target)!r}", "Permission denied")


def test_an_output_path_that_is_a_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "factory.py").write_text(FACTORY)
    (tmp_path / "taken").write_text("")
    result = run_cli("capture", "factory.py:build", "-o", "taken", cwd=tmp_path)
    _one_line_error(result, "trace directory 'taken' is a file, not a directory")
    assert (tmp_path / "taken").read_text() == ""


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    graphtrace.capture(_model(), torch.ones(1, 4), path=tmp_path / "a", values="safetensors")
    return tmp_path / "a"


def test_a_trace_directory_without_its_json_holds_no_trace(saved: Path) -> None:
    for file in saved.glob("*.json"):
        file.unlink()
    with pytest.raises(TraceFormatError, match=f"{str(saved)!r} holds no trace"):
        graphtrace.load(saved)
    _one_line_error(run_cli("show", str(saved)), f"{str(saved)!r} holds no trace")
    _one_line_error(run_cli("diff", str(saved), str(saved)), f"{str(saved)!r} holds no trace")


def test_a_missing_value_file_is_named_when_it_is_needed(saved: Path, tmp_path: Path) -> None:
    """Read from FULL_TENSORS alone (graphtrace's own file gone), the trace loads (values are read when needed);
    comparing or copying it names the missing file."""
    graphtrace.capture(_model(), torch.ones(1, 4), path=tmp_path / "b", values="safetensors")
    (saved / "Sequential_graphtrace.json").unlink()
    (saved / "Sequential.0_outputs.safetensors").unlink()
    trace = graphtrace.load(saved)
    assert trace.find("Sequential.0").outputs.file == "./Sequential.0_outputs.safetensors"  # type: ignore[union-attr]
    result = run_cli("diff", str(saved), str(tmp_path / "b"))
    _one_line_error(result, "trace A refers to ./Sequential.0_outputs.safetensors, which cannot be read from")
    with pytest.raises(TraceFormatError, match=r"refers to \./Sequential\.0_outputs\.safetensors, which is missing"):
        trace.save(tmp_path / "copy")
    assert list((tmp_path / "copy").iterdir()) == []  # found missing before anything was written


def test_a_value_file_that_cannot_be_copied_leaves_no_partial_file(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = shutil.copyfile

    def full_disk(source: str, target: str) -> None:
        copy(source, target)
        if Path(source).name == "Sequential.1_outputs.safetensors":
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trace_files.shutil, "copyfile", full_disk)
    with pytest.raises(OutputPathError, match=r"cannot copy Sequential\.1_outputs\.safetensors into .*No space left"):
        graphtrace.load(saved).save(tmp_path / "copy")
    assert not (tmp_path / "copy" / "Sequential.1_outputs.safetensors").exists()
    assert [p.name for p in (tmp_path / "copy").iterdir() if p.name.startswith(".")] == []  # no temporary left


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read trace file"),
        ('{"module_path": ', "is not valid JSON"),
        ("[1, 2]", "does not hold a call tree (its top level is a list)"),
    ],
    ids=["a-directory", "truncated", "a-list"],
)
def test_a_spec_file_that_cannot_be_read_exits_2(tmp_path: Path, content: str | None, message: str) -> None:
    summary = tmp_path / "M_debug_tree_SUMMARY.json"
    if content is None:
        summary.mkdir()
    else:
        summary.write_text(content)
    with pytest.raises(TraceFormatError, match=re.escape(message)) as raised:
        graphtrace.load(tmp_path)
    assert str(summary) in str(raised.value)
    _one_line_error(run_cli("show", str(tmp_path)), message, str(summary))
