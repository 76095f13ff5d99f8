"""`COPY a b /dest` for the classic builder: a destination directory spelled with its slash.

BuildKit copies several sources (or a wildcard matching several files) into `/dest` whether or
not it ends with `/`; the classic builder (the only one here: no BuildKit) refuses it: "When
using COPY with more than one source file, the destination must be a directory and end with a
/". `copy_destinations` adds the slash to such a `COPY`/`ADD` (shell form), which is what
BuildKit makes of it, and returns the lines it changed so a report can name them.
"""

from __future__ import annotations

import glob
from pathlib import Path

_WILDCARD = ("*", "?", "[")


def _sources_many(sources: list[str], context: Path | None) -> bool:
    if len(sources) > 1:
        return True
    src = sources[0]
    if context is None or not any(c in src for c in _WILDCARD):
        return False
    return len(glob.glob(str(context / src.lstrip("/")))) > 1


def copy_destinations(text: str, context: Path | None = None) -> tuple[str, list[str]]:
    """`text` with a `/` added to the destination of each `COPY`/`ADD` that has several
    sources (a wildcard counts by what it matches in `context`), and the original lines."""
    out: list[str] = []
    changed: list[str] = []
    for line in text.splitlines():
        tokens = line.split()
        if (
            len(tokens) >= 3
            and tokens[0].upper() in ("COPY", "ADD")
            and not tokens[1].startswith("[")
            and not line.rstrip().endswith("\\")
            and "<<" not in line
        ):
            args = [t for t in tokens[1:] if not t.startswith("--")]
            if len(args) >= 2 and not args[-1].endswith("/") and _sources_many(args[:-1], context):
                changed.append(line)
                line = line.rstrip() + "/"
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else ""), changed
