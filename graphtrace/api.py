"""The scripting API: :func:`capture` for one forward, :func:`tracing` for anything that calls the model.

Options are validated here, once, before the model runs. Capture leaves nothing behind: every patched ``forward`` is
restored, torch's print options and the caller's grad mode are untouched, also when the forward raises. When it
raises, the calls recorded so far are kept (and saved, when a path was given), the failing call is marked, and the
original exception propagates with a note saying where the partial trace is.

In a torch.distributed job only the chosen ``ranks`` record (rank 0 by default, as transformers); the others attach
nothing and run the model untouched. graphtrace never communicates between ranks, so it cannot make one wait.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, get_args, overload

import torch
from torch import nn

from graphtrace.coverage import describe_fallbacks
from graphtrace.engine import PatchLedger, Recorder, attach
from graphtrace.engine.collector import CollectorPause
from graphtrace.engine.distributed import current_rank, world_size
from graphtrace.engine.eager import forward_hooks, module_paths, parameter_counts
from graphtrace.errors import FxCaptureError, InvalidInputsError, InvalidModelError, InvalidOptionError, OutputPathError
from graphtrace.io.safe_paths import make_subdirectory
from graphtrace.io.tensors import BundleSink, ReprSink, SafetensorsSink
from graphtrace.io.trace_files import prepare_directory, rank_directory
from graphtrace.model import Trace, TraceMeta, without_files
from graphtrace.progress import Progress, directory_bytes, human_bytes
from graphtrace.saving import save
from graphtrace.version import __version__

__all__ = ["Ranks", "Session", "Strategy", "Values", "capture", "check_model", "normalize_inputs", "tracing"]

Values = Literal["repr", "safetensors", "bundle", "none"]
"""What the trace keeps of each tensor beyond its statistics: repr lines, a safetensors file per tensor, one
safetensors file (a bundle) per forward call, or nothing."""

Strategy = Literal["auto", "fx", "eager"]
"""How module calls are captured: torch.fx where trustworthy else forward wrapping, fx only, or wrapping only."""

Ranks = int | Literal["all"] | Sequence[int]
"""Which ranks of a torch.distributed job record: one rank (it writes into ``path``), or ``"all"`` or a list of
ranks (each writes into ``path/rank_{r}/``)."""


def check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise InvalidModelError(
            f"graphtrace traces a torch.nn.Module, got {type(model).__module__}.{type(model).__qualname__}. "
            "Pass the model object itself (for a pipeline, its .model)."
        )
    return model


def normalize_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` for a forward: from a mapping of keyword arguments, a tuple of positional ones, a single
    tensor, or None (no arguments)."""
    if inputs is None:
        return (), {}
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, tuple):
        return inputs, {}
    if isinstance(inputs, Mapping):
        bad = [key for key in inputs if not isinstance(key, str)]
        if bad:
            raise InvalidInputsError(
                f"keyword-argument inputs need string keys; got {bad[0]!r} ({type(bad[0]).__name__}). "
                "Use the forward's parameter names as keys."
            )
        return (), dict(inputs)
    raise InvalidInputsError(
        f"inputs of type {type(inputs).__qualname__} cannot be passed to a forward. Pass a dict of keyword "
        "arguments (e.g. a tokenizer's output), a tuple of positional arguments (e.g. (x,) or ([a, b],)), "
        "or a single tensor."
    )


