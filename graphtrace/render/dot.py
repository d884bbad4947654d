"""DiGraph -> Graphviz: DOT source with pydot (pure, so it can be golden-tested), and files through Graphviz's ``dot``.

Clusters are the calls whose children are drawn; boxes are the rest. An edge into or out of a cluster is anchored on
the cluster's first or last box and clipped at the cluster's border (``lhead``/``ltail``), and is left out where a
more specific edge already shows the same flow (``embed -> layers.0`` when ``embed -> layers.0.input_norm`` is
drawn). How boxes and clusters look is :mod:`graphtrace.render.style`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import networkx as nx
import pydot

from graphtrace.errors import GraphvizFailedError, GraphvizNotFoundError, InvalidOptionError, OutputPathError
from graphtrace.files import put_in_place, replacing, temporary_beside, write_beside
from graphtrace.render.style import (
    BOX_DEFAULTS,
    EDGE_DEFAULTS,
    GRAPH_STYLE,
    INFERRED_EDGE,
    box_style,
    caption,
    cluster_style,
)

__all__ = ["FORMATS", "INSTALL_HINT", "Drawing", "render_dot_file", "start_graph", "to_dot", "write_graph"]

FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": None}
"""Output suffixes and the Graphviz format each is rendered in (``.dot``: the source only)."""

INSTALL_HINT = (
    "install Graphviz (Debian/Ubuntu: `sudo apt-get install -y graphviz`; macOS: `brew install graphviz`; "
    "conda: `conda install graphviz`)"
)


def to_dot(graph: nx.DiGraph) -> str:
    """The DOT source of a graph made by :func:`graphtrace.render.call_graph`."""
    dot = pydot.Dot("call_graph", graph_type="digraph", compound="true", **GRAPH_STYLE, label=caption(graph.graph))
    dot.set_node_defaults(**BOX_DEFAULTS)
    dot.set_edge_defaults(**EDGE_DEFAULTS)
    members: dict[Hashable, list[Hashable]] = {}
    for node, parent in graph.nodes(data="parent"):
        members.setdefault(parent, []).append(node)
    _add_members(dot, graph, members, None, 0)
    first, last = _anchors(graph)
    for tail, head, data in _drawn_edges(graph):
        attributes: dict[str, str] = {}
        if data["inferred"]:
            attributes.update(INFERRED_EDGE)
        if graph.nodes[tail]["cluster"]:
            attributes["ltail"] = f"cluster_{_dot_name(tail)}"
        if graph.nodes[head]["cluster"]:
            attributes["lhead"] = f"cluster_{_dot_name(head)}"
        edge = pydot.Edge(_dot_name(last.get(tail, tail)), _dot_name(first.get(head, head)), **attributes)  # type: ignore[arg-type]
        dot.add_edge(edge)
    return dot.to_string()


def _dot_name(node: Hashable) -> str:
    """A call's id as pydot should write it: pydot quotes a name and escapes its quotes but not its backslashes, so
    that a name from a crafted trace holding ``\\"`` would end the quoted string early and inject DOT (attributes
    Graphviz acts on, or a syntax error). Doubled, a backslash stays part of the name."""
    return str(node).replace("\\", "\\\\")


def _add_members(
    container: pydot.Dot | pydot.Cluster,
    graph: nx.DiGraph,
    members: Mapping[Hashable, list[Hashable]],
    parent: Hashable,
    level: int,
) -> None:
    """Declare the nodes and clusters inside ``parent``, in reverse call order: dot lays out a cluster's members
    right to left in the order they are declared (Graphviz 2.43), so that calls read left to right."""
    for node in reversed(members.get(parent, [])):
        data = graph.nodes[node]
        if data["cluster"]:
            cluster = pydot.Cluster(_dot_name(node), **cluster_style(data, level))  # type: ignore[arg-type]
            container.add_subgraph(cluster)  # type: ignore[arg-type]  # pydot's stubs: a Cluster is a Subgraph
            _add_members(cluster, graph, members, node, level + 1)
        else:
            container.add_node(pydot.Node(_dot_name(node), **box_style(data)))  # type: ignore[arg-type]


def write_graph(graph: nx.DiGraph, path: str | os.PathLike[str]) -> list[Path]:
    """Write ``graph`` to ``path`` (``.svg``, ``.png``, ``.pdf`` or ``.dot``); the DOT source is always written too,
    beside it, first. Returns the files written. Raises :class:`GraphvizNotFoundError` when ``dot`` is missing (the
    DOT source is there by then)."""
    return start_graph(graph, path).finish()


def start_graph(graph: nx.DiGraph, path: str | os.PathLike[str]) -> Drawing:
    """:func:`write_graph` without waiting for Graphviz: ``dot`` is started, and :meth:`Drawing.finish` puts the
    DOT source and the picture in place."""
    target = Path(path)
    output_format = _output_format(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(
            f"cannot write the call graph to {str(target.with_suffix('.dot'))!r}: {exc.strerror or exc}. Choose a "
            "path you can write to."
        ) from exc
    return Drawing(to_dot(graph), target, output_format)


class Drawing:
    """Graphviz's ``dot`` drawing a call graph while the caller goes on (its start-up and layout take tens of
    milliseconds, on another core).

    The DOT source (``target`` with the suffix ``.dot``) and the picture are written to temporary files beside
    them; :meth:`finish` waits for ``dot`` and puts both in place, each whole; :meth:`abandon` stops it and leaves
    both targets as they were. One of the two must be called: both reap the process and remove the temporary files,
    so that no zombie and no partial file is left. ``output_format`` None: the DOT source only."""

    def __init__(self, dot_text: str, target: Path, output_format: str | None) -> None:
        self.source, self.target = target.with_suffix(".dot"), target
        self._source_text = write_beside(self.source, dot_text)
        self._temporaries = [self._source_text]
        self._process: subprocess.Popen[str] | None = None
        self._missing: GraphvizNotFoundError | None = None
        if output_format is None:
            return
        try:
            program = _dot_program(self.source, target)
        except GraphvizNotFoundError as exc:
            self._missing = exc  # raised by finish(), once the DOT source is in place
            return
        try:
            self._drawn = temporary_beside(target)
            self._temporaries.append(self._drawn)
            self._process = subprocess.Popen(
                _dot_command(program, output_format, self._source_text, self._drawn),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError as exc:
            self._discard()
            raise _unwritable(target, exc) from exc
        except BaseException:  # interrupted before dot runs: nothing of it may stay behind
            self.abandon()
            raise

    def finish(self) -> list[Path]:
        """Wait for ``dot``, then put the DOT source and the picture in place; returns their paths. Raises
        GraphvizNotFoundError or GraphvizFailedError when there is no picture (the DOT source is written then)."""
        process, self._process = self._process, None
        placing = self.source
        try:
            errors = _wait(process) if process is not None else ""
            put_in_place(self._source_text, self.source)
            if self._missing is not None:
                raise self._missing
            if process is None:
                return [self.source]
            if process.returncode != 0:
                errors = errors.replace(str(self._source_text), str(self.source))  # dot names the file it read
                raise _failure(process.returncode, errors, self.source)
            placing = self.target
            put_in_place(self._drawn, self.target)
        except OSError as exc:
            raise _unwritable(placing, exc) from exc
        finally:
            self._discard()
        return [self.source, self.target]

    def abandon(self) -> None:
        """Stop ``dot`` and remove what it was given and drew: both targets are left as they were."""
        process, self._process = self._process, None
        if process is not None:
            _stop(process)
        self._discard()

    def _discard(self) -> None:
        for temporary in self._temporaries:
            temporary.unlink(missing_ok=True)


def _wait(process: subprocess.Popen[str]) -> str:
    """What ``dot`` said on stderr once it has ended; stopped if the wait is interrupted (Ctrl-C)."""
    try:
        return process.communicate()[1]
    except BaseException:
        _stop(process)
        raise


def _stop(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()  # not communicate(): a child it left behind could hold the pipe open for long
    assert process.stderr is not None
    process.stderr.close()


def render_dot_file(source: Path, target: Path, output_format: str) -> None:
    """Run Graphviz's ``dot`` on the DOT file ``source``, writing ``target`` in ``output_format``."""
    program = _dot_program(source, target)
    try:
        with replacing(target) as drawn:  # a picture appears whole, or the old one stays
            command = _dot_command(program, output_format, source, drawn)
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise _failure(result.returncode, result.stderr, source)
    except OSError as exc:
        raise _unwritable(target, exc) from exc


