"""No import cycle among the `envserver` modules.

Each module's imports are read with `ast` (module level and inside functions, as they run), so a
cycle that only a lazy import inside a function closes is caught too. Imports under
`if TYPE_CHECKING:` never run: the first test leaves them out; the second holds the modules to
the stricter rule that not even a type annotation goes back up (the app and its sessions once
named each other that way).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "envserver"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The envserver modules one import statement loads."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level:  # relative: `from . import x`, `from .x import y`
        base = [PACKAGE, *(node.module.split(".") if node.module else [])]
        names = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
    elif node.module is None:
        names = []
    else:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for name in names:
        parts = name.split(".")
        if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in modules:
            found.add(parts[1])
    return found


def _collect(nodes: Iterable[ast.AST], deps: set[str], modules: set[str], typing: bool) -> None:
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node):
            if typing:
                _collect(node.body, deps, modules, typing)
            _collect(node.orelse, deps, modules, typing)  # the guard's `else:` does run
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            deps |= _imported(node, modules)
        _collect(ast.iter_child_nodes(node), deps, modules, typing)


def import_graph(with_type_checking: bool) -> dict[str, set[str]]:
    """module -> the envserver modules it imports (module level and inside functions)."""
    modules = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name in sorted(modules):
        deps: set[str] = set()
        tree = ast.parse((ROOT / f"{name}.py").read_text())
        _collect([tree], deps, modules, with_type_checking)
        graph[name] = deps - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path (its first module repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_graph_is_read() -> None:
    graph = import_graph(with_type_checking=False)
    # known edges, one at module level and one inside a function: the reader sees both kinds
    assert "sessions" in graph["app"]
    assert "openenv_wire" in graph["app"]
    assert "sessions" not in graph["openenv_wire"]  # that one is under TYPE_CHECKING
    assert "sessions" in import_graph(with_type_checking=True)["openenv_wire"]


def test_no_import_cycle_at_run_time() -> None:
    cycle = find_cycle(import_graph(with_type_checking=False))
    assert cycle is None, f"expected no import cycle in envserver, found {' -> '.join(cycle)}"


def test_no_import_cycle_even_for_type_checking() -> None:
    cycle = find_cycle(import_graph(with_type_checking=True))
    assert cycle is None, (
        f"expected no import cycle in envserver, counting `if TYPE_CHECKING:` imports, found "
        f"{' -> '.join(cycle)}: move what both need into a lower module"
    )


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
