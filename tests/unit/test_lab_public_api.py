"""`lab/` (benchmarks, the stand-in image builder) uses the product only through its public
names (DESIGN.md: "imports the product through its public modules only"), read from the source
with `ast`:

- no `from sandgym... import _name`, no `import sandgym._x` (a private module or name);
- no read or write of a `_private` attribute of an object that is not lab's own: `obj._x` (or
  `getattr(obj, "_x")`) where `obj` is not `self`/`cls` is allowed only when lab itself defines
  `_x` (on one of its classes, or as an argparse default it sets), or `obj` is a module that is not
  ours (`os._exit`, `ray._private`: vendors are not the product).

Where the lab needs something the product holds privately, the product gets a public, documented
way (for example `SandboxPool.ready_ids()` for the benchmark that once read `pool._keys`).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OWN_BASES = ("self", "cls")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def lab_defined_privates(paths: list[Path]) -> set[str]:
    """Private names lab itself gives its own objects: `self._x = ...`, `def _x` / `_x = ...` in a
    class body, and `set_defaults(_x=...)` / `ArgumentParser(...)` keywords."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in OWN_BASES:
                    names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign | ast.AnnAssign):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "set_defaults":
                    names |= {k.arg for k in node.keywords if k.arg}
    return {n for n in names if _private(n)}


def _foreign_modules(tree: ast.Module) -> set[str]:
    """Names bound to a module (or name) imported from outside sandgym and lab."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.partition(".")[0] not in ("sandgym", "lab"):
                    bound.add(a.asname or a.name.partition(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.partition(".")[0] not in ("sandgym", "lab"):
                bound |= {a.asname or a.name for a in node.names}
    return bound


def private_uses(path: Path, own: set[str]) -> list[str]:
    """Each private product name or attribute `path` reaches, as `file:line: what`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    foreign = _foreign_modules(tree)
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.partition(".")[0] == "sandgym":
                parts = node.module.split(".")
                found += [
                    f"{where}:{node.lineno}: from {node.module} import {a.name}"
                    for a in node.names
                    if _private(a.name) or any(_private(p) for p in parts)
                ]
        elif isinstance(node, ast.Import):
            found += [
                f"{where}:{node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("sandgym") and any(_private(p) for p in a.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and (base.id in OWN_BASES or base.id in foreign):
                continue
            if node.attr not in own:
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_lab_reaches_the_product_only_through_public_names() -> None:
    paths = _sources(REPO / "lab")
    assert len(paths) >= 30, f"expected lab's sources, found {len(paths)}"
    own = lab_defined_privates(paths)
    found = [use for path in paths for use in private_uses(path, own)]
    assert not found, (
        "lab/ may use sandgym's public names only (give the product a public method where the"
        f" lab needs one); found private uses: {found}"
    )


def test_the_check_sees_a_private_attribute_and_a_private_import(tmp_path: Path) -> None:
    """The checker itself: a pool's private attribute and a private function imported from a
    sandgym module are both reported; lab's own private attribute and a vendor's are not."""
    probe = tmp_path / "probe.py"
    source = (
        "import os\n"
        "from sandgym.sandboxes.pool.core import _hidden\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "def f(pool, other: Mine):\n"
        "    os._exit(0)\n"
        "    return pool._keys, other._mine, getattr(pool, '_secret')\n"
    )
    probe.write_text(source, encoding="utf-8")
    found = private_uses(probe, lab_defined_privates([probe]))
    assert [f.partition(": ")[2] for f in found] == [
        "from sandgym.sandboxes.pool.core import _hidden",
        "pool._keys",
        "getattr(pool, '_secret')",
    ], found