def _dot_program(source: Path, target: Path) -> str:
    program = shutil.which("dot")
    if program is None:
        raise GraphvizNotFoundError(
            f"Graphviz's `dot` program is not on PATH, so {target.name} could not be drawn; its DOT source is in "
            f"{source}. To get the picture, {INSTALL_HINT}, then run `graphtrace render` on the trace again."
        )
    return program


def _dot_command(program: str, output_format: str, source: Path, drawn: Path) -> list[str]:
    sharper = ["-Gdpi=144"] if output_format == "png" else []  # 1.5 times the default: legible on dense screens
    return [program, f"-T{output_format}", *sharper, str(source), "-o", str(drawn)]


def _failure(returncode: int, errors: str, source: Path) -> GraphvizFailedError:
    message = errors.strip().splitlines()
    return GraphvizFailedError(
        f"Graphviz's dot could not draw {source} (exit code {returncode}: "
        f"{message[-1] if message else 'no message'}); the DOT source is kept for inspection."
    )


def _unwritable(target: Path, exc: OSError) -> OutputPathError:
    return OutputPathError(f"cannot write {target}: {exc.strerror or exc}. Choose a path you can write to.")


def _output_format(target: Path) -> str | None:
    suffix = target.suffix.lower()
    if suffix not in FORMATS:
        raise InvalidOptionError(
            f"cannot tell the picture format from {target.name!r}: end the file name with {', '.join(FORMATS)}."
        )
    return FORMATS[suffix]


