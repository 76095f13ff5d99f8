"""`sandboxes` is the bottom layer of DESIGN.md: it names nothing of ours above it and knows no
wire format. Read off the sources (an AST walk), so a lazy import inside a function counts too.

- no sandboxes module imports (or names as a module path string) another part of `sandgym`
  (`wire`, `client`, `tasks`, `server`, `trainer`, `integrations`, `cli`) or `lab`;
- no sandboxes module dispatches wire actions: none defines `apply_desktop_action` or an
  `*ACTION_KINDS` list, and none reads the wire discriminator `"kind"` (that mapping lives in
  `sandgym.server.actions`, the kinds in `sandgym.wire.protocol`);
- no sandboxes module starts a task's desktop or reads a task's desktop metadata
  (`sandgym.tasks.desktop` does), and none names a task path (`/tests`, `/logs/...`, `/testbed`,
  `/solution`: `sandgym.tasks.paths` holds them, `sandgym.tasks.sandbox_spec` asks for `SandboxSpec.make_dirs`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ABOVE = ("wire", "client", "tasks", "server", "trainer", "integrations", "cli", "lab")
MODULE_PATH = re.compile(r"^(sandgym\.\w+|lab)(\.\w+)*$")
WIRE_NAMES = re.compile(r"^(apply_desktop_action|apply_action|\w*ACTION_KINDS)$")
TASK_NAMES = re.compile(r"^(start_task_desktop|is_desktop_task)$")
TASK_PATH = re.compile(r"(^|\s|['\"])/(tests|logs|testbed|solution)(/|\b)")


def _part(module: str) -> str:
    top, _, rest = module.partition(".")
    return rest.partition(".")[0] if top == "sandgym" else top


def _sources() -> list[Path]:
    sources = sorted((REPO / "sandgym" / "sandboxes").rglob("*.py"))
    assert len(sources) > 10, f"expected the sandboxes package's modules, found {sources}"
    return sources


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_PATH.match(node.value):
                found.append((node.lineno, node.value))
    return found


def _wire_dispatch(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if WIRE_NAMES.match(node.name):
                found.append((node.lineno, f"defines {node.name}"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if WIRE_NAMES.match(node.id):
                found.append((node.lineno, f"assigns {node.id}"))
        elif isinstance(node, ast.Constant) and node.value == "kind":
            found.append((node.lineno, "reads the wire field 'kind'"))
    return found


def _task_start_up(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if TASK_NAMES.match(node.name):
                found.append((node.lineno, f"defines {node.name}"))
        elif isinstance(node, ast.Constant) and node.value == "sandgym_desktop":
            found.append((node.lineno, "reads the task metadata key 'sandgym_desktop'"))
    return found


def _task_paths(path: Path) -> list[tuple[int, str]]:
    """Task paths in the code (string constants, f-string parts); docstrings aside."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, f"names the task path in {node.value[:60]!r}")
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TASK_PATH.search(node.value)
    ]


def test_sandboxes_import_nothing_above_them() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in _sources()
        for line, name in _imports(ast.parse(path.read_text(), filename=str(path)))
        if _part(name) in ABOVE
    ]
    assert not offenders, f"expected sandboxes to import none of {ABOVE}, found: {offenders}"


def test_sandboxes_dispatch_no_wire_actions() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _sources()
        for line, what in _wire_dispatch(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not offenders, (
        f"expected wire action dispatch in sandgym.server.actions only, found in sandboxes: {offenders}"
    )


def test_sandboxes_start_no_task_desktop() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _sources()
        for line, what in _task_start_up(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert not offenders, (
        f"expected a desktop task's start-up in sandgym.tasks.desktop only, found in sandboxes: {offenders}"
    )


def test_sandboxes_name_no_task_paths() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in _sources()
        for line, what in _task_paths(path)
    ]
    assert not offenders, (
        f"expected task paths in sandgym/tasks/ only, found in sandboxes: {offenders}"
    )
