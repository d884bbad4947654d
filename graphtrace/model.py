"""The trace data model: plain frozen dataclasses of strings and numbers.

A :class:`Trace` can be saved, loaded, compared and rendered without torch and without the model. Capture builds it;
the writers, the renderer and the comparer only read it.

A recorded value is a :data:`Value`: a :class:`TensorRecord`, the sanitised ``repr`` of any other object (a ``str``),
a ``tuple`` of values (lists and tuples alike) or a ``dict`` of values (dicts and ``ModelOutput``s alike).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union

from graphtrace.errors import CallNotFoundError

if TYPE_CHECKING:  # pragma: no cover - networkx is render's, imported there
    import os
    from typing import TextIO

    import networkx as nx

__all__ = [
    "SCHEMA_VERSION",
    "CallKind",
    "CallNode",
    "Coverage",
    "DTensorInfo",
    "Services",
    "SourceLine",
    "Stats",
    "StepInfo",
    "TensorRecord",
    "Trace",
    "TraceMeta",
    "Value",
    "coverage_of",
    "fallback_in_words",
    "is_layer_block",
    "iter_tensors",
    "locate",
    "map_tensors",
    "offer_services",
    "services",
    "prune_layer_blocks",
    "without_files",
]

SCHEMA_VERSION = 1
"""Version of graphtrace's own trace file; bumped when a saved trace could be misread by an older reader."""

CallKind = Literal["module", "op"]


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary statistics of a floating-point tensor, as the tensor's own dtype computes them.

    ``std`` is the sample standard deviation (``correction=1``), NaN for fewer than two elements.
    """

    mean: float
    std: float
    min: float
    max: float


@dataclass(frozen=True, slots=True)
class DTensorInfo:
    """Where a DTensor's local shard (the recorded tensor) sits in the global tensor."""

    placements: str
    mesh_shape: tuple[int, ...]
    global_shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One tensor seen in a call: its metadata, statistics and, when requested, where its full value lives.

    ``spec_stats`` holds the reference's exact strings for mean, std, min and max (for float16, float32 and bfloat16
    only, as transformers writes them); ``stats`` holds the same numbers for computation, for every floating dtype.
    ``value`` holds the repr lines of the tensor (a tuple; from a capture, a sequence equal to that tuple whose lines
    are formatted with the rest of their step when first read), ``file`` the relative path of its safetensors file.
    ``sketch`` is a compact fingerprint of the values for traces that keep none: the tensor's rows (all but the last
    dimension) cut into up to 16 equal groups in order, and each group's sum, then each group's sum of squares. It is
    the same under size-1 dimensions and under any re-ordering of the last dimension, so a diff can compare it across
    such layouts.
    """

    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"
    stats: Stats | None = None
    spec_stats: tuple[str, str, str, str] | None = None
    nan_count: int = 0
    inf_count: int = 0
    value: Sequence[str] | None = None
    file: str | None = None
    dtensor: DTensorInfo | None = None
    sketch: tuple[float, ...] | None = None

    def __repr__(self) -> str:
        """One line, never the full value: ``TensorRecord([1, 7, 32] float32, mean 0.0123 std 0.998, 7 value
        lines)``."""
        parts = [self.brief()]
        if self.device != "cpu":
            parts[0] += f" on {self.device}"
        if self.stats is not None:
            stats = self.stats
            parts.append(f"mean {stats.mean:.4g} std {stats.std:.4g} min {stats.min:.4g} max {stats.max:.4g}")
        if not self.is_finite:
            parts.append(f"nan {self.nan_count} inf {self.inf_count}")
        if self.file is not None:
            parts.append(f"file {self.file}")
        elif self.value is not None:
            parts.append(f"{len(self.value)} value lines")
        return f"TensorRecord({', '.join(parts)})"

    def brief(self) -> str:
        """Shape and dtype as the tables print them: ``[1, 7, 32] float32``."""
        return f"[{', '.join(map(str, self.shape))}] {self.dtype.removeprefix('torch.')}"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_finite(self) -> bool:
        """True unless the tensor holds NaN or Inf (always true for non-floating dtypes)."""
        return self.nan_count == 0 and self.inf_count == 0

    def summary(self) -> TensorRecord:
        """The same record without its full value."""
        if self.value is None and self.file is None:
            return self
        return self.with_value(None, None)

    def with_sketch(self, sketch: tuple[float, ...] | None) -> TensorRecord:
        """The same record with the value fingerprint ``sketch``."""
        return self._copy(self.value, self.file, sketch)

    def with_value(self, value: Sequence[str] | None, file: str | None) -> TensorRecord:
        """A new record (a distinct object) with this metadata and the given full value."""
        return self._copy(value, file, self.sketch)

    def _copy(self, value: Sequence[str] | None, file: str | None, sketch: tuple[float, ...] | None) -> TensorRecord:
        # capture makes one per tensor met: built directly, as dataclasses.replace costs several times as much
        return TensorRecord(
            self.shape,
            self.dtype,
            self.device,
            self.stats,
            self.spec_stats,
            self.nan_count,
            self.inf_count,
            value,
            file,
            self.dtensor,
            sketch,
        )


Value = Union[TensorRecord, str, tuple["Value", ...], Mapping[str, "Value"]]  # noqa: UP007 (forward references)
"""A recorded input or output: a tensor record, a repr string, a tuple or a mapping of values."""


def iter_tensors(value: Value | None, name: str = "") -> Iterator[tuple[str, TensorRecord]]:
    """Every tensor inside ``value`` with its position, named like the reference names files (``_0``, ``_key``)."""
    if value is None or isinstance(value, str):
        return
    if isinstance(value, TensorRecord):
        yield name, value
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from iter_tensors(item, f"{name}_{i}")
    else:
        for key, item in value.items():
            yield from iter_tensors(item, f"{name}_{key}")


def map_tensors(value: Value | None, change: Callable[[TensorRecord], TensorRecord]) -> Value | None:
    """``value`` with every tensor record replaced by ``change(record)``, its structure kept."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, TensorRecord):
        return change(value)
    if isinstance(value, tuple):
        return tuple(map_tensors(item, change) for item in value)  # type: ignore[misc]
    return {key: map_tensors(item, change) for key, item in value.items()}  # type: ignore[misc]


