"""The Terminal-Bench 2.0 tasks of `sandgym bench harbor_provider`: which ones (a rule fixed before
the run, over the committed `harbor_compat` record) and the one prepared copy both environments run.

Selection (`select_tasks`): of the Terminal-Bench 2.0 lines in `lab/bench/results/harbor_compat.jsonl`
(the last line of each task), the tasks whose recorded category is `clean`
(`lab.bench.compat_outcome.recorded_category`) with a shipped solution, leaving out those that needed
what only sandgym's side would do: a base image the compat run mapped (`--image-map`; Harbor's
docker environment builds the Dockerfile's own `FROM`) or the classic builder's `COPY`
rewrite (sandgym's runtime makes it at build time, Harbor's docker environment does not). Of
those, the `n` with the shortest recorded `duration_s` (build, oracle and no-op together), ties by
name: short builds and short verifiers on a shared 2-core machine.

Preparation (`prepare`): each selected task is copied with the substitution code the compat run
used (`lab.bench.substitutions.prepare_task_copy`: uv from the package index, Debian's CPython for
`uvx -p 3.13`, ...), and a `no-network`/`allowlist` task gets `network_mode = "public"` (Harbor's
docker environment cannot enforce either here: see lab/bench/harbor_provider.py). Both environments
are handed that same directory, and `FROM` resolves to the same local stand-in image on the one
engine. Each task's record says what was applied.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lab.bench.compat_outcome import recorded_category
from lab.bench.harbor_shared_images import engine_image_id

DATASET = "terminal-bench-2.0"
#: the public copy of Terminal-Bench 2.0 the compat record was made from (lab/bench/harbor_compat_run.sh)
SOURCE = {
    "repo": "yujianll/skill-usage",
    "commit": "f9f89fadc42150d0b3de9dfa8ff31da31607ca89",
    "path": "terminal-bench-2",
}
SELECTION_RULE = (
    "last harbor_compat.jsonl line per terminal-bench-2.0 task; recorded category clean; "
    "oracle shipped; no --image-map'd base image and no classic-builder COPY rewrite (so "
    "Harbor's docker environment builds the same Dockerfile); the N with the shortest "
    "recorded duration_s, ties by name"
)
_NETWORK_RE = re.compile(r'^(\s*network_mode\s*=\s*)"(no-network|allowlist)"', re.MULTILINE)


class Tb2SelectionError(ValueError):
    """The compat record or the task folder does not hold the tasks the selection asks for."""


class Tb2Task(BaseModel):
    """One selected Terminal-Bench 2.0 task as the side by side runs it."""

    task: str
    recorded_duration_s: float | None = Field(description="harbor_compat's duration_s")
    recorded_build_s: float | None = None
    recorded_code_commit: str | None = Field(description="the compat line's code commit")
    base_image: str | None = Field(description="the Dockerfile's FROM, as the compat run read it")
    base_image_id: str | None = Field(
        None, description="the local stand-in image that FROM names on this engine (both sides)"
    )
    substitutions: list[dict[str, str]] = Field(
        default_factory=list, description="applied to the prepared copy now"
    )
    recorded_substitutions: list[str] = Field(
        default_factory=list, description="names the compat run applied"
    )
    network_mode_original: str | None = None
    public_copy: bool = Field(False, description="network_mode rewritten to public")

    @classmethod
    def from_record(cls, name: str, entry: dict[str, Any]) -> Tb2Task:
        """Task `name` with what its last compat line (`entry`, may be empty) recorded."""
        return cls(
            task=name,
            recorded_duration_s=entry.get("duration_s"),
            recorded_build_s=entry.get("build_s"),
            recorded_code_commit=entry.get("code_commit"),
            base_image=entry.get("base_image"),
            recorded_substitutions=_substitution_names(entry),
        )


def _substitution_names(entry: dict[str, Any]) -> list[str]:
    return [str(s.get("name")) for s in entry.get("substitutions") or []]


def _last_lines(jsonl: Path) -> dict[str, dict[str, Any]]:
    last: dict[str, dict[str, Any]] = {}
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("dataset") == DATASET:
            last[str(entry["task_id"])] = entry
    return last


def select_tasks(jsonl: Path, image_map: dict[str, str], n: int, tasks_dir: Path) -> list[Tb2Task]:
    """The first `n` tasks by `SELECTION_RULE` that `tasks_dir` holds (a task.toml)."""
    last = _last_lines(jsonl)
    if not last:
        raise Tb2SelectionError(f"expected {DATASET} lines in {jsonl}, found none")
    eligible: list[tuple[float, str, dict[str, Any]]] = []
    for name, e in last.items():
        subs = _substitution_names(e)
        if recorded_category(e)[0] != "clean" or not e.get("oracle_shipped"):
            continue
        if e.get("base_image") in image_map or "copy-dest-dir-for-classic-builder" in subs:
            continue
        eligible.append((float(e.get("duration_s") or 0.0), name, e))
    chosen: list[Tb2Task] = []
    for _, name, e in sorted(eligible):
        if len(chosen) == n:
            break
        if not (tasks_dir / name / "task.toml").is_file():
            raise Tb2SelectionError(
                f"expected {tasks_dir / name}/task.toml (task {name!r} is selected by the rule), "
                "found none: bring the whole task set in first"
            )
        chosen.append(Tb2Task.from_record(name, e))
    if len(chosen) < n:
        raise Tb2SelectionError(f"expected {n} tasks by the rule, found {len(chosen)}")
    return chosen


def named_tasks(jsonl: Path, names: list[str]) -> list[Tb2Task]:
    """Tasks named by the caller, each with what the compat record says of it (no rule)."""
    last = _last_lines(jsonl)
    return [Tb2Task.from_record(name, last.get(name, {})) for name in names]


def _image_id(image: str | None) -> str | None:
    found = engine_image_id(image) if image else None
    return (found or "")[:19] or None


def prepare(tasks: list[Tb2Task], tasks_dir: Path, dest: Path, cache_dir: Path) -> list[Tb2Task]:
    """Write each task's prepared copy to `dest/<task>` (substituted, public network) and return
    the records with what was applied."""
    from lab.bench.substitutions import DEBIAN_CPYTHON, debian_cpython_debs, prepare_task_copy

    cpython = {v: debian_cpython_debs(v, cache_dir) for v in DEBIAN_CPYTHON}
    out = []
    for t in tasks:
        dst = dest / t.task
        subs = prepare_task_copy(tasks_dir / t.task, dst, cpython)
        toml = dst / "task.toml"
        text = toml.read_text(encoding="utf-8")
        m = _NETWORK_RE.search(text)
        if m:
            toml.write_text(_NETWORK_RE.sub(r'\1"public"', text), encoding="utf-8")
        out.append(
            t.model_copy(
                update={
                    "substitutions": subs,
                    "network_mode_original": m.group(2) if m else None,
                    "public_copy": bool(m),
                    "base_image_id": _image_id(t.base_image),
                }
            )
        )
    return out
