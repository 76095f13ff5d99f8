"""Helpers shared by the loaders: safe reading, the symlink guard, unit parsing.

Loading never executes anything from a task directory: TOML, YAML (safe loader) and JSON
are parsed as data only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from sandgym.tasks.errors import TaskLoadError


def check_no_escaping_symlinks(root: Path) -> None:
    """Refuse a task directory holding a symlink that resolves outside it.

    Such a link would let a task (or a copy into the sandbox) read arbitrary host files.
    """
    real_root = Path(os.path.realpath(root))
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            target = Path(os.path.realpath(p))
            if target != real_root and real_root not in target.parents:
                raise TaskLoadError(
                    f"task {root}: symlink {p.relative_to(root)} -> {os.readlink(p)} points "
                    f"outside the task directory (resolves to {target}); refusing to load it"
                )


def read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskLoadError(f"expected {what} at {path}, found no such file") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise TaskLoadError(f"cannot read {what} at {path}: {exc}") from None


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(read_text(path, "a YAML file"))
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TaskLoadError(f"{path}: expected a mapping at the top, found {type(data).__name__}")
    return data


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_FACTOR_MB = {"": 1 / (1024 * 1024), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def size_to_mb(value: Any, field: str) -> int:
    """Harbor's deprecated size strings ("2G", "512M", "1.5GiB") or a number of bytes, in MiB."""
    if isinstance(value, bool):
        raise TaskLoadError(f"{field}: expected a size like '2G', found {value!r}")
    if isinstance(value, int | float):
        return max(1, int(value / (1024 * 1024)))
    m = _SIZE.match(str(value))
    if not m:
        raise TaskLoadError(f"{field}: expected a size like '2G' or '512M', found {value!r}")
    number, unit, _ = m.groups()
    return max(1, int(float(number) * _FACTOR_MB[unit.lower()]))


def as_float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TaskLoadError(f"{field}: expected a number, found {value!r}")
    try:
        return float(value)
    except ValueError:
        raise TaskLoadError(f"{field}: expected a number, found {value!r}") from None


def str_dict(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):  # compose style: ["A=1", "B=2"]
        out: dict[str, str] = {}
        for item in value:
            k, _, v = str(item).partition("=")
            out[k] = v
        return out
    if not isinstance(value, dict):
        raise TaskLoadError(f"{field}: expected a table of strings, found {value!r}")
    return {str(k): "" if v is None else str(v) for k, v in value.items()}
