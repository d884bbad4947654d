"""A trace directory: the transformers spec files, graphtrace's own file, and the safetensors values.

Layout of ``save_trace(trace, d)`` for a trace of one step::

    d/{Class}_debug_tree_FULL_TENSORS.json   transformers format (values: repr lines or ./file.safetensors)
    d/{Class}_debug_tree_SUMMARY.json        transformers format, without values
    d/{Class}_graphtrace.json                graphtrace's own file: the whole trace, for show/render/diff
    d/*.safetensors                          full values when captured with values="safetensors"

A trace of several steps (several top-level forward calls) puts each step's spec files and values in ``d/step_{i}/``
and one ``{Class}_graphtrace.json`` holding all steps in ``d``. When several ranks of a torch.distributed job record,
each rank's trace directory is ``d/rank_{r}/``. The call graph beside them is drawn by ``graphtrace.saving`` (io and
render do not import each other).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from graphtrace.errors import OutputPathError, TraceFormatError
from graphtrace.files import replacing
from graphtrace.io.safe_paths import (
    check_model_class,
    check_regular_file,
    inside,
    make_subdirectory,
    read_json_file,
    resolved,
    write_atomic,
)
from graphtrace.io.safetensors_format import split_reference
from graphtrace.io.spec_json import FULL_SUFFIX, SUMMARY_SUFFIX, read_spec_file, write_spec_files
from graphtrace.io.trace_json import trace_from_json, trace_text
from graphtrace.model import CallNode, TensorRecord, Trace, TraceMeta

__all__ = [
    "OWN_SUFFIX",
    "find_trace_file",
    "load_trace",
    "prepare_directory",
    "rank_directory",
    "save_trace",
    "step_directory",
    "stored_step_directory",
    "referenced_files",
]

OWN_SUFFIX = "_graphtrace.json"


def prepare_directory(path: str | os.PathLike[str], *, what: str = "trace directory") -> Path:
    """Create ``path`` if needed and check that files can be written in it; raise :class:`OutputPathError` else."""
    directory = Path(path)
    try:
        if directory.exists() and not directory.is_dir():
            raise OutputPathError(f"{what} {str(directory)!r} is a file, not a directory; pass a directory path.")
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        remedy = "Choose a directory you can write to."
        if exc.errno == errno.ENAMETOOLONG:
            remedy = "A name in the path is longer than the file system allows (255 bytes on most): shorten it."
        raise OutputPathError(f"cannot write into {what} {str(directory)!r}: {exc.strerror or exc}. {remedy}") from exc
    return directory


def step_directory(directory: Path, step: int, steps: int) -> Path:
    """Where step ``step`` of ``steps`` keeps its spec files and values."""
    return directory if steps == 1 else directory / f"step_{step}"


def stored_step_directory(directory: str | os.PathLike[str], step: int, steps: int) -> Path:
    """Where step ``step`` of a saved trace in ``directory`` keeps its values, checked to lie inside ``directory``:
    a ``step_{i}`` that is a link to another folder would have its references checked against that folder."""
    folder = step_directory(Path(directory), step, steps)
    return folder if steps == 1 else inside(directory, folder.name)


def rank_directory(directory: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its trace when several ranks record."""
    return Path(directory) / f"rank_{rank}"


def _all_tensors(root: CallNode) -> Iterator[TensorRecord]:
    for call in root.walk():
        for _, record in call.input_tensors():
            yield record
        for _, record in call.output_tensors():
            yield record


def referenced_files(node: CallNode) -> set[str]:
    """The safetensors files (``./name.safetensors``) the node and its subtree point at (a bundle's shard once)."""
    return {split_reference(record.file)[0] for record in _all_tensors(node) if record.file is not None}


def _bundle_indexes(directory: Path, files: set[str]) -> set[str]:
    """The index files beside the bundles among ``files`` (values="bundle")."""
    return {f"{file}.index.json" for file in files if (directory / f"{file}.index.json").is_file()}


def save_trace(trace: Trace, directory: str | os.PathLike[str]) -> list[str]:
    """Write ``trace`` into ``directory`` (layout in the module docstring); returns the paths written.

    A trace captured with ``prune_layers`` is saved pruned, graphtrace's own file included; safetensors files that
    only the pruned calls referenced are removed from where capture streamed them."""
    target = prepare_directory(directory)
    source = Path(trace.directory) if trace.directory else None
    full = trace
    if trace.meta.prune_layers:
        trace = trace.with_pruned_layers()
    steps = len(trace.steps)
    kept = [referenced_files(step) if source else set() for step in trace.steps]
    # every value file is found (and every reference checked) before anything is written
    copies = [
        _value_files(kept[i], stored_step_directory(source, i, steps), step_directory(target, i, steps))
        if source
        else []
        for i in range(steps)
    ]
    written: list[Path] = []
    for i, step in enumerate(trace.steps):
        out = step_directory(target, i, steps)
        if out != target:
            make_subdirectory(out)
        written += write_spec_files(step, out, trace.meta.model_class)
        for src, dst in copies[i]:
            if src != dst:
                _copy_value(src, dst)
            written.append(dst)
        if full is not trace and source is not None and step_directory(source, i, steps).resolve() == out.resolve():
            for file in referenced_files(full.steps[i]) - kept[i]:  # only the pruned calls' files
                inside(out, file).unlink(missing_ok=True)
    own = target / f"{check_model_class(trace.meta.model_class)}{OWN_SUFFIX}"
    written.append(write_atomic(own, trace_text(trace)))
    return [str(path) for path in written]


