"""No import cycle inside `sandgym` (across its parts too) nor inside `lab`.

Each module's imports are read with `ast` (module level and inside functions, as they run), so a
cycle that only a lazy import inside a function closes is caught too. A node is a module by its
dotted name (`sandgym.tasks.verifier.pristine`); a package's `__init__` is the package's own name
(`sandgym.tasks.verifier`). Importing a submodule loads its package's `__init__` first, but that edge
is not counted: a package that gathers its submodules is not a cycle. Imports under
`if TYPE_CHECKING:` never run: the run-time test leaves them out; the stricter test holds the
modules to the rule that not even a type annotation goes back up (the server's app and its
sessions once named each other that way; tasks' episode start and its pristine verifier
once imported each other lazily; each backend's sandbox and its backend, and e2b's pty bridge
and its sandbox, once named each other in annotations).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("sandgym", "lab")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def package_modules(package: str) -> dict[str, Path]:
    """Dotted module name -> its file, for every module under `package` (at any depth)."""
    root = REPO / package
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported(
    node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool, modules: set[str]
) -> set[str]:
    """The package's modules one import statement in module `here` loads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in modules}
    if node.level:  # relative: resolved against `here`'s package
        base = here.split(".") if is_pkg else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        module = ".".join([*base, *(node.module.split(".") if node.module else [])])
    elif node.module is None:
        return set()
    else:
        module = node.module
    # `from pkg import sub` loads the module pkg.sub; `from pkg import name` runs pkg itself
    found = {
        f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
    }
    return found & modules


def _collect(
    nodes: Iterable[ast.AST],
    deps: set[str],
    here: str,
    is_pkg: bool,
    modules: set[str],
    typing: bool,
) -> None:
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node):
            if typing:
                _collect(node.body, deps, here, is_pkg, modules, typing)
            _collect(node.orelse, deps, here, is_pkg, modules, typing)  # `else:` does run
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            deps |= _imported(node, here, is_pkg, modules)
        _collect(ast.iter_child_nodes(node), deps, here, is_pkg, modules, typing)


def import_graph(package: str, with_type_checking: bool) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (module level and inside functions)."""
    files = package_modules(package)
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        is_pkg = path.name == "__init__.py"
        _collect([ast.parse(path.read_text())], deps, name, is_pkg, modules, with_type_checking)
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
    graph = import_graph("sandgym/server", with_type_checking=False)
    # known edges, one at module level and one inside a function: the reader sees both kinds
    assert "sandgym.server.sessions" in graph["sandgym.server.app"]
    assert "sandgym.server.openenv_wire" in graph["sandgym.server.app"]
    assert (
        "sandgym.server.sessions" not in graph["sandgym.server.openenv_wire"]
    )  # under TYPE_CHECKING
    typed = import_graph("sandgym/server", with_type_checking=True)
    assert "sandgym.server.sessions" in typed["sandgym.server.openenv_wire"]
    tasks = import_graph("sandgym/tasks", with_type_checking=False)
    # nested modules, a package's __init__, and `from package import name`
    assert "sandgym.tasks.episode_start" in tasks["sandgym.tasks.verifier.pristine"]
    assert "sandgym.tasks.verifier.run" in tasks["sandgym.tasks.verifier"]
    assert "sandgym.tasks.verifier" in tasks["sandgym.tasks.check"]
    # the version now comes from its own module, not from the package that imports labels
    assert (
        "sandgym.sandboxes.version"
        in import_graph("sandgym/sandboxes", False)["sandgym.sandboxes.labels"]
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_at_run_time(package: str) -> None:
    cycle = find_cycle(import_graph(package, with_type_checking=False))
    assert cycle is None, f"expected no import cycle in {package}, found {' -> '.join(cycle)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_even_for_type_checking(package: str) -> None:
    cycle = find_cycle(import_graph(package, with_type_checking=True))
    assert cycle is None, (
        f"expected no import cycle in {package}, counting `if TYPE_CHECKING:` imports, found "
        f"{' -> '.join(cycle)}: move what both need into a lower module"
    )


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