def without_files(node: CallNode, files: Set[str]) -> CallNode:
    """``node`` with the references to ``files`` (a record's ``file``, as written) dropped from its records and
    its callees': for values that could not be written, so that no record points at a file that is not there."""
    if not files:
        return node

    def drop(record: TensorRecord) -> TensorRecord:
        return record.with_value(record.value, None) if record.file in files else record

    return dataclasses.replace(
        node,
        args=tuple(map_tensors(arg, drop) for arg in node.args),  # type: ignore[misc]
        kwargs={key: map_tensors(value, drop) for key, value in node.kwargs.items()},  # type: ignore[misc]
        outputs=map_tensors(node.outputs, drop),
        children=tuple(without_files(child, files) for child in node.children),
    )


@dataclass(frozen=True, slots=True)
class SourceLine:
    """Where an op was called: the user's file, line, function and the line's text (``model.py:112 in forward:
    xq = xq * freqs_cos``), so that a porter can map an op record back to code."""

    file: str
    line: int
    function: str
    text: str

    def __str__(self) -> str:
        name = self.file.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{name}:{self.line} in {self.function}: `{self.text}`" if self.text else f"{name}:{self.line}"


@dataclass(frozen=True, slots=True)
class CallNode:
    """One call of a module (or, with op recording, of a functional op) and the calls it made.

    ``path`` is the reference's ``module_path`` (``"LlamaForCausalLM.model.layers.0"``), for an op its module's path,
    ``#`` and the op's node name in the module's fx graph (``"...self_attn#matmul_1"``); ``index`` counts earlier calls
    of the same path within the same step, so ``id`` (``path@index``) is unique. ``leaf`` says whether the module has no
    child modules: the transformers format records outputs only for leaves and the root. ``outputs`` is None when
    the call raised; ``error`` then holds ``"ExceptionType: message"``. ``inputs_from`` lists the ids of the calls
    whose outputs this call received as inputs (data flow). ``strategy`` says how the call was captured
    (``"eager"`` for forward wrapping, ``"fx"`` for a traced graph). An op recorded during the real forward (the op
    tier, ``engine/ops.py``) has its ``source``: the line of user code that called it.
    """

    path: str
    index: int = 0
    type_name: str = ""
    kind: CallKind = "module"
    leaf: bool = True
    strategy: str = "eager"
    args: tuple[Value, ...] = ()
    kwargs: Mapping[str, Value] = field(default_factory=dict)
    outputs: Value | None = None
    children: tuple[CallNode, ...] = ()
    error: str | None = None
    inputs_from: tuple[str, ...] = ()
    source: SourceLine | None = None

    def __repr__(self) -> str:
        """One line: ``CallNode(LlamaForCausalLM.model.layers.1.mlp@0, LlamaMLP, -> [1, 7, 32] float32, 4 calls
        directly inside)``; its records and children are the attributes."""
        parts = [self.id]
        if self.type_name:
            parts.append(self.type_name)
        outputs = [record.brief() for _, record in self.output_tensors()]
        if outputs:
            parts.append("-> " + ", ".join(outputs[:3]) + (", ..." if len(outputs) > 3 else ""))
        if self.error is not None:
            parts.append(f"raised {self.error}")
        if self.children:
            parts.append(f"{len(self.children)} call{'s' if len(self.children) != 1 else ''} directly inside")
        return f"CallNode({', '.join(parts)})"

    @property
    def id(self) -> str:
        return f"{self.path}@{self.index}"

    @property
    def name(self) -> str:
        """A short name: the last component of the path (``"q_proj"``), the last two for a numbered block
        (``"layers.3"``), the whole path for the root; an op's name in its module's graph (``"matmul_1"`` of
        ``"...self_attn#matmul_1"``)."""
        if self.kind == "op":
            return self.path.rpartition("#")[2]
        parts = self.path.rsplit(".", 2)
        if len(parts) > 1 and parts[-1].isdigit():
            return ".".join(parts[-2:])
        return parts[-1]

    def walk(self) -> Iterator[CallNode]:
        """This call and every call below it, in the order they started."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def input_tensors(self) -> Iterator[tuple[str, TensorRecord]]:
        yield from iter_tensors(self.args, "_args")
        yield from iter_tensors(self.kwargs, "_kwargs")

    def output_tensors(self) -> Iterator[tuple[str, TensorRecord]]:
        yield from iter_tensors(self.outputs)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """What one top-level call did to the key/value cache passed to it (a transformers ``Cache``, as in ``generate()``).

    ``cached_tokens`` is how many tokens the cache held before the call and ``new_tokens`` how many it gained (None
    when no cache was passed, or its length is not defined). ``cache`` is what the cache held after the call:
    ``{"type": "DynamicCache", "layers": ({"type": "DynamicLayer", "keys": TensorRecord, "values": TensorRecord},
    ...)}``, no full values; the records carry statistics after a prefill only (the whole cache is then the call's).
    """

    cached_tokens: int | None = None
    new_tokens: int | None = None
    cache: Value | None = None

    @property
    def phase(self) -> Literal["forward", "prefill", "decode"]:
        """``"prefill"`` when the call filled an empty cache, ``"decode"`` when the cache already held tokens,
        ``"forward"`` when no cache was passed."""
        if self.cached_tokens is None:
            return "forward"
        return "decode" if self.cached_tokens > 0 else "prefill"


@dataclass(frozen=True, slots=True)
class TraceMeta:
    """How a trace was made. ``values`` says what FULL_TENSORS holds: ``"repr"`` lines, ``"safetensors"`` files, or
    ``"none"`` (statistics only)."""

    model_class: str
    values: str = "repr"
    strategy: str = "eager"
    ops: bool = False
    prune_layers: bool = False
    rank: int = 0
    world_size: int = 1
    graphtrace_version: str = ""
    torch_version: str = ""
    created: str = ""
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True, slots=True)
class Trace:
    """The calls of one or more top-level forwards (``steps``), and how they were captured.

    ``fallbacks`` maps a module path to the reason torch.fx could not serve it. ``directory`` is where the trace's
    files live once saved or streamed (safetensors values are relative to it). ``step_info`` holds one
    :class:`StepInfo` per step (prefill or decode, the cache after it); it is empty for traces read from
    transformers' files. ``parameters`` maps a module path to the parameter elements the module holds (its
    submodules' included; modules without any left out); ``hooks`` maps the path of a module with forward hooks or
    forward pre-hooks to their names: its calls hold what its caller passed and received, hooks applied.
    """

    steps: tuple[CallNode, ...]
    meta: TraceMeta
    fallbacks: Mapping[str, str] = field(default_factory=dict)
    directory: str | None = None
    step_info: tuple[StepInfo, ...] = ()
    parameters: Mapping[str, int] = field(default_factory=dict)
    hooks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def root(self) -> CallNode:
        """The last top-level call: the only one when a single forward ran."""
        if not self.steps:
            raise LookupError(
                f"this trace recorded no forward call (rank {self.meta.rank} of {self.meta.world_size}; only the "
                "ranks chosen with ranks=... record, rank 0 by default)"
            )
        return self.steps[-1]

    def walk(self) -> Iterator[CallNode]:
        """Every call of every step, in the order they started."""
        for step in self.steps:
            yield from step.walk()

    def __repr__(self) -> str:
        """One line (a trace's records are its attributes; :meth:`show` prints its calls):
        ``Trace(LlamaForCausalLM, 1 forward call, 45 calls, directory='/tmp/llama')``."""
        steps, calls = len(self.steps), sum(1 for _ in self.walk())
        parts = [self.meta.model_class, f"{steps} forward call{'s' if steps != 1 else ''}", f"{calls} calls"]
        if self.meta.world_size > 1:
            parts.append(f"rank {self.meta.rank} of {self.meta.world_size}")
        if self.directory is not None:
            parts.append(f"directory={self.directory!r}")
        return f"Trace({', '.join(parts)})"

    def find(self, path: str, index: int = 0, step: int = -1) -> CallNode:
        """The ``index``-th call of ``path`` in ``step`` (the last by default). ``path`` is the trace's own
        (``LlamaForCausalLM.model.layers.1.mlp``) or relative to the model, as ``diff``, ``--map`` and the tables print
        it (``model.layers.1.mlp``); ``path@N`` names its N-th call. Raises
        :class:`~graphtrace.errors.CallNotFoundError` (a KeyError) naming the closest paths when there is none."""
        steps = len(self.steps)
        if isinstance(step, bool) or not isinstance(step, int) or not -steps <= step < steps:
            raise CallNotFoundError(
                path, f"step {step!r} does not exist: the trace has {steps} forward call(s), 0..{steps - 1}."
            )
        return locate(self.steps[step], path if "@" in path or not index else f"{path}@{index}")

    def show(
        self,
        *,
        depth: int | None = None,
        focus: str | None = None,
        step: int | None = None,
        ops: bool = False,
        unfold: bool = False,
        paths: bool = False,
        why: bool = False,
        file: TextIO | None = None,
    ) -> None:
        """Print the call tree, as ``graphtrace show`` prints it: repeated blocks folded (``unfold`` lists them), each
        call's output shape, statistics and parameters; down to ``depth``, under the call ``focus`` names (a path as
        :meth:`find` takes it), of one ``step``; op records listed with ``ops``; paths relative to the model instead
        of short names with ``paths``; why torch.fx did not serve a call, technically, with ``why``. Prints to
        ``file`` (stdout)."""
        options = {"depth": depth, "focus": focus, "step": step, "ops": ops, "unfold": unfold, "paths": paths}
        services().show(self, file=file, why=why, **options)

    def failed_call(self) -> CallNode | None:
        """The innermost call that raised, following the last error from the root down; None when none raised."""
        for step in reversed(self.steps):
            node = step
            if node.error is None:
                continue
            while True:
                failed = [child for child in node.children if child.error is not None]
                if not failed:
                    return node
                node = failed[-1]
        return None

    def coverage(self) -> Coverage:
        """How many module calls torch.fx served, and why the others were captured by forward wrapping."""
        return coverage_of(self)

    def with_pruned_layers(self) -> Trace:
        """A copy in which every run of more than two layer blocks keeps only its first and last (as transformers);
        what it says about modules (fallbacks, parameters, hooks) is kept for the modules still in it."""
        steps = tuple(prune_layer_blocks(step) for step in self.steps)
        kept = {node.path for step in steps for node in step.walk()}
        return dataclasses.replace(
            self,
            steps=steps,
            fallbacks={path: reason for path, reason in self.fallbacks.items() if path in kept},
            parameters={path: count for path, count in self.parameters.items() if path in kept},
            hooks={path: names for path, names in self.hooks.items() if path in kept},
        )

    # Conveniences served by the layers that own them (io, render, compare), which the package's top layer offers
    # here on import (graphtrace/conveniences.py): the data model imports nothing above it.
    def save(self, directory: str | os.PathLike[str], *, graph: bool = True) -> list[str]:
        """Write the trace into ``directory`` and, with ``graph``, its call graph as ``{Class}_call_graph.svg`` and
        ``.dot``; returns the files written (:func:`graphtrace.save`)."""
        return services().save(self, directory, graph=graph)

    def first_nonfinite(self) -> CallNode | None:
        """The first call, in the order calls returned, whose output holds NaN or Inf while its inputs are finite:
        where non-finite values were made; None when there is none (:func:`graphtrace.first_nonfinite`)."""
        return services().first_nonfinite(self)

    def to_graph(self, **options: Any) -> nx.DiGraph:
        """The call graph of a step as a networkx DiGraph (:func:`graphtrace.render.call_graph`, whose options
        ``step``, ``depth``, ``focus``, ``unfold``, ``max_boxes`` it takes)."""
        return services().call_graph(self, **options)

    def _repr_html_(self) -> str:
        """Jupyter's view: summary, fx coverage and the call graph (:mod:`graphtrace.render.html`)."""
        return services().html(self)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Trace:
        """Read a trace saved by graphtrace or written by transformers' debugger (:func:`graphtrace.load`)."""
        return services().load(directory)


class Services(Protocol):
    """What the layers above the data model do with a trace, offered to its convenience methods by the package's
    top layer (:func:`offer_services`), so that the data model needs no import of theirs."""

    def save(self, trace: Trace, directory: str | os.PathLike[str], *, graph: bool = True) -> list[str]: ...
    def load(self, directory: str | os.PathLike[str]) -> Trace: ...
    def first_nonfinite(self, trace: Trace) -> CallNode | None: ...
    def call_graph(self, trace: Trace, **options: Any) -> nx.DiGraph: ...
    def html(self, value: Any) -> str: ...
    def show(self, trace: Trace, *, file: TextIO | None, **options: Any) -> None: ...


_SERVICES: list[Services] = []


def offer_services(services: Services) -> None:
    """Called once by ``graphtrace/conveniences.py`` when the package is imported."""
    _SERVICES[:] = [services]


def services() -> Services:
    if not _SERVICES:  # only when graphtrace.model was loaded without its package, which Python never does
        raise RuntimeError("graphtrace's conveniences are not loaded: import graphtrace")
    return _SERVICES[0]


# -- finding a call by the name a user sees ----------------------------------------------------------------------------


def locate(step: CallNode, name: str) -> CallNode:
    """The call of ``step`` that ``name`` names: a path as the trace holds it or relative to the model
    (``model.layers.1.mlp``), with ``@N`` for its N-th call (the first without). Raises
    :class:`~graphtrace.errors.CallNotFoundError` naming the closest paths (as the user wrote them) when there is
    none."""
    path, _, number = name.rpartition("@") if "@" in name else (name, "", "0")
    if not number.isdigit():
        raise CallNotFoundError(name, "after '@' comes a call number (path@0, path@1, ...).")
    relative = bool(path) and path != step.path and not path.startswith(step.path + ".")
    wanted = f"{step.path}.{path}" if relative else path
    calls = {node.index: node for node in step.walk() if node.path == wanted}
    if int(number) in calls:
        return calls[int(number)]
    if calls:
        raise CallNotFoundError(name, f"{path} was called {len(calls)} time(s); use @0..@{max(calls)}.")
    known = list(dict.fromkeys(node.path for node in step.walk()))
    if relative:
        known = [found.partition(".")[2] for found in known if "." in found]
    close = difflib.get_close_matches(path, known, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else " `graphtrace show` (or trace.show()) lists the calls."
    raise CallNotFoundError(name, f"no such call in this step.{hint}")


# -- fx coverage: which calls torch.fx served -------------------------------------------------------------------------

EAGER_STRATEGY = "strategy='eager'"
RAISED = "the call raised"


@dataclass(frozen=True, slots=True)
class Coverage:
    """Module calls of a trace by capture strategy. ``eager`` counts the calls fx did not serve by reason: the
    module's fallback reason, ``"strategy='eager'"`` for a trace captured without fx, ``"the call raised"``."""

    module_calls: int
    fx: int
    eager: Mapping[str, int] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """The share of module calls fx served (0 for a trace without calls)."""
        return self.fx / self.module_calls if self.module_calls else 0.0

    def summary(self) -> str:
        """One line: ``fx served 41 of 45 module calls (91%); eager: 3 × Refused: ..., 1 × ...``."""
        text = f"fx served {self.fx} of {self.module_calls} module calls ({self.fraction:.0%})"
        if self.eager:
            reasons = sorted(self.eager.items(), key=lambda item: (-item[1], item[0]))
            text += "; eager: " + ", ".join(f"{count} × {reason}" for reason, count in reasons)
        return text

    def in_words(self) -> str:
        """The same in a porter's words, the technical reasons left to :meth:`summary`: ``torch.fx verified 41 of 45
        module calls (91%); 4 recorded by wrapping forward: the model passes a cache object (4)``."""
        if set(self.eager) == {EAGER_STRATEGY}:
            return f"all {self.module_calls} module calls recorded by wrapping forward (strategy='eager')"
        text = f"torch.fx verified {self.fx} of {self.module_calls} module calls ({self.fraction:.0%})"
        words: Counter[str] = Counter()
        for reason, count in self.eager.items():
            words[fallback_in_words(reason)] += count
        if words:
            reasons = sorted(words.items(), key=lambda item: (-item[1], item[0]))
            text += f"; {sum(words.values())} {WRAPPED}: " + ", ".join(f"{why} ({count})" for why, count in reasons)
        return text

    def __str__(self) -> str:
        return self.summary()


WRAPPED = "recorded by wrapping forward"
"""How a call torch.fx did not serve was captured, in a porter's words: as transformers captures every call."""

_REASONS_IN_WORDS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), words)
    for pattern, words in (
        (r"argument of type: <class '[\w.]*Cache'>|calls \w*Cache\.\w+", "the model passes a cache object"),
        (r"argument of type: <class '(?:\w+\.)*(\w+)'>", "it is given a {0}, which a graph cannot hold"),
        (r"^Refused: calls ([\w.]+), which a replay would repeat", "it calls {0}, which must run only once"),
        (r"^Refused: draws random numbers", "it draws random numbers"),
        (r"^Refused: writes in place", "it writes into a tensor it was given"),
        (r"^Refused: (?:communicates|computes on)", "it communicates with other processes"),
        (r"^SideEffect: tracing the forward changes", "tracing its forward changes the module"),
        (r"^SideEffect: (.*?) \(stopped", "its code has a side effect: {0}"),
        (r"control flow", "its code branches on tensor values"),
        (r"^Mismatch", "its graph did not reproduce the call"),
        (rf"^{re.escape(RAISED)}$", "it raised"),
        (rf"^{re.escape(EAGER_STRATEGY)}$", "strategy='eager' asked for it"),
    )
)