# -- what is drawn ----------------------------------------------------------------------------------------------------


def _parents(graph: nx.DiGraph, node: Hashable) -> Iterator[Hashable]:
    """``node`` and the clusters around it, innermost first."""
    while node is not None:
        yield node
        node = graph.nodes[node]["parent"]


def _anchors(graph: nx.DiGraph) -> tuple[dict[Hashable, Hashable], dict[Hashable, Hashable]]:
    """Each cluster's first and last box in call order: where edges into and out of it are attached."""
    first: dict[Hashable, Hashable] = {}
    last: dict[Hashable, Hashable] = {}
    for node, cluster in graph.nodes(data="cluster"):
        if cluster:
            continue
        for enclosing in _parents(graph, graph.nodes[node]["parent"]):
            first.setdefault(enclosing, node)
            last[enclosing] = node
    return first, last


def _drawn_edges(graph: nx.DiGraph) -> list[tuple[Hashable, Hashable, Mapping[str, Any]]]:
    """The edges worth drawing: an edge is left out when an edge between the same clusters' contents (or one of the
    two ends itself) already shows it; recorded flow is only ever replaced by recorded flow."""
    covered: set[tuple[Hashable, Hashable, bool]] = set()
    for tail, head, inferred in graph.edges(data="inferred"):
        for outer_tail in _parents(graph, tail):
            for outer_head in _parents(graph, head):
                if (outer_tail, outer_head) != (tail, head):
                    covered.add((outer_tail, outer_head, True))
                    if not inferred:
                        covered.add((outer_tail, outer_head, False))
    return [(t, h, data) for t, h, data in graph.edges(data=True) if (t, h, data["inferred"]) not in covered]
