"""Product code imports its own modules at the top of the module (issue 57, item 5): every import
of a `sandgym` module inside a function carries its reason, a `# lazy: <measured reason>` comment
on the import's line or in the comment lines directly above it (one comment may cover a run of
consecutive imports). Vendor SDKs (docker, e2b, torch, ray, ...) are not in scope: only imports
of `sandgym.*` (and relative ones), read from the source with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = "# lazy:"


def _ours(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").partition(".")[0] == "sandgym"
    return any(a.name.partition(".")[0] == "sandgym" for a in node.names)


def _in_function_imports(
    tree: ast.Module,
) -> list[tuple[ast.Import | ast.ImportFrom, list[ast.stmt]]]:
    """(import, the statement list it sits in) for each import of ours inside a function."""
    found: list[tuple[ast.Import | ast.ImportFrom, list[ast.stmt]]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if isinstance(block, list) and inside:
                found.extend(
                    (s, block)
                    for s in block
                    if isinstance(s, ast.Import | ast.ImportFrom) and _ours(s)
                )
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree, False)
    return found


def unexplained(path: Path) -> list[str]:
    """`file:line: statement` for each in-function import of ours with no `# lazy:` reason."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    missing: list[str] = []
    for node, block in _in_function_imports(ast.parse(text, filename=str(path))):
        # the run of consecutive imports this one belongs to: one comment may cover them all
        at = block.index(node)
        first = at
        while first > 0 and isinstance(block[first - 1], ast.Import | ast.ImportFrom):
            first -= 1
        start = block[first].lineno - 1
        span = lines[start : node.end_lineno]
        above = start - 1
        while above >= 0 and lines[above].lstrip().startswith("#"):
            span.insert(0, lines[above])
            above -= 1
        if not any(MARK in line for line in span):
            missing.append(f"{where}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return missing


def test_every_in_function_import_of_ours_says_why() -> None:
    paths = sorted((REPO / "sandgym").rglob("*.py"))
    paths = [p for p in paths if "catalog" not in p.relative_to(REPO).parts]
    assert len(paths) >= 200, f"expected sandgym's sources, found {len(paths)}"
    lazy = [(p, n) for p in paths for n, _ in _in_function_imports(ast.parse(p.read_text("utf-8")))]
    assert lazy, "expected some in-function imports of ours that keep their reason"
    missing = [m for p in paths for m in unexplained(p)]
    assert not missing, (
        "an import of a sandgym module inside a function goes to the top of its module, or says"
        f" why not with '{MARK} <measured reason>'; found {len(missing)} without: {missing}"
    )


def test_the_check_reads_a_reason_on_the_line_above_or_over_a_run(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def covered():\n"
        "    # lazy: loads fastapi, +0.2 s, measured\n"
        "    from sandgym.server.runner import BackgroundServer\n"
        "    from sandgym.server.settings import ServerSettings\n"
        "\n"
        "def on_its_line():\n"
        "    from sandgym.tasks import TaskRegistry  # lazy: a cycle through tasks\n"
        "\n"
        "def bare():\n"
        "    import os\n"
        "\n"
        "    from sandgym.sandboxes import get_backend\n"
        "    from . import sibling\n"
        "\n"
        "from sandgym.wire import protocol\n",
        encoding="utf-8",
    )
    assert unexplained(probe) == [
        "probe.py:12: from sandgym.sandboxes import get_backend",
        "probe.py:13: from . import sibling",
    ]
