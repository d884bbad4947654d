"""A trace directory is untrusted input (issue 14): references leading out of it, names that would become paths,
malformed or absurdly nested files, and writes that fail halfway."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import OutputPathError, TraceFormatError
from graphtrace.io.safe_paths import write_atomic
from tests.conftest import run_cli


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    graphtrace.capture(_model(), torch.ones(1, 4), path=tmp_path / "trace", values="safetensors")
    return tmp_path / "trace"


def _rewrite(directory: Path, change) -> None:  # type: ignore[no-untyped-def]
    own = next(directory.glob("*_graphtrace.json"))
    own.write_text(change(own.read_text()))


@pytest.mark.parametrize("reference", ["../planted.safetensors", "/etc/passwd", "../../x.safetensors#data"])
def test_a_reference_outside_the_directory_is_refused(saved: Path, reference: str) -> None:
    planted = saved.parent / "planted.safetensors"
    from safetensors.torch import save_file

    save_file({"data": torch.full((1, 2), 7.0)}, str(planted))
    other = saved.parent / "other"
    graphtrace.capture(_model(), torch.ones(1, 4), path=other, values="safetensors")
    _rewrite(saved, lambda text: text.replace("./Sequential_outputs.safetensors", reference))
    with pytest.raises(TraceFormatError, match="only files inside its own directory"):
        graphtrace.load(str(saved))
    result = run_cli("diff", str(other), str(saved))
    assert result.returncode == 2 and "inside its own directory" in result.stderr and "Traceback" not in result.stderr


def test_a_symlink_leading_out_is_refused(saved: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.safetensors"
    os.replace(saved / "Sequential.2_outputs.safetensors", outside)
    (saved / "Sequential.2_outputs.safetensors").symlink_to(outside)
    with pytest.raises(TraceFormatError, match="outside its directory"):
        graphtrace.load(str(saved))


def test_saving_a_hostile_trace_writes_nothing_outside_the_target(saved: Path, tmp_path: Path) -> None:
    import dataclasses

    trace = graphtrace.load(str(saved))
    record = dataclasses.replace(trace.root.outputs, file="../escaped.safetensors")  # type: ignore[type-var]
    crafted = dataclasses.replace(trace, steps=(dataclasses.replace(trace.root, outputs=record),))
    (saved.parent / "escaped.safetensors").write_bytes((saved / "Sequential_outputs.safetensors").read_bytes())
    with pytest.raises(TraceFormatError, match="outside its directory"):
        crafted.save(tmp_path / "copy" / "inner")
    assert not (tmp_path / "copy" / "escaped.safetensors").exists()


def test_a_model_class_that_would_be_a_path_is_refused(saved: Path, tmp_path: Path) -> None:
    _rewrite(saved, lambda text: text.replace('"model_class":"Sequential"', '"model_class":"../../evil"'))
    with pytest.raises(TraceFormatError, match="not a class name"):
        graphtrace.load(str(saved))
    before = set(tmp_path.rglob("*"))
    result = run_cli("render", str(saved), "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert not [p for p in set(tmp_path.rglob("*")) - before if "evil" in p.name]


@pytest.mark.parametrize(
    "change",
    [
        lambda raw: {**raw, "meta": [1]},
        lambda raw: {**raw, "steps": [{"path": "Sequential", "kwargs": [1]}]},
        lambda raw: {**raw, "steps": "x"},
        lambda raw: {**raw, "steps": [{"path": 3}]},
    ],
    ids=["meta-list", "kwargs-list", "steps-string", "path-number"],
)
def test_malformed_files_are_one_line_errors_with_exit_2(saved: Path, change) -> None:  # type: ignore[no-untyped-def]
    own = next(saved.glob("*_graphtrace.json"))
    own.write_text(json.dumps(change(json.loads(own.read_text()))))
    with pytest.raises(TraceFormatError):
        graphtrace.load(str(saved))
    result = run_cli("show", str(saved))
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stderr.count("\n") <= 2


def test_absurd_nesting_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "M_graphtrace.json").write_text("[" * 100_000 + "]" * 100_000)
    result = run_cli("show", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "M_debug_tree_SUMMARY.json"
    target.write_text("old")

    def full_disk(self: Path, data: bytes) -> int:
        self.write_bytes_partly(data[:3])  # type: ignore[attr-defined]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes_partly", Path.write_bytes, raising=False)
    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(OutputPathError, match=r"cannot write .*SUMMARY.json \(7 bytes\): No space left"):
        write_atomic(target, "new one")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_meta_tensors_are_recorded_without_statistics() -> None:
    model = _model().to("meta")
    trace = graphtrace.capture(model, torch.ones(1, 4, device="meta"))
    out = trace.root.outputs
    assert out.shape == (1, 2) and out.device == "meta" and out.stats is None  # type: ignore[union-attr]


def test_bundles_hold_complex_tensors(tmp_path: Path) -> None:
    class Rotary(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.polar(torch.ones_like(x), x)

    x = torch.linspace(0, 1, 6).reshape(2, 3)
    trace = graphtrace.capture(Rotary(), x, path=tmp_path, values="bundle")
    from graphtrace.io.tensors import load_tensor

    record = trace.root.outputs
    assert record.dtype == "torch.complex64"  # type: ignore[union-attr]
    assert torch.equal(load_tensor(tmp_path, record.file), torch.polar(torch.ones_like(x), x))  # type: ignore[union-attr]


def test_crafted_trace_files_never_crash_the_loader(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random JSON in place of parts of a real trace file: loading either works or raises TraceFormatError, and
    never reads a file outside the directory."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    base = tmp_path_factory.mktemp("fuzz")
    graphtrace.capture(_model(), torch.ones(1, 4), path=base / "trace", values="safetensors")
    own = next((base / "trace").glob("*_graphtrace.json"))
    original = json.loads(own.read_text())
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats()
        | st.text(max_size=20)
        | st.sampled_from(
            ["../x.safetensors", "/etc/passwd", "./Sequential_outputs.safetensors#k", "..", "NaN", "tensor"]
        )
    )
    values = st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    ["tensor", "file", "shape", "path", "children", "kwargs", "args", "dtype", "stats", "x"]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=20,
    )

    def places(node: object, trail: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        found = [trail]
        if isinstance(node, dict):
            for key, item in node.items():
                found += places(item, (*trail, key))
        elif isinstance(node, list):
            for k, item in enumerate(node):
                found += places(item, (*trail, k))
        return found

    spots = places(original)

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(spots) - 1), values)
    def load_crafted(spot: int, value: object) -> None:
        crafted = json.loads(json.dumps(original))
        trail = spots[spot]
        if not trail:
            crafted = value
        else:
            holder = crafted
            for step in trail[:-1]:
                holder = holder[step]  # type: ignore[index]
            holder[trail[-1]] = value  # type: ignore[index]
        own.write_text(json.dumps(crafted))
        try:
            trace = graphtrace.load(str(own.parent))
        except TraceFormatError:
            return
        for node in trace.walk():
            for _, record in (*node.input_tensors(), *node.output_tensors()):
                if record.file is not None:
                    assert ".." not in record.file and not record.file.startswith("/")

    load_crafted()


def test_an_interrupted_forward_keeps_its_partial_trace() -> None:
    class Interrupted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.a(x)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as raised:
        graphtrace.capture(Interrupted(), torch.ones(1, 2), strategy="eager")
    trace = raised.value.graphtrace_trace  # type: ignore[attr-defined]
    assert [child.id for child in trace.root.children] == ["Interrupted.a@0"]
    assert trace.root.error == "KeyboardInterrupt"
    with pytest.raises(KeyboardInterrupt) as raised:  # under fx, even when it comes while a module is traced
        graphtrace.capture(Interrupted(), torch.ones(1, 2))
    assert raised.value.graphtrace_trace.root.error == "KeyboardInterrupt"  # type: ignore[attr-defined]


def test_an_over_long_module_name_gets_a_short_file_name(tmp_path: Path) -> None:
    name = "block_" + "x" * 244
    model = nn.Sequential()
    model.add_module(name, nn.Linear(2, 2))
    trace = graphtrace.capture(model, torch.ones(1, 2), path=tmp_path, values="safetensors")
    node = trace.find(f"Sequential.{name}")
    record = node.outputs
    assert node.path.endswith(name)  # the full name stays in the trace
    assert record.file is not None and len(record.file) < 210  # type: ignore[union-attr]
    from graphtrace.io.tensors import load_tensor

    assert load_tensor(tmp_path, record.file).shape == (1, 2)  # type: ignore[union-attr]
    again = graphtrace.capture(model, torch.ones(1, 2), path=tmp_path / "again", values="safetensors")
    assert again.find(f"Sequential.{name}").outputs.file == record.file  # type: ignore[union-attr]


def test_two_threads_capturing_one_model_are_told_and_leave_no_residue() -> None:
    import threading

    model = _model()
    forwards = {name: module.forward for name, module in model.named_modules()}
    entered, release = threading.Event(), threading.Event()

    class Blocking(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            assert release.wait(timeout=30)
            return self.inner(x)

    outer = Blocking()
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(graphtrace.capture(outer, torch.ones(1, 4))))
    worker.start()
    assert entered.wait(timeout=30)
    try:
        with pytest.raises(graphtrace.errors.InvalidOptionError, match="being captured by another thread"):
            graphtrace.capture(outer, torch.ones(1, 4))
    finally:
        release.set()
        worker.join(timeout=60)
    assert len(results) == 1 and len(list(results[0].walk())) == 5  # type: ignore[attr-defined]
    assert {name: module.__dict__.get("forward") for name, module in model.named_modules()} == dict.fromkeys(forwards)
    assert len(list(graphtrace.capture(outer, torch.ones(1, 4)).walk())) == 5  # free again afterwards


def test_two_threads_capturing_two_models_under_fx() -> None:
    import threading

    models = [_model(), _model()]
    results: list[int] = []
    errors: list[BaseException] = []

    def run(model: nn.Module) -> None:
        try:
            for _ in range(3):
                results.append(len(list(graphtrace.capture(model, torch.ones(1, 4)).walk())))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(model,)) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and results == [4] * 6


@pytest.mark.parametrize("values", ["safetensors", "bundle"])
def test_a_write_failing_mid_forward_leaves_no_partial_file_and_no_reference_to_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, values: str
) -> None:
    from safetensors import safe_open

    import graphtrace.io.tensors as tensors

    real_write, writes = tensors._write_at, []

    def file_too_large(fd: int, data: memoryview, offset: int) -> None:
        writes.append(offset)
        if len(writes) == 5:  # half of the tensor goes to disk, then the file system refuses
            real_write(fd, data[: len(data) // 2], offset)
            raise OSError(27, "File too large")
        real_write(fd, data, offset)

    monkeypatch.setattr(tensors, "_write_at", file_too_large)
    target = tmp_path / "trace"
    with pytest.raises(OutputPathError, match="File too large"):
        graphtrace.capture(_model(), torch.ones(1, 4), path=target, values=values)  # type: ignore[arg-type]
    for file in target.glob("*.safetensors"):  # what is left is whole
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open is no mapping)
                handle.get_tensor(key)
    trace = graphtrace.load(target)
    referenced = [record.file for node in trace.walk() for _, record in [*node.input_tensors(), *node.output_tensors()]]
    assert any(file is None for file in referenced)  # the lost values are recorded without a file
    for file in filter(None, referenced):
        assert (target / file.split("#")[0]).is_file(), file
    assert not list(target.glob(".*.tmp"))


def test_a_failed_drawing_leaves_the_old_picture(saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svg = next(saved.glob("*_call_graph.svg"))
    before = svg.read_bytes()
    assert before.rstrip().endswith(b"</svg>")
    fake = tmp_path / "bin"
    fake.mkdir()
    dot = fake / "dot"  # a Graphviz killed halfway through its picture
    dot.write_text('#!/bin/sh\nwhile [ "$1" != -o ]; do shift; done\nprintf "<svg half" > "$2"\nkill -9 $$\n')
    dot.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.warns(UserWarning, match="could not draw"):
        graphtrace.load(saved).save(saved)
    assert svg.read_bytes() == before
    assert not list(saved.glob(".*.tmp"))


def test_files_written_whole_get_the_modes_open_would_give(saved: Path) -> None:
    """A temporary file is owner-only; the renamed file gets what the umask allows, like every other file."""
    mask = os.umask(0)
    os.umask(mask)
    for name in ("*_call_graph.dot", "*_call_graph.svg", "*_debug_tree_SUMMARY.json", "*_graphtrace.json"):
        file = next(saved.glob(name))
        assert file.stat().st_mode & 0o777 == 0o666 & ~mask, name
