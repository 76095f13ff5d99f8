"""`sandgym tasks prepare DATASET...`: build every task's environment ahead of training.

For each task (a directory, or a dataset folder of them) the sandbox spec the server would use
is made (`sandbox_spec_for`, with the same `--image-map`) and the backend prepares what its
sandboxes are created from (`SandboxBackend.prepare`: on docker the image built from the task's
build context, `sandgym/ctx:<content hash>`, and its compose services' images). The images are
keyed by content, like the pool's fingerprint, so `serve` and `train` then find them and never
build inside an episode's reset. Tasks are prepared with bounded concurrency and a progress bar
on stderr; the report says what was built, reused and failed (and why), and the exit code is 1
when any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from sandgym.sandboxes import get_backend
from sandgym.tasks.errors import TaskError
from sandgym.tasks.loaders import load_dataset
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.sandbox_spec import parse_image_map, sandbox_spec_for

log = logging.getLogger(__name__)


def add_prepare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="DATASET", help="task directories or datasets")
    p.add_argument("--backend", default="docker", help="sandbox backend (default: docker)")
    p.add_argument(
        "--image-map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="build tasks based on image FROM on image TO (repeatable), as the server will",
    )
    p.add_argument("--concurrency", type=int, default=2, help="tasks prepared at once")
    p.add_argument("--json", action="store_true", help="print one JSON document")


async def prepare_tasks(
    tasks: list[TaskSpec],
    backend: Any,
    image_map: dict[str, str],
    concurrency: int = 2,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """One entry per task: `{"task_id", "status": built|reused|none|failed, "error",
    "duration_s"}`, in the order of `tasks`."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: TaskSpec) -> dict[str, Any]:
        entry: dict[str, Any] = {"task_id": task.id, "status": "failed", "error": None}
        start = time.perf_counter()
        async with sem:
            try:
                spec = sandbox_spec_for(task, image_map)
                entry["status"] = await backend.prepare(spec)
            except Exception as exc:  # every failure is reported per task, never aborts
                entry["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
                log.warning("task %s: not prepared: %s", task.id, exc)
        entry["duration_s"] = round(time.perf_counter() - start, 2)
        if progress is not None:
            progress.update(1)
            progress.set_postfix_str(f"{task.id}: {entry['status']}", refresh=False)
        return entry

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def summarize(entries: list[dict[str, Any]]) -> dict[str, int]:
    out = {"tasks": len(entries), "built": 0, "reused": 0, "none": 0, "failed": 0}
    for e in entries:
        out[e["status"]] += 1
    return out


async def _prepare_all(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    try:
        image_map = parse_image_map(args.image_map)
    except ValueError as exc:
        print(f"sandgym tasks prepare: {exc}", file=sys.stderr)
        return 2
    tasks: list[TaskSpec] = []
    load_errors: list[dict[str, Any]] = []
    for raw in args.paths:
        errors: dict[str, str] = {}
        try:
            tasks.extend(load_dataset(Path(raw), errors))
        except TaskError as exc:
            errors[raw] = str(exc)
        load_errors += [
            {"task_id": Path(p).name, "status": "failed", "error": f"load: {msg}"}
            for p, msg in errors.items()
        ]
    backend = get_backend(args.backend)
    started = time.perf_counter()
    try:
        with tqdm(total=len(tasks), desc="prepare", unit="task", file=sys.stderr) as bar:
            entries = await prepare_tasks(tasks, backend, image_map, args.concurrency, bar)
    finally:
        await backend.aclose()
    entries = load_errors + entries
    doc = {
        "backend": args.backend,
        "summary": summarize(entries),
        "wall_s": round(time.perf_counter() - started, 1),
        "tasks": entries,
    }
    if args.json:
        print(json.dumps(doc))
    else:
        s = doc["summary"]
        print(
            f"{s['tasks']} tasks: {s['built']} built, {s['reused']} reused, "
            f"{s['none']} need nothing on {args.backend}, {s['failed']} failed"
        )
        for e in entries:
            if e["status"] == "failed":
                print(f"  {e['task_id']}: {e['error']}")
    return 1 if doc["summary"]["failed"] else 0


def run_prepare(args: argparse.Namespace) -> int:
    return asyncio.run(_prepare_all(args))
