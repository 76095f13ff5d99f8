"""`tasks` names no sandbox backend (issue 35): its modules reach sandboxes only through the
protocol and the backend-neutral modules of `sandboxes`, never through `sandgym.sandboxes.docker`,
`sandgym.sandboxes.local`, `sandgym.sandboxes.e2b` or `sandgym.sandboxes.null` (a backend is
chosen by name, `sandgym.sandboxes.get_backend`). Read off the sources (an AST walk), so a lazy import
inside a function counts too. The catalog (`sandgym/tasks/catalog/`) is task data, not layer code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BACKEND = re.compile(r"^sandgym\.sandboxes\.(docker|local|e2b|null)(\.\w+)*$")


def _backend_imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if BACKEND.match(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if BACKEND.match(node.module):
                found.append((node.lineno, node.module))
            elif node.module == "sandgym.sandboxes":  # `from sandgym.sandboxes import docker`
                found += [
                    (node.lineno, f"sandgym.sandboxes.{a.name}")
                    for a in node.names
                    if BACKEND.match(f"sandgym.sandboxes.{a.name}")
                ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if BACKEND.match(node.value):  # what importlib.import_module would load
                found.append((node.lineno, node.value))
    return found


def test_tasks_sources_name_no_backend() -> None:
    catalog = REPO / "sandgym" / "tasks" / "catalog"
    sources = [
        p for p in sorted((REPO / "sandgym" / "tasks").rglob("*.py")) if catalog not in p.parents
    ]
    assert len(sources) > 10, f"expected the tasks package's modules, found {sources}"
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in sources
        for line, name in _backend_imports(path)
    ]
    assert not offenders, f"expected tasks to name no sandbox backend, found: {offenders}"
