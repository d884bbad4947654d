"""The house's one rule of dependencies, checked from the source (docs/ARCHITECTURE.md): imports point down the
layers, the four parts in the middle never import each other, and no modules import each other in a circle.

Imports are read from every module's syntax tree, also those inside functions (a lazy import is a dependency all the
same). Imports under ``if TYPE_CHECKING:`` are left out of the floors' rule: they name types for the type checker and
run nothing. They still count for circles: two modules that name each other's types share something that belongs in
a module below both.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.layers import LAYERS, ROOT, to_dot

PACKAGE = ROOT / "graphtrace"

# Floors, lowest first (tests/layers.py, which also says what each room owns and draws docs/layers.svg). Within a
# floor, each name is a room of its own: rooms of one floor do not import each other.


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST, types: bool = False) -> Iterator[ast.AST]:
    """Every node except the bodies of ``if TYPE_CHECKING:`` blocks (with ``types``, every node)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not types and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(module: str, *, types: bool = False) -> set[str]:
    """The graphtrace modules ``module`` imports at run time (``from pkg import sub`` names the module ``pkg.sub``);
    with ``types``, also those it imports for the type checker only."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8")), types):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def room_of(module: str) -> tuple[int, str]:
    """(layer, room): the room is the longest layer entry that ``module`` is or lies in."""
    best: tuple[int, str] | None = None
    for level, rooms in enumerate(LAYERS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (level, room)
    assert best is not None, f"{module} is in no layer of tests/test_architecture.py: place it"
    return best


def test_every_module_has_a_place() -> None:
    for module in MODULES:
        room_of(module)


def violations(module: str, graph: dict[str, set[str]]) -> list[str]:
    """The imports of ``module`` that point up the layers, or sideways into another room of its own layer."""
    level, room = room_of(module)
    wrong = []
    for target in sorted(graph[module]):
        target_level, target_room = room_of(target)
        if target_room != room and target_level >= level:
            wrong.append(f"{target} (layer {target_level}, {target_room})")
    return wrong


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_and_rooms_of_a_layer_stay_apart(module: str) -> None:
    wrong = violations(module, GRAPH)
    assert not wrong, f"{module} (layer, room {room_of(module)}) imports upward or sideways: {', '.join(wrong)}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    # a package's __init__ re-exports its modules; a module importing its own package's __init__ would close a circle
    assert _cycles(GRAPH) == []


TYPE_CIRCLES_LEFT = [
    ["graphtrace.compare.report", "graphtrace.compare.text"],
    ["graphtrace.check.report", "graphtrace.check.text"],
]
"""Circles through type-checking imports still to be taken apart: a report (the diff's Comparison, the check's
CheckReport) and the table that draws it, whose ``table()`` method imports it lazily (the diff's rebuild, which the
check's report follows, moves what they share below both)."""


def test_no_modules_name_each_others_types_in_a_circle() -> None:
    types = {module: imports_of(module, types=True) for module in MODULES}
    assert [cycle for cycle in _cycles(types) if cycle not in TYPE_CIRCLES_LEFT] == []


def test_the_checks_see_a_violation() -> None:
    """The rules are not vacuous: an upward, a sideways import and the circle they close are found when planted."""
    planted = {module: set(targets) for module, targets in GRAPH.items()}
    planted["graphtrace.model"].add("graphtrace.render.graph")
    planted["graphtrace.compare.report"].add("graphtrace.render.html")
    assert violations("graphtrace.model", planted) == ["graphtrace.render.graph (layer 3, graphtrace.render)"]
    assert violations("graphtrace.compare.report", planted) == ["graphtrace.render.html (layer 3, graphtrace.render)"]
    assert any({"graphtrace.model", "graphtrace.render.graph"} <= set(cycle) for cycle in _cycles(planted))


def test_the_picture_in_the_docs_is_the_house_as_built() -> None:
    """docs/layers.dot is what the source draws today (regenerate with ``python -m tests.layers``)."""
    assert (ROOT / "docs" / "layers.dot").read_text(encoding="utf-8") == to_dot()
    svg = (ROOT / "docs" / "layers.svg").read_text(encoding="utf-8")
    assert svg.rstrip().endswith("</svg>") and "graphtrace.model" in svg
