"""The import direction of DESIGN.md at run time: importing every module of a part of `sandgym`
loads no part its layer does not allow (test_layer_rules.py's table), and no lab tooling.

Two checks, since a lazy import hides from the first: every module of the part is imported in a
fresh interpreter and the parts that then sit in `sys.modules` are compared with the table; and
no source of the part names a forbidden part as a module path in a string (what
`importlib.import_module` would load; import statements at any depth are test_layer_rules.py's).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_layer_rules import ALLOWED, EXCEPTIONS, PARTS, part_of

REPO = Path(__file__).resolve().parents[2]
#: the parts checked at run time (cli names everything; trainer and integrations need extras)
CHECKED = ("wire", "client", "sandboxes", "tasks", "server")

# Imports each module of sandgym.<part> in turn; prints {module: [parts of sandgym it loaded]}.
PROBE = """
import importlib, json, pkgutil, sys
part = sys.argv[1]
pkg = importlib.import_module("sandgym." + part)
def parts():
    out = set()
    for m in list(sys.modules):
        top, _, rest = m.partition(".")
        if top == "sandgym" and rest:
            out.add(rest.partition(".")[0])
        elif top in ("lab", "tests"):
            out.add(top)
    return out
loaded = {pkg.__name__: sorted(parts())}
for info in sorted(pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."), key=lambda i: i.name):
    if ".catalog" in info.name:
        continue
    importlib.import_module(info.name)
    loaded[info.name] = sorted(parts())
print(json.dumps(loaded))
"""


def _loaded(part: str) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, part], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("part", CHECKED)
def test_importing_a_part_loads_only_what_its_layer_allows(part: str) -> None:
    loaded = _loaded(part)
    assert len(loaded) >= 2, f"expected every module of sandgym.{part}, got {sorted(loaded)}"
    may = ALLOWED[part] | {part}
    offenders = {m: sorted(set(parts) - may) for m, parts in loaded.items() if set(parts) - may}
    assert not offenders, (
        f"sandgym.{part} may load {sorted(may)}; these modules loaded more: {offenders}"
    )


MODULE_PATH = re.compile(r"^(sandgym(\.\w+)+|lab(\.\w+)+)(:\w+)?$")


def _module_strings(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_PATH.match(node.value):
                found.append((node.lineno, node.value.partition(":")[0]))
    return found


@pytest.mark.parametrize("part", CHECKED)
def test_a_part_names_no_forbidden_module_in_a_string(part: str) -> None:
    sources = [
        p for p in sorted((REPO / "sandgym" / part).rglob("*.py")) if "catalog" not in p.parts
    ]
    assert sources
    may = ALLOWED[part] | {part, "sandgym"}
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name}"
        for path in sources
        for line, name in _module_strings(path)
        if part_of(name) in {*PARTS, "lab"} - may
        and (str(path.relative_to(REPO)), name) not in EXCEPTIONS
    ]
    assert not offenders, f"sandgym.{part} may name {sorted(may)}; found: {offenders}"
