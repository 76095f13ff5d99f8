"""The import direction of DESIGN.md: `envserver` never loads or names `trainer`, `bench` or the
top-level command line (`sandgym_cli`, which names them all).

Two checks, since a lazy import hides from the first: every envserver module is imported in a
fresh interpreter and none of those packages may appear in `sys.modules`; and no envserver
source names one of them in an import statement (at any depth) or as a module path in a string
(what `importlib.import_module` would load).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("trainer", "bench", "sandgym_cli")
MODULE_PATH = re.compile(rf"^({'|'.join(FORBIDDEN)})(\.\w+)*$")

# Imports each envserver module in turn; prints {module: [forbidden packages it loaded]}.
PROBE = """
import json, pkgutil, sys
import envserver
forbidden = set(sys.argv[1:])
loaded = {}
for info in sorted(pkgutil.walk_packages(envserver.__path__, "envserver."), key=lambda i: i.name):
    before = {m.partition(".")[0] for m in sys.modules}
    __import__(info.name)
    after = {m.partition(".")[0] for m in sys.modules}
    loaded[info.name] = sorted((after - before) & forbidden)
loaded["envserver"] = []
print(json.dumps({"modules": loaded, "present": sorted(forbidden & set(sys.modules))}))
"""


def test_importing_envserver_loads_no_trainer_or_bench() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *FORBIDDEN],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert len(report["modules"]) > 10, f"expected every envserver module, got {report['modules']}"
    offenders = {m: pkgs for m, pkgs in report["modules"].items() if pkgs}
    assert not offenders and not report["present"], (
        f"expected envserver to load none of {FORBIDDEN}; these modules loaded some: {offenders}"
    )


def _names_in(path: Path) -> list[tuple[int, str]]:
    """(line, name) for every module an import statement or a module-path string names."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_PATH.match(node.value):
                found.append((node.lineno, node.value))
    return found


def test_envserver_sources_name_no_trainer_or_bench() -> None:
    sources = sorted((REPO / "envserver").rglob("*.py"))
    assert sources
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in sources
        for line, name in _names_in(path)
        if name.partition(".")[0] in FORBIDDEN
    ]
    assert not offenders, f"expected envserver to name none of {FORBIDDEN}, found: {offenders}"