def _check_choice(option: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidOptionError(f"{option}={value!r} is not one of {', '.join(map(repr, allowed))}.")


def _check_bool(option: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{option} must be True or False, got {value!r}.")


def _check_ranks(ranks: Any) -> frozenset[int] | None:
    """The ranks that record (None: every rank), each checked against this job's world size."""
    if ranks == "all":
        return None
    collection = isinstance(ranks, (list, tuple, range, set, frozenset))
    chosen = [ranks] if isinstance(ranks, int) else list(ranks) if collection else None
    if not chosen or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in chosen):
        raise InvalidOptionError(
            f"ranks={ranks!r} is not a rank, a list of ranks or 'all'. Pass ranks=0 (rank 0 records, the default), "
            "ranks=[0, 1], or ranks='all' (every rank writes into path/rank_{r}/)."
        )
    size = world_size()
    outside = sorted(r for r in chosen if r >= size)
    if outside:
        job = f"a job of {size} processes" if size > 1 else "one process (torch.distributed is not initialized)"
        raise InvalidOptionError(
            f"ranks={ranks!r} names rank {outside[0]}, but this is {job}. Initialize the process group before "
            "tracing, or pass ranks='all' to record on every rank there is."
        )
    return frozenset(chosen)


class Session:
    """A capture in progress; after the ``with`` block, :attr:`trace` holds what was recorded (also on error).

    ``single_call`` is capture()'s session: one call of the model, its value files straight in the directory and
    its partial trace carried by the exception; tracing()'s session records any number of calls, each step's files
    in a ``step_N`` folder (moved up when there was only one)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        path: str | os.PathLike[str] | None,
        values: Values,
        prune_layers: bool,
        strategy: Strategy,
        ops: bool,
        single_call: bool,
        recording_ranks: frozenset[int] | None = frozenset({0}),
        rank_folders: bool = False,
        modules: tuple[str, ...] = (),
        progress: bool | None = None,
    ) -> None:
        self.model = model
        self.values = values
        self.prune_layers = prune_layers
        self.strategy = strategy
        self.ops = ops
        self.single_call = single_call
        self.rank = current_rank()
        self.recording = recording_ranks is None or self.rank in recording_ranks
        self.directory: Path | None = None
        if path is not None and self.recording:  # a rank that does not record touches nothing
            self.directory = prepare_directory(path)
            if rank_folders:
                self.directory = make_subdirectory(rank_directory(path, self.rank))
        self.trace: Trace | None = None
        self._sink = self._make_sink() if self.recording else None
        self._recorder = Recorder(
            self._sink,
            on_step_start=self._on_step_start,
            detached_steps=True,
            step_caches=True,
            prune_layers=prune_layers,
            select=_selector(modules) if modules else None,
            sketches=values in ("repr", "none"),  # no files to compare values by: a fingerprint of each tensor
        )
        self._attachment: AbstractContextManager[dict[str, str]] | None = None
        self._fallbacks: dict[str, str] = {}
        self._hooks: dict[str, tuple[str, ...]] = {}
        self._saving = False
        # capture()'s one call: the collector waits from patching to saving (see engine/collector.py)
        self._collector = CollectorPause()
        self._progress = Progress(self._progress_text, enabled=progress if self.recording else False)

    def _progress_text(self) -> str:
        text = f"graphtrace: {self._recorder.calls:,} calls recorded"
        if self.directory is not None:
            text += f", {human_bytes(directory_bytes(self.directory))} written"
        return text + (", saving" if self._saving else "")

    def _make_sink(self) -> ReprSink | SafetensorsSink | BundleSink | None:
        if self.values == "repr":
            return ReprSink()
        if self.values in ("safetensors", "bundle"):
            assert self.directory is not None
            if self.values == "bundle":
                return BundleSink(self.directory, type(self.model).__name__)
            return SafetensorsSink(self.directory)
        return None

    def _on_step_start(self, step: int) -> None:
        if isinstance(self._sink, (SafetensorsSink, BundleSink)) and not self.single_call:
            assert self.directory is not None
            self._sink.finish()  # the previous step's files are complete
            self._sink.directory = make_subdirectory(self._streaming_folder(step))

    def __enter__(self) -> Session:
        if not self.recording:
            return self
        if self.single_call:
            self._collector.hold()
        try:
            self._hooks = {path: hooks for path, module in module_paths(self.model) if (hooks := forward_hooks(module))}
            attachment = recording(self.model, self._recorder, strategy=self.strategy, ops=self.ops)
            self._progress.start()
            try:
                self._fallbacks = attachment.__enter__()
            except BaseException:
                self._progress.stop()
                raise
        except BaseException:
            self._collector.release_all()
            raise
        self._attachment = attachment
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._finish(exc)
        finally:
            try:
                self._progress.stop()
            finally:  # also when stopping the progress line was interrupted
                self._collector.release_all()
                self._release()

    def _release(self) -> None:
        """Break the cycles of a finished session (its recorder and progress line call back into it): a trace the
        user drops is then freed at once, with the recorder's bookkeeping, not at some later garbage collection."""
        self._recorder.on_step_start = None
        self._progress.describe = str
        self._attachment = None

    def _finish(self, exc: BaseException | None) -> None:
        self._saving = True
        try:
            if self._attachment is not None:
                self._attachment.__exit__(None, None, None)  # every patch put back, the model released
        finally:
            self.trace = self._build_trace()
            unwritten = self._close_sink()
            self._drop_lost_references()
        saved = True
        if self.directory is not None and self.recording:
            try:
                self._settle_step_folders()
                save(self.trace, self.directory)
            # A boundary: with the forward's own exception in flight, a save that fails for any reason must not
            # replace it; without one, the save's error is re-raised as it is.
            except Exception as save_error:
                if exc is None:
                    raise
                # The forward's own exception is what the user must see; the failed save rides along as a note.
                exc.add_note(f"graphtrace: the partial trace could not be saved to {self.directory}: {save_error}")
                saved = False
        if exc is not None and self.recording:
            exc.add_note(self._failure_note(saved))
            if unwritten is not None:
                exc.add_note(f"graphtrace: {unwritten}")
        elif unwritten is not None:
            raise unwritten
        elif self.strategy == "fx" and self.trace.fallbacks:
            raise self._fx_error()

    def _close_sink(self) -> OutputPathError | None:
        """Wait for every streamed tensor and stop the writer's thread; a failed write is returned, to be raised once
        the trace is saved."""
        if self._sink is not None:
            try:
                self._sink.close()
            except OutputPathError as error:
                return error
        return None

    def _streaming_folder(self, step: int) -> Path:
        """Where a step's value files are streamed while the forward runs (moved up later when there was one)."""
        assert self.directory is not None
        return self.directory if self.single_call else self.directory / f"step_{step}"

    def _drop_lost_references(self) -> None:
        """Records whose value could not be written (the sink removed the partial file) point at nothing: their
        ``file`` goes, so that no saved record names a file that is missing or truncated."""
        lost = self._sink.lost if isinstance(self._sink, (SafetensorsSink, BundleSink)) else {}
        if not lost or self.trace is None or self.directory is None:
            return
        steps = tuple(
            without_files(step, lost.get(self._streaming_folder(i), set())) for i, step in enumerate(self.trace.steps)
        )
        self.trace = dataclasses.replace(self.trace, steps=steps)

    def _fx_error(self) -> FxCaptureError:
        """strategy="fx" with modules fx could not serve: raised once the forward has run (nothing was disturbed:
        those modules were captured by forward wrapping) and the trace is kept."""
        assert self.trace is not None
        fallbacks = dict(self.trace.fallbacks)
        kept = f"saved to {self.directory}" if self.directory is not None else "kept on this error's .trace"
        lines = "\n".join(f"  {line}" for line in describe_fallbacks(fallbacks))
        return FxCaptureError(
            f"strategy='fx': torch.fx could not serve {len(fallbacks)} module{'s' if len(fallbacks) != 1 else ''}:"
            f"\n{lines}\nThe trace, with these modules captured by forward wrapping, is {kept}. Use "
            "strategy='auto' to accept that, or strategy='eager' to skip torch.fx.",
            fallbacks,
            self.trace,
        )

    def _settle_step_folders(self) -> None:
        """A session that streamed values into step_0/ and ran one step moves them up into the directory."""
        assert self.trace is not None and self.directory is not None
        if self.single_call or not isinstance(self._sink, (SafetensorsSink, BundleSink)) or len(self.trace.steps) != 1:
            return
        step0 = self.directory / "step_0"
        if step0.is_dir():
            for item in step0.iterdir():
                target = self.directory / item.name
                try:  # a rename replaces a link planted under the name (shutil.move would move into its target)
                    os.replace(item, target)
                except OSError as exc:
                    raise OutputPathError(
                        f"cannot move {item.name} from {str(step0)!r} into {str(self.directory)!r}: "
                        f"{exc.strerror or exc}. Remove what holds the name {str(target)!r}, or save elsewhere."
                    ) from exc
            step0.rmdir()

    def _failure_note(self, saved: bool) -> str:
        assert self.trace is not None
        failed = self.trace.failed_call()
        if self.directory is not None and saved:
            where = f"saved to {self.directory}"
        elif self.single_call:
            where = "kept on this exception's .graphtrace_trace"
        else:
            where = "kept in the session's .trace"
        calls = sum(1 for _ in self.trace.walk())
        culprit = f"; the call that raised: {failed.id}" if failed is not None else ""
        return f"graphtrace: partial trace of {calls} calls {where}{culprit}"

    def _build_trace(self) -> Trace:
        meta = TraceMeta(
            model_class=type(self.model).__name__,
            values=self.values,
            strategy=self.strategy,
            ops=self.ops,
            prune_layers=self.prune_layers,
            rank=self.rank,
            world_size=world_size(),
            graphtrace_version=__version__,
            torch_version=torch.__version__,
            created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )
        directory = str(self.directory) if self.directory is not None else None
        recorder = self._recorder
        return Trace(
            steps=tuple(recorder.steps),
            meta=meta,
            fallbacks=dict(self._fallbacks),
            directory=directory,
            step_info=tuple(recorder.step_info),
            parameters=parameter_counts(self.model),
            hooks=self._hooks,
        )


@contextmanager
def tracing(
    model: nn.Module,
    *,
    path: str | os.PathLike[str] | None = None,
    values: Values = "repr",
    prune_layers: bool = False,
    strategy: Strategy = "auto",
    ops: bool = False,
    ranks: Ranks = 0,
    modules: Sequence[str] | None = None,
    progress: bool | None = None,
) -> Iterator[Session]:
    """Record every forward call of ``model`` made inside the block (``generate()`` included), one step each.

    With ``path``, the trace is saved there when the block ends (each step in ``step_{i}/`` when there are several).
    ``values="safetensors"`` streams tensors to ``path`` while the forward runs and needs it. A submodule called on
    its own (the encoder that ``generate()`` runs first) is a step too. Each step's :class:`~graphtrace.model.StepInfo`
    says whether it was a prefill or a decoding step and what the key/value cache held after it. ``ranks`` chooses
    which ranks of a torch.distributed job record; ``modules`` and ``progress`` as :func:`capture`.
    """
    session = _session(model, path, values, prune_layers, strategy, ops, ranks, modules, progress, single_call=False)
    with session:
        yield session


@overload
def capture(
    model: nn.Module,
    inputs: Any = None,
    *,
    path: str | os.PathLike[str] | None = None,
    values: Values = "repr",
    prune_layers: bool = False,
    strategy: Strategy = "auto",
    ops: bool = False,
    ranks: Ranks = 0,
    modules: Sequence[str] | None = None,
    return_output: Literal[False] = False,
    progress: bool | None = None,
) -> Trace: ...


@overload
def capture(
    model: nn.Module,
    inputs: Any = None,
    *,
    path: str | os.PathLike[str] | None = None,
    values: Values = "repr",
    prune_layers: bool = False,
    strategy: Strategy = "auto",
    ops: bool = False,
    ranks: Ranks = 0,
    modules: Sequence[str] | None = None,
    return_output: Literal[True],
    progress: bool | None = None,
) -> tuple[Trace, Any]: ...


def capture(
    model: nn.Module,
    inputs: Any = None,
    *,
    path: str | os.PathLike[str] | None = None,
    values: Values = "repr",
    prune_layers: bool = False,
    strategy: Strategy = "auto",
    ops: bool = False,
    ranks: Ranks = 0,
    modules: Sequence[str] | None = None,
    return_output: bool = False,
    progress: bool | None = None,
) -> Trace | tuple[Trace, Any]:
    """Run ``model`` once on ``inputs`` under ``torch.no_grad()`` and return the trace of every module call.

    ``inputs`` is a dict of keyword arguments, a tuple of positional arguments, or a single tensor. With ``path``
    the trace is also saved there (the transformers files, graphtrace's own file, the call graph). ``values``
    chooses what FULL_TENSORS holds: ``"repr"`` lines (the default, as transformers), ``"safetensors"`` files
    streamed to ``path`` during the forward, or ``"none"``. ``prune_layers`` keeps only the first and last of
    repeated layer blocks, as transformers' ``do_prune_layers``.

    In a torch.distributed job, ``ranks`` chooses who records: one rank (``0``, the default, as transformers; it
    writes into ``path``), a list of ranks or ``"all"`` (each writes into ``path/rank_{r}/``). The other ranks attach
    nothing and write nothing; their trace has no steps. A DTensor is recorded by its local shard, with its
    placements, mesh shape and global shape in graphtrace's own file.

    ``modules`` records only the calls of the modules whose path (relative to the model, ``"model.layers.0"``)
    matches one of its glob patterns (``["model.layers.0", "lm_head"]``, ``["model.layers.*.mlp"]``), with
    everything inside them (their submodules and, with ``ops``, their ops). The modules around them stay in the tree
    as structural nodes (path, type and children; no inputs, no outputs), so the trace is walked, shown and drawn as
    usual; every other call is left out. A pattern that matches no module is an error.

    ``return_output=True`` returns ``(trace, output)``: the model's own output, so that it need not run twice.

    ``progress`` shows a line on stderr while a long capture and its save run (calls recorded, bytes written):
    None (the default) when stderr is a terminal, True always, False never.

    When the forward raises, the exception propagates with a note; the partial trace (the call that raised marked)
    is saved to ``path`` if given and is always on the exception as ``exc.graphtrace_trace``.
    """
    args, kwargs = normalize_inputs(inputs)
    if not isinstance(return_output, bool):
        raise InvalidOptionError(f"return_output must be True or False, got {return_output!r}.")
    session = _session(model, path, values, prune_layers, strategy, ops, ranks, modules, progress, single_call=True)
    try:
        with session, torch.no_grad():
            output = model(*args, **kwargs)
    except BaseException as exc:  # KeyboardInterrupt too: an interrupted forward keeps what it recorded
        # capture() has no session to hand back: the partial trace travels on the exception (see the note).
        with suppress(AttributeError, TypeError):
            exc.graphtrace_trace = session.trace  # type: ignore[attr-defined]
        raise
    assert session.trace is not None
    return (session.trace, output) if return_output else session.trace


@contextmanager
def recording(
    model: nn.Module,
    recorder: Recorder,
    *,
    strategy: str = "eager",
    ops: bool = False,
    root_no_grad: bool = True,
    after_hooks: bool = True,
) -> Iterator[dict[str, str]]:
    """``model``'s calls reach ``recorder`` inside the block; yields the fx fallbacks (module path -> reason), filled
    as the model runs. The one wiring of every capture (capture(), tracing(), the transformers shim): the model is
    claimed for this thread, captures run one at a time, and every patch is put back on exit, also on error. With
    ``after_hooks`` (all but the shim), a call is recorded as its caller sees it, after its forward hooks."""
    _claim(model)
    try:
        with _ONE_CAPTURE:
            ledger = PatchLedger()
            ledger.on_restore(recorder.close)
            try:
                recorder.collector.hold()  # the wrappers live as long as the capture: no collection scans them now
                try:
                    fallbacks = attach(
                        model,
                        recorder,
                        ledger,
                        strategy=strategy,
                        ops=ops,
                        root_no_grad=root_no_grad,
                        after_hooks=after_hooks,
                    )
                finally:
                    recorder.collector.release()
                yield fallbacks
            finally:
                ledger.restore()
    finally:
        _release(model)


_ONE_CAPTURE = threading.RLock()
"""Captures run one at a time in a process (a capture of another model nested in a forward goes on): torch.fx
patches every module's ``__call__`` globally while it traces, so a second thread's forward would land in the first
one's trace. A forward outside any capture, in another thread, can still meet that patch: torch.fx's limit."""

_CAPTURING: dict[int, int] = {}  # id(model) -> the thread capturing it
_CAPTURING_LOCK = threading.Lock()


def _check_free(model: nn.Module) -> None:
    """A capture of ``model`` already under way is an error: in another thread both would patch the same forwards; in
    this one (the model capturing itself from inside its own forward, or a capture inside a capture of it) every
    call would be recorded twice, the inner ones mixed into the outer trace."""
    owner = _CAPTURING.get(id(model))
    if owner is None:
        return
    name = type(model).__name__
    if owner != threading.get_ident():
        raise InvalidOptionError(
            f"{name} is being captured by another thread; capture one model from one thread at a time (or capture a "
            "copy of the model)."
        )
    raise InvalidOptionError(
        f"{name} is already being captured: a capture of it started inside that capture (from its own forward?) "
        "would record every call twice, mixed into the outer trace. Capture the model once, from outside its "
        "forward; the trace holds every call (trace.find(path))."
    )


def _claim(model: nn.Module) -> None:
    """Mark ``model`` as being captured by this thread; a capture of it already under way is an error
    (:func:`_check_free`), and so is one of a model sharing modules with it."""
    with _CAPTURING_LOCK:
        _check_free(model)
        others = [other for key, other in _MODULES.items() if key != id(model)]
        if others:  # the modules are listed only when another capture is under way: nearly never
            modules = _module_ids(model)
            for other in others:
                if modules & _module_ids(other):
                    raise InvalidOptionError(
                        f"{type(model).__name__} shares modules with {type(other).__name__}, whose capture is under "
                        "way; two captures cannot record the same modules at once. Capture the outer model once and "
                        "find the call in its trace (trace.find(path)), or capture this module outside the other "
                        "capture."
                    )
        _CAPTURING[id(model)] = threading.get_ident()
        _MODULES[id(model)] = model


def _module_ids(model: nn.Module) -> frozenset[int]:
    return frozenset(id(module) for module in model.modules())


def _release(model: nn.Module) -> None:
    with _CAPTURING_LOCK:
        _CAPTURING.pop(id(model), None)
        _MODULES.pop(id(model), None)


_MODULES: dict[int, nn.Module] = {}  # id(model) under capture -> the model


def _selector(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a call path (``Class.model.layers.0``, an op's ``...#matmul``) belongs to a selected module: its path
    relative to the model matches one of ``patterns``."""

    def select(path: str) -> bool:
        relative = path.partition("#")[0].partition(".")[2]
        return any(fnmatchcase(relative, pattern) for pattern in patterns)

    return select


def _check_modules(model: nn.Module, modules: Any) -> tuple[str, ...]:
    """The glob patterns of ``modules=``, each checked to match a module of ``model``."""
    if modules is None:
        return ()
    patterns = (modules,) if isinstance(modules, str) else modules
    if not isinstance(patterns, (list, tuple)) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise InvalidOptionError(
            f"modules={modules!r} is not a list of module paths: pass glob patterns relative to the model, e.g. "
            "modules=['model.layers.0', 'lm_head'] or modules=['model.layers.*.mlp']."
        )
    names = [name for name, _ in model.named_modules() if name]
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else " model.named_modules() lists the paths."
            raise InvalidOptionError(f"modules: {pattern!r} matches no module of {type(model).__name__}.{hint}")
    return tuple(patterns)


def _session(
    model: Any,
    path: str | os.PathLike[str] | None,
    values: Any,
    prune_layers: Any,
    strategy: Any,
    ops: Any,
    ranks: Any,
    modules: Any,
    progress: Any,
    *,
    single_call: bool,
) -> Session:
    check_model(model)
    with _CAPTURING_LOCK:
        _check_free(model)  # before a directory is made for a capture that cannot run
    _check_choice("values", values, get_args(Values))
    _check_choice("strategy", strategy, get_args(Strategy))
    _check_bool("prune_layers", prune_layers)
    _check_bool("ops", ops)
    if values in ("safetensors", "bundle") and path is None:
        raise InvalidOptionError(
            f"values={values!r} streams every tensor to disk while the forward runs, so it needs path=... "
            "(a directory); or use values='repr'."
        )
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InvalidOptionError(f"path must be a directory path (str or os.PathLike), got {type(path).__name__}.")
    if progress is not None:
        _check_bool("progress", progress)
    patterns = _check_modules(model, modules)
    return Session(
        model,
        path=path,
        values=values,
        prune_layers=prune_layers,
        strategy=strategy,
        ops=ops,
        single_call=single_call,
        recording_ranks=_check_ranks(ranks),
        rank_folders=not isinstance(ranks, int),
        modules=patterns,
        progress=progress,
    )
