"""Shared output of the benchmarks: one JSON document, written to `--out` and/or printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save_json(doc: dict[str, Any], out: Path | None, indent: int = 2) -> str:
    """Serialise `doc`; when `out` is given, write it there (parents created). Returns the text."""
    text = json.dumps(doc, indent=indent)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    return text
