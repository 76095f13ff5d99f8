"""The layer rules of DESIGN.md for every product package, read from the source (every import
statement at any depth, `if TYPE_CHECKING:` blocks included): which of our packages each may
import. Lab tooling (`bench`, `scripts`) is imported by no product package, so the wheel can ship
without it. Finer rules live beside this one: envserver never loads trainer or bench
(test_import_layers.py), tasks name no backend (test_tasks_layer.py), sandboxes' backends import
no other backend (test_sandboxes_layer.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = ("sandboxes", "tasks", "envserver", "trainer", "integrations", "sandgym_cli", "bench",
        "scripts")  # fmt: skip
#: what each product package may import of ours ("envserver.x": that module only)
ALLOWED: dict[str, set[str]] = {
    "sandboxes": set(),
    "tasks": {"sandboxes"},
    "envserver": {"sandboxes", "tasks"},
    "trainer": {"envserver.client", "envserver.protocol"},
    "integrations": {
        "envserver.client", "envserver.protocol", "envserver.sandbox_client",
        "envserver.sandbox_protocol", "trainer",
    },  # fmt: skip
    "sandgym_cli": {"sandboxes", "tasks", "envserver", "trainer"},  # bench: by name, if there
}
#: (file, module) pairs allowed beside the table, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {
    # the one trainer module that runs an env server: a Ray actor per sandgym node
    ("trainer/cluster.py", "envserver.runner"): "places env servers as Ray actors",
    ("trainer/cluster.py", "envserver.settings"): "places env servers as Ray actors",
}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import statement in `path`, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def allowed(package: str, module: str) -> bool:
    top = module.partition(".")[0]
    if top == package or top not in OURS:
        return True
    rules = ALLOWED[package]
    return top in rules or any(module == r or module.startswith(r + ".") for r in rules)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_layer_allows(package: str) -> None:
    sources = [p for p in sorted((REPO / package).rglob("*.py")) if "catalog" not in p.parts]
    assert len(sources) >= 2, f"expected {package}'s sources"
    wrong = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in sources
        for line, module in imports_of(path)
        if not allowed(package, module)
        and (str(path.relative_to(REPO)), module) not in EXCEPTIONS
    ]
    assert not wrong, (
        f"{package} may import {sorted(ALLOWED[package]) or 'nothing'} of ours; found: {wrong}"
    )


def test_the_rules_see_a_wrong_import() -> None:
    assert not allowed("tasks", "envserver.protocol")
    assert not allowed("trainer", "envserver.sessions")
    assert not allowed("trainer", "bench.learner")
    assert allowed("trainer", "envserver.client")
    assert allowed("integrations", "trainer.engines.base")