def _value_files(kept: set[str], from_dir: Path, out: Path) -> list[tuple[Path, Path]]:
    """(source, target) of each value file in ``kept`` (a step's references), bundle indexes included. A reference
    is resolved inside each directory (a hostile one reads and writes nowhere), and a file the trace refers to but
    lacks is the trace's fault, said before anything is written."""
    pairs = []
    for file in sorted(kept | _bundle_indexes(from_dir, kept)):
        src, dst = inside(from_dir, file), inside(out, file)
        if src != dst and src.exists():
            check_regular_file(src)  # copying a FIFO would wait for a writer, a device never end
        elif src != dst:
            raise TraceFormatError(
                f"the trace refers to {file}, which is missing from {str(from_dir)!r}; copy the trace directory "
                "with all its .safetensors files."
            )
        pairs.append((src, dst))
    return pairs


def _copy_value(source: Path, target: Path) -> None:
    """Copy a value file whole or not at all (OutputPathError when it cannot be written)."""
    try:
        with replacing(target) as temporary:
            shutil.copyfile(source, temporary)
    except OSError as exc:
        raise OutputPathError(
            f"cannot copy {source.name} into {str(target.parent)!r}: {exc.strerror or exc}. Free some space or "
            "choose another directory."
        ) from exc


def find_trace_file(path: str | os.PathLike[str]) -> Path:
    """The file to load for ``path``: a graphtrace or spec file itself, or the one such file in a directory."""
    candidate = Path(path)
    if candidate.exists() and not candidate.is_dir():
        return candidate  # a FIFO or device is refused when read, with what it is
    if not candidate.is_dir():
        raise TraceFormatError(f"no trace at {str(candidate)!r}: no such file or directory")
    for suffix in (OWN_SUFFIX, SUMMARY_SUFFIX, FULL_SUFFIX):
        found = sorted(candidate.glob(f"*{suffix}"))
        if len(found) == 1:
            return _inside_trace(candidate, found[0])
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise TraceFormatError(
                f"{str(candidate)!r} holds traces of several models ({names}); pass the file of the one you want."
            )
    ranks = sorted(p.name for p in candidate.glob("rank_*") if p.is_dir())
    if ranks:
        raise TraceFormatError(
            f"{str(candidate)!r} holds one trace per rank ({', '.join(ranks)}); pass the folder of the rank you want, "
            f"e.g. {str(candidate / ranks[0])!r}."
        )
    raise TraceFormatError(
        f"{str(candidate)!r} holds no trace: expected a *{OWN_SUFFIX} file (graphtrace) or a *{SUMMARY_SUFFIX} "
        "file (transformers' model_addition_debugger_context)."
    )


def _inside_trace(directory: Path, file: Path) -> Path:
    """``file``, found in the trace directory ``directory``, if it stays inside it once links are resolved: a trace
    file linked from elsewhere would make the directory show a trace it does not hold."""
    if not resolved(file).is_relative_to(resolved(directory)):
        raise TraceFormatError(
            f"{file} is a link to {resolved(file)}, outside the trace directory {str(directory)!r}; a trace directory "
            "holds its own files (copy the file in, or pass the file itself)."
        )
    return file


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace directory or file written by graphtrace, or by transformers' ``model_addition_debugger_context``
    (then only what that format holds is known: no call types, strategies, counts of non-finite values)."""
    file = find_trace_file(path)
    try:
        trace = _load_file(file)
        check_model_class(trace.meta.model_class)
        for step in trace.steps:  # each file once: a crafted trace may name one file from millions of records
            for reference in sorted(referenced_files(step)):
                inside(file.parent, reference)
    except TraceFormatError as exc:
        if str(file) in str(exc):
            raise
        raise TraceFormatError(f"{file}: {exc}") from exc  # which file of the directory is at fault
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
        # a crafted or damaged file: one line that says so, never a traceback
        what = "too deeply nested" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {str(exc)[:120]}"
        raise TraceFormatError(f"{file} is not a trace graphtrace can read ({what}).") from exc
    return trace


def _load_file(file: Path) -> Trace:
    directory = str(file.parent)
    if file.name.endswith(OWN_SUFFIX):
        return trace_from_json(read_json_file(file), directory)
    if file.name.endswith(SUMMARY_SUFFIX):
        full = file.with_name(file.name[: -len(SUMMARY_SUFFIX)] + FULL_SUFFIX)
        if full.is_file() and resolved(full).is_relative_to(resolved(file.parent)):
            file = full  # the values beside the summary, unless a link leads elsewhere
    model_class = file.name.rsplit("_debug_tree_", 1)[0]
    root = read_spec_file(file)
    has_values = any(record.value is not None for record in _all_tensors(root))
    has_files = bool(referenced_files(root))
    meta = TraceMeta(
        model_class=model_class,
        values="safetensors" if has_files else ("repr" if has_values else "none"),
        strategy="unknown",
    )
    return Trace(steps=(root,), meta=meta, directory=directory)
