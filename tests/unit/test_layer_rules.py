"""The layer rules of DESIGN.md, in package names, read from the source (every import statement
at any depth, `if TYPE_CHECKING:` blocks included): which parts of `sandgym` each part may import.

    wire  <-  client  <-  (integrations, trainer)
    sandboxes  <-  tasks  <-  server (which also uses wire)
    cli on top; lab/ and scripts/ (not in the wheel) imported by no part of sandgym

Finer rules live beside this one: the server never loads trainer or lab (test_import_layers.py),
tasks name no backend (test_tasks_layer.py), sandboxes' backends import no other backend
(test_sandboxes_layer.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("wire", "client", "sandboxes", "tasks", "server", "trainer", "integrations", "cli")
#: what each part of sandgym may import of the others
ALLOWED: dict[str, set[str]] = {
    "wire": set(),
    "client": {"wire"},
    "sandboxes": set(),
    "tasks": {"sandboxes"},
    "server": {"sandboxes", "tasks", "wire"},
    "trainer": {"wire", "client"},
    "integrations": {"wire", "client", "trainer"},
    "cli": {"wire", "client", "sandboxes", "tasks", "server", "trainer", "integrations"},
}
#: (file, module) pairs allowed beside the table, each with its reason
EXCEPTIONS: dict[tuple[str, str], str] = {
    # the one trainer module that runs an env server: a Ray actor per sandgym node
    ("sandgym/trainer/cluster.py", "sandgym.server.runner"): "places env servers as Ray actors",
    ("sandgym/trainer/cluster.py", "sandgym.server.settings"): "places env servers as Ray actors",
}
#: ours, but outside the wheel: no part of sandgym imports them
LAB = ("lab", "scripts", "tests")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every absolute import statement in `path`, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def part_of(module: str) -> str | None:
    """`sandgym.tasks.models` -> `tasks`; `sandgym` itself -> `sandgym`; lab/tests -> their name;
    anything not ours -> None."""
    top, _, rest = module.partition(".")
    if top in LAB:
        return top
    if top != "sandgym":
        return None
    return rest.partition(".")[0] or "sandgym"


def allowed(part: str, module: str) -> bool:
    target = part_of(module)
    if target is None or target == part:
        return True
    return target in ALLOWED[part]


@pytest.mark.parametrize("part", PARTS)
def test_each_part_imports_only_what_its_layer_allows(part: str) -> None:
    sources = [
        p for p in sorted((REPO / "sandgym" / part).rglob("*.py")) if "catalog" not in p.parts
    ]
    assert len(sources) >= 2, f"expected sandgym/{part}'s sources"
    wrong = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for path in sources
        for line, module in imports_of(path)
        if not allowed(part, module) and (str(path.relative_to(REPO)), module) not in EXCEPTIONS
    ]
    assert not wrong, (
        f"sandgym.{part} may import {sorted(ALLOWED[part]) or 'nothing'} of sandgym; found: {wrong}"
    )


def test_every_part_has_a_rule() -> None:
    found = {p.name for p in (REPO / "sandgym").iterdir() if (p / "__init__.py").exists()}
    assert found == set(PARTS), f"expected the parts {sorted(PARTS)}, found {sorted(found)}"


def test_the_package_root_imports_nothing_of_its_parts() -> None:
    modules = [m for _, m in imports_of(REPO / "sandgym" / "__init__.py")]
    assert not [m for m in modules if part_of(m)], modules


def test_the_rules_see_a_wrong_import() -> None:
    assert not allowed("tasks", "sandgym.wire.protocol")
    assert not allowed("wire", "sandgym.client.env_client")
    assert not allowed("client", "sandgym.server.app")
    assert not allowed("trainer", "sandgym.server.sessions")
    assert not allowed("trainer", "lab.bench.learner")
    assert not allowed("server", "sandgym.client.env_client")
    assert allowed("trainer", "sandgym.client.env_client")
    assert allowed("integrations", "sandgym.trainer.engines.base")