def fallback_in_words(reason: str, *, hooks: bool = False) -> str:
    """Why a module call was :data:`WRAPPED` rather than served by torch.fx, in a porter's words (``the model passes
    a cache object``); the technical ``reason`` (``Trace.fallbacks``) stays one flag or one click away. A module with
    ``hooks`` whose graph did not reproduce its call: its hooks change what its forward returns."""
    if hooks and reason.startswith("Mismatch"):
        return "its forward hooks change what its forward returns"
    for pattern, words in _REASONS_IN_WORDS:
        found = pattern.search(reason)
        if found is not None:
            return words.format(*found.groups())
    return "torch.fx cannot trace its code"


def coverage_of(trace: Trace) -> Coverage:
    """The :class:`Coverage` of every step of ``trace``."""
    fx = 0
    eager: Counter[str] = Counter()
    calls = 0
    for node in trace.walk():
        if node.kind != "module":
            continue
        calls += 1
        if node.strategy == "fx":
            fx += 1
        elif trace.meta.strategy == "eager":
            eager[EAGER_STRATEGY] += 1
        elif node.path in trace.fallbacks:
            eager[trace.fallbacks[node.path]] += 1
        else:
            eager[RAISED if node.error is not None else "not verified"] += 1
    return Coverage(module_calls=calls, fx=fx, eager=dict(eager))


_LAYER_SUFFIX = re.compile(r"(.*)\.(\d+)$")


def numbered(path: str) -> tuple[str, int] | None:
    """``("...layers", 3)`` for a path that ends in a number (a candidate layer block), else None."""
    match = _LAYER_SUFFIX.match(path)
    return (match.group(1), int(match.group(2))) if match else None


def is_layer_block(node: CallNode) -> bool:
    """A numbered block (``...layers.3``) with children whose paths carry the same number, as transformers decides."""
    if not node.children:  # most calls: no regex needed
        return False
    match = _LAYER_SUFFIX.match(node.path)
    if not match:
        return False
    marker = f".{match.group(2)}."
    return any(marker in child.path for child in node.children)


def prune_layer_blocks(node: CallNode) -> CallNode:
    """Keep the first and last of the layer blocks among each call's children, recursively (transformers' rule:
    blocks of sibling lists count together)."""
    if not node.children:
        return node
    blocks = [i for i, child in enumerate(node.children) if is_layer_block(child)]
    dropped = set(blocks[1:-1]) if len(blocks) > 2 else set()
    children = tuple(prune_layer_blocks(child) for i, child in enumerate(node.children) if i not in dropped)
    return dataclasses.replace(node, children=children)
