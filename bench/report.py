"""Shared parts of the benchmarks: one JSON document, written to `--out` and/or printed, and
the percentiles every benchmark reports (numpy's, nearest rank)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (q in 0..100) of a non-empty sample, by nearest rank: always one of
    the samples (numpy's `inverted_cdf`), the definition every committed figure used."""
    if len(samples) == 0:
        raise ValueError("percentile of an empty sample: expected at least one value")
    return float(np.percentile(samples, q, method="inverted_cdf"))


def percentile_or_none(samples: Sequence[float], q: float) -> float | None:
    """`percentile`, or None for an empty sample."""
    return percentile(samples, q) if len(samples) else None


def save_json(doc: dict[str, Any], out: Path | None, indent: int = 2) -> str:
    """Serialise `doc`; when `out` is given, write it there (parents created). Returns the text."""
    text = json.dumps(doc, indent=indent)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    return text
