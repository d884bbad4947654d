"""Hostile trace directories beyond tests/test_hostile.py: special files where a file is expected, links to trace
files elsewhere, absurd sizes and encodings, fields of the wrong type, values that lie about their tensors, markup
in names, and links planted where a trace is saved. Every failure is a TraceFormatError naming the file, and one
line on stderr with exit code 2 from the CLI; nothing blocks."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import TraceFormatError
from graphtrace.io import safe_paths
from tests.conftest import run_python

OWN = "Sequential_graphtrace.json"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    graphtrace.capture(_model(), torch.ones(1, 4), path=tmp_path / "trace", values="safetensors")
    return tmp_path / "trace"


def _cli(*args: str) -> tuple[int, str]:
    """Exit code and stderr of ``graphtrace ARGS``; a run that blocks fails the test instead of hanging it."""
    result = run_python("-m", "graphtrace", *args, timeout=60)
    return result.returncode, result.stderr


def _one_line_error(code: int, stderr: str, *parts: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    for part in parts:
        assert part in stderr, (part, stderr)


def _edit(directory: Path, change) -> None:  # type: ignore[no-untyped-def]
    own = directory / OWN
    raw = json.loads(own.read_text())
    change(raw)
    own.write_text(json.dumps(raw))


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_special_file_in_place_of_the_trace_file_is_refused_without_blocking(saved: Path, kind: str) -> None:
    own = saved / OWN
    own.unlink()
    if kind == "fifo":
        os.mkfifo(own)  # opening it for reading would wait for a writer forever
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("creating a device file needs root")
        os.mknod(own, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: reading never ends
    else:
        own.mkdir()
    what = {"fifo": "a named pipe (FIFO)", "device": "a device", "directory": "a directory"}[kind]
    with pytest.raises(TraceFormatError, match=re.escape(f"it is {what}, not a regular file")):
        graphtrace.load(saved)
    _one_line_error(*_cli("show", str(saved)), str(own), what)
    if kind != "directory":  # a directory named directly is looked into as a trace directory
        _one_line_error(*_cli("show", str(own)), str(own), what)  # named directly too


def test_a_trace_file_linked_from_outside_the_directory_is_refused(saved: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / OWN
    elsewhere.parent.mkdir()
    os.replace(saved / OWN, elsewhere)
    (saved / OWN).symlink_to(elsewhere)
    with pytest.raises(TraceFormatError, match="outside the trace directory"):
        graphtrace.load(saved)
    assert graphtrace.load(saved / OWN).root.path == "Sequential"  # the file named itself is the caller's choice


def test_a_full_tensors_file_linked_from_outside_is_not_read_beside_its_summary(saved: Path, tmp_path: Path) -> None:
    (saved / OWN).unlink()
    full = saved / "Sequential_debug_tree_FULL_TENSORS.json"
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"module_path": "Planted", "inputs": {}, "outputs": None}))
    full.unlink()
    full.symlink_to(planted)
    assert graphtrace.load(saved).root.path == "Sequential"  # read from the SUMMARY, not through the link


def test_a_trace_file_too_large_to_parse_is_refused_before_it_is_read(saved: Path) -> None:
    own = saved / OWN
    with open(own, "r+b") as handle:
        handle.truncate(safe_paths.MAX_JSON_BYTES + 1)  # sparse: no disk used, but json.load would take gigabytes
    with pytest.raises(TraceFormatError, match=r"holds 1,073,741,825 bytes, more than the 1,073,741,824"):
        graphtrace.load(saved)


def test_a_byte_order_mark_is_read_and_other_encodings_are_named(saved: Path) -> None:
    own = saved / OWN
    text = own.read_bytes()
    own.write_bytes(b"\xef\xbb\xbf" + text)  # what some editors add on saving
    assert graphtrace.load(saved).root.children[0].type_name == "Linear"
    own.write_bytes(text.replace(b'"Linear"', b'"Lin\xe9ar"', 1))  # latin-1
    offset = text.index(b'"Linear"') + 4
    with pytest.raises(TraceFormatError, match=f"is not UTF-8 text \\(byte 0xe9 at offset {offset}\\)"):
        graphtrace.load(saved)


@pytest.mark.parametrize("values", ["safetensors", "bundle"])
def test_a_fifo_in_place_of_a_value_file_is_refused_without_blocking(tmp_path: Path, values: str) -> None:
    traces = [tmp_path / "a", tmp_path / "b"]
    for trace in traces:
        graphtrace.capture(_model(), torch.ones(1, 4), path=trace, values=values)  # type: ignore[call-overload]
    value = traces[1] / (
        "Sequential.2_outputs.safetensors" if values == "safetensors" else "Sequential_tensors.safetensors"
    )
    value.unlink()
    os.mkfifo(value)  # safetensors would wait on it for a writer forever
    with pytest.raises(TraceFormatError, match=re.escape(f"{value}: it is a named pipe (FIFO), not a regular file")):
        graphtrace.compare(traces[0], traces[1])
    _one_line_error(*_cli("diff", *map(str, traces)), "named pipe (FIFO)")


def test_a_value_file_holding_another_shape_than_recorded_is_named(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    traces = [tmp_path / "a", tmp_path / "b"]
    for trace in traces:
        graphtrace.capture(_model(), torch.ones(1, 4), path=trace, values="safetensors")
    save_file({"data": torch.ones(7, 3)}, str(traces[1] / "Sequential.2_outputs.safetensors"))
    message = "holds a tensor of shape [7, 3] where the trace records [1, 2]"
    with pytest.raises(TraceFormatError, match=re.escape(message)):
        graphtrace.compare(traces[0], traces[1])
    _one_line_error(*_cli("diff", *map(str, traces)), "./Sequential.2_outputs.safetensors", message)


def _first_child(raw: dict) -> dict:  # type: ignore[type-arg]
    child: dict = raw["steps"][0]["children"][0]  # type: ignore[type-arg]
    return child


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: _first_child(raw).update(error={"x": [1]}), "call error"),
        (lambda raw: _first_child(raw).update(inputs_from=[1]), "data-flow source"),
        (lambda raw: raw.update(fallbacks={"Sequential.0": [1]}), "fallback reason"),
        (lambda raw: raw["meta"].update(strategy=["fx"]), "trace metadata strategy"),
        (lambda raw: raw["meta"].update(world_size=None), "trace metadata world_size"),
        (lambda raw: raw.update(step_info=[{"cached_tokens": "7"}]), "cached token count"),
        (lambda raw: raw["steps"][0]["outputs"]["tensor"].update(stats=["a", 0, 0, 0]), "'a' is not a number"),
        (lambda raw: raw["steps"][0]["outputs"]["tensor"].update(nan=-1), "NaN count in trace file: -1 is negative"),
        (
            lambda raw: raw["steps"][0]["outputs"]["tensor"].update(
                dtensor={"placements": "(Shard(dim=0),)", "mesh_shape": 2, "global_shape": [2, 2]}
            ),
            "DTensor mesh shape",
        ),
        (lambda raw: _first_child(raw).update(path="Sequential", index=0), "'Sequential@0' appears twice"),
    ],
    ids=[
        "error-dict",
        "inputs-from-int",
        "fallback-list",
        "meta-str-list",
        "meta-int-null",
        "tokens-string",
        "stats-string",
        "count-negative",
        "dtensor-int",
        "id-of-an-ancestor",
    ],
)
def test_fields_of_the_wrong_type_are_refused_with_the_file_named(saved: Path, change, message: str) -> None:  # type: ignore[no-untyped-def]
    """Fields that show, render, view or diff format or compare later (where a wrong type was a traceback, and a
    call sharing its ancestor's id made render loop forever) are checked when the file is read."""
    _edit(saved, change)
    with pytest.raises(TraceFormatError, match=re.escape(message)) as raised:
        graphtrace.load(saved)
    assert str(saved / OWN) in str(raised.value)


def test_a_wrongly_typed_error_in_a_spec_file_is_refused(saved: Path) -> None:
    (saved / OWN).unlink()
    summary = saved / "Sequential_debug_tree_SUMMARY.json"
    raw = json.loads(summary.read_text())
    raw["children"][0]["error"] = {"a": 1}
    (saved / "Sequential_debug_tree_FULL_TENSORS.json").unlink()
    summary.write_text(json.dumps(raw))
    _one_line_error(
        *_cli("render", str(saved), "-o", str(saved / "g.svg")), str(summary), "'error' that is not a string"
    )


def test_names_holding_markup_or_dot_syntax_are_drawn_as_text(saved: Path) -> None:
    """A call's path is shown, never interpreted: not as DOT (a backslash before a quote ended pydot's quoted name
    early, so that the rest became statements), not as Graphviz escapes (``\\N`` is the node's name), not as HTML."""
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot")
    injected = 'a\\"];evil[image="planted.png"];b[label="\\N<script>alert(1)</script>'

    def rename(raw: dict) -> None:  # type: ignore[type-arg]
        children = raw["steps"][0]["children"]
        children[0]["path"] = f"Sequential.{injected}"
        children[2]["path"] = "Sequential.ends\\"  # a trailing backslash escaped the closing quote
        raw["steps"][0]["path"] = "Root\\G"  # a cluster

    _edit(saved, rename)
    svg = saved / "graph.svg"
    code, stderr = _cli("render", str(saved), "-o", str(svg))
    assert code == 0, stderr
    text = svg.read_text()
    titles = re.findall(r"<title>([^<]*)</title>", text)
    assert len(titles) == 6 and not {"evil", "b"} & set(titles)  # no node the name declared
    assert "<image" not in text and "<script>" not in text
    assert "&lt;script&gt;" in text and "\\N&lt;script" in text  # shown as written, not expanded to the name
    assert ">ends\\</text>" in text and ">Root\\G</text>" in text
    page = saved / "page.html"
    code, stderr = _cli("view", str(saved), "-o", str(page))
    assert code == 0, stderr
    assert "<script>alert(1)" not in page.read_text()


def _plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return target


@pytest.mark.parametrize("values", ["safetensors", "bundle"])
def test_links_planted_under_the_names_of_value_files_are_replaced_not_followed(tmp_path: Path, values: str) -> None:
    victims = tmp_path / "victims"
    victims.mkdir()
    out = tmp_path / "out"
    names = (
        ["Sequential_outputs.safetensors", "Sequential.0_outputs.safetensors"]
        if values == "safetensors"
        else ["Sequential_tensors.safetensors", "Sequential_tensors.safetensors.index.json"]
    )
    for name in names:
        (victims / name).write_text("precious")
        _plant(out / name, victims / name)
    trace = graphtrace.capture(_model(), torch.ones(1, 4), path=out, values=values)  # type: ignore[call-overload]
    assert all((victims / name).read_text() == "precious" for name in names)
    assert not any((out / name).is_symlink() for name in names)
    assert graphtrace.compare(trace, graphtrace.load(out)).first_divergence is None


def test_a_link_planted_as_a_step_folder_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    _plant(out / "step_1", elsewhere)
    model = _model()
    with pytest.raises(graphtrace.errors.OutputPathError, match=r"step_1' is a link"):
        with graphtrace.tracing(model, path=out, values="safetensors"):
            model(torch.ones(1, 4))
            model(torch.ones(1, 4))
    assert list(elsewhere.iterdir()) == []


def test_a_link_to_a_folder_planted_where_a_single_steps_values_move_up_is_replaced(tmp_path: Path) -> None:
    """tracing() streams values into step_0/ and moves them up after one step: moving onto a link to a directory
    moved the file into that directory."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    _plant(out / "Sequential_outputs.safetensors", elsewhere)
    model = _model()
    with graphtrace.tracing(model, path=out, values="safetensors"):
        model(torch.ones(1, 4))
    assert list(elsewhere.iterdir()) == []
    assert (out / "Sequential_outputs.safetensors").is_file() and not (out / "step_0").exists()


def test_a_file_named_by_many_records_is_checked_once(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving a reference costs a system call per path component: a crafted trace of a hundred thousand calls
    naming the same file took minutes to load when every record's reference was resolved."""
    from graphtrace.io import trace_files

    def many(raw: dict) -> None:  # type: ignore[type-arg]
        child = raw["steps"][0]["children"][1]
        raw["steps"][0]["children"] = [dict(child, path=f"Sequential.{i}") for i in range(20_000)]

    _edit(saved, many)
    checked: list[str] = []
    real = trace_files.inside

    def counting(directory: Path, reference: str) -> Path:
        checked.append(reference)
        return real(directory, reference)

    monkeypatch.setattr(trace_files, "inside", counting)
    assert len(list(graphtrace.load(saved).walk())) == 20_001
    assert sorted(checked) == sorted(set(checked)) and len(checked) <= 4


def test_a_step_folder_linked_elsewhere_is_not_read_from(tmp_path: Path) -> None:
    """The values of a trace of several steps live in step_{i}/; a step_1 that is a link to another trace's folder
    passed the reference check (made inside the folder the link leads to) and was read and copied."""
    model = _model()
    traces = [tmp_path / "a", tmp_path / "b"]
    for trace in traces:
        with graphtrace.tracing(model, path=trace, values="safetensors"):
            model(torch.ones(1, 4))
            model(torch.ones(1, 4))
    elsewhere = tmp_path / "elsewhere"
    os.replace(traces[1] / "step_1", elsewhere)
    (traces[1] / "step_1").symlink_to(elsewhere)
    with pytest.raises(TraceFormatError, match="'step_1', which lies outside its directory"):
        graphtrace.compare(traces[0], traces[1])
    with pytest.raises(TraceFormatError, match="'step_1', which lies outside its directory"):
        graphtrace.load(traces[1]).save(tmp_path / "copy")
    assert not (tmp_path / "copy" / "step_1").exists()


def test_a_value_file_claiming_a_huge_tensor_is_refused(tmp_path: Path) -> None:
    """A header may describe gigabytes that a sparse file holds without using the disk: the shape is checked
    against the record's in the header, and the file is refused by name with both shapes."""
    import struct

    traces = [tmp_path / "a", tmp_path / "b"]
    for trace in traces:
        graphtrace.capture(_model(), torch.ones(1, 4), path=trace, values="safetensors")
    header = json.dumps({"data": {"dtype": "F32", "shape": [1 << 16, 1 << 12], "data_offsets": [0, 1 << 30]}})
    header += " " * (-len(header) % 8)
    with open(traces[1] / "Sequential.2_outputs.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header.encode())
        handle.truncate(8 + len(header) + (1 << 30))
    with pytest.raises(TraceFormatError, match=re.escape("holds a tensor of shape [65536, 4096] where the trace")):
        graphtrace.compare(traces[0], traces[1])
    code, stderr = _cli("diff", *map(str, traces))
    _one_line_error(code, stderr, "Sequential.2_outputs.safetensors in", "[65536, 4096]")


def test_control_characters_in_names_never_reach_the_terminal(saved: Path) -> None:
    """A name holding ESC sequences (clear the screen, set the clipboard through OSC 52), a carriage return or a
    raw C1 control printed them as they are in show's tree; they are kept as the text of their escapes."""

    def rename(raw: dict) -> None:  # type: ignore[type-arg]
        child = _first_child(raw)
        child["path"] = "Sequential.\x1b]52;c;cHduZWQ=\x07\x1b[2J\rx\x9b31m"
        child["type"] = "Linear\\"  # an escaped backslash stays one backslash

    _edit(saved, rename)
    child = graphtrace.load(saved).root.children[0]
    assert child.path == "Sequential.\\u001b]52;c;cHduZWQ=\\u0007\\u001b[2J\\rx\\u009b31m"
    assert child.type_name == "Linear\\"
    result = run_python("-m", "graphtrace", "show", str(saved), timeout=60, FORCE_COLOR="1")
    assert result.returncode == 0, result.stderr
    shown = result.stdout.replace("\x1b[0m", "")
    assert "\\u001b[2J" in shown and not re.search(r"\x1b(?!\[[0-9;]*m)|[\r\x07\x80-\x9f]", shown)


def test_an_error_naming_a_crafted_file_name_prints_its_control_characters_as_escapes(tmp_path: Path) -> None:
    crafted = tmp_path / "\x1b[2J\x1b]52;c;cHduZWQ=\x07_graphtrace.json"
    crafted.write_text("{")
    code, stderr = _cli("show", str(tmp_path))
    _one_line_error(code, stderr, "\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07_graphtrace.json", "is not valid JSON")
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", stderr)


def test_saving_a_trace_whose_value_file_is_a_fifo_names_it(saved: Path, tmp_path: Path) -> None:
    value = saved / "Sequential.1_outputs.safetensors"
    value.unlink()
    os.mkfifo(value)
    with pytest.raises(TraceFormatError, match=re.escape(f"{value}: it is a named pipe (FIFO)")):
        graphtrace.load(saved).save(tmp_path / "copy")
    assert list((tmp_path / "copy").iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize("name", [OWN, "Sequential.2_outputs.safetensors"])
def test_a_loop_of_links_is_named_not_a_traceback(saved: Path, name: str) -> None:
    looped = saved / name
    looped.unlink()
    looped.symlink_to(name)  # Path.resolve raises RuntimeError on it
    with pytest.raises(TraceFormatError, match=re.escape(f"{looped} is a loop of symbolic links")):
        graphtrace.load(saved)
    _one_line_error(*_cli("show", str(saved)), "is a loop of symbolic links")


def test_a_fifo_swapped_in_after_the_check_is_never_opened(saved: Path) -> None:
    """The check that a value file is a regular file and its reading are one: a FIFO put in its place between the
    two (by whoever else writes the directory) made safetensors wait for a writer forever, holding the GIL. Run in
    a process of its own, so that a regression fails the test instead of hanging it."""
    import subprocess

    script = f"""
import os
from graphtrace.io import tensors
value = {str(saved / "Sequential.2_outputs.safetensors")!r}
real = tensors.check_regular_file

def then_swap(path, *fd):
    status = real(path, *fd)
    os.replace(value, value + ".aside")
    os.mkfifo(value)
    return status

tensors.check_regular_file = then_swap
print(tuple(tensors.load_tensor({str(saved)!r}, "./Sequential.2_outputs.safetensors").shape))
"""
    try:
        result = run_python("-c", script, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("reading the value file blocked on the FIFO swapped in after the check")
    assert result.returncode == 0 and result.stdout.strip() == "(1, 2)", result.stderr
