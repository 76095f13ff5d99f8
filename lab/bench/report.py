"""Shared parts of the benchmarks: one JSON document, written to `--out` and/or printed, and
the percentiles every benchmark reports (numpy's, nearest rank).

Every document written to a file carries `provenance`, filled in here and nowhere by hand: the
command that made it, the commit of the code that measured it (`git rev-parse HEAD`), whether
tracked files differed from that commit, and when it was written. tests/unit/test_bench_results.py
checks that the committed results hold no field their writer does not produce.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100) of a non-empty sample, by nearest rank: always one of
    the samples (numpy's `inverted_cdf`), the definition every committed figure used."""
    if len(samples) == 0:
        raise ValueError("percentile of an empty sample: expected at least one value")
    return float(np.percentile(samples, q, method="inverted_cdf"))


def percentile_or_none(samples: Sequence[float], q: float) -> float | None:
    """`percentile`, or None for an empty sample."""
    return percentile(samples, q) if len(samples) else None


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_commit() -> str | None:
    """The commit the benchmark code was checked out at (None outside a git checkout)."""
    return _git("rev-parse", "HEAD")


def file_commit(path: Path) -> str | None:
    """The last commit that changed `path` (None when it was never committed)."""
    return _git("log", "-1", "--format=%H", "--", str(path)) or None


def _utc(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def provenance(command: str | None = None) -> dict[str, Any]:
    """Where a result comes from: the command line (default: `sandgym` and this process's
    arguments), the code's commit, whether tracked files outside lab/bench/results/ differed from
    it (`git_dirty`), and the time (UTC) the run started."""
    # lab/bench/results/ is the benchmarks' output (a --merge run starts from a changed file there)
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!lab/bench/results")
    return {
        "command": command or "sandgym " + shlex.join(sys.argv[1:]),
        "git_commit": git_commit(),
        "git_dirty": None if status is None else bool(status),
        "started_at": _utc(),
    }


_run: dict[str, Any] | None = None


def start_run(command: str | None = None) -> None:
    """Record the provenance at the start of a benchmark run (`sandgym bench` calls this), so a
    result names the code that measured it even if the checkout changes while it runs."""
    global _run
    _run = provenance(command)


def save_json(doc: dict[str, Any], out: Path | None, indent: int = 2) -> str:
    """Serialise `doc`; when `out` is given, stamp `provenance` (the run's, from `start_run`,
    else taken now) with the time it was written, and write it there (parents created).
    Returns the text."""
    if out is not None:
        doc["provenance"] = {**(_run or provenance()), "written_at": _utc()}
    text = json.dumps(doc, indent=indent)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    return text
