"""`sandgym tasks list|check`: list the ids a server would serve; check tasks end to end.

`check` runs, for each task, the oracle solution in a fresh sandbox and then the verifier
(must give 1.0), and a no-op episode in another fresh sandbox (must give 0.0). With `--json`
it prints exactly one document:
`{"tasks":[{"task_id":..., "oracle_reward":float|null, "noop_reward":float|null,
"error":str|null}, ...]}`; the exit status is 1 when any task misses either mark.
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

from tasks.errors import TaskError
from tasks.loaders import load_dataset
from tasks.models import TaskSpec
from tasks.registry import CATALOG_DIR, TaskRegistry, load_builtin
from tasks.runtime import (
    parse_image_map,
    prepare_episode,
    run_oracle,
    run_verifier,
    sandbox_spec_for,
)

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tasks_command", metavar="ACTION")
    p_list = sub.add_parser("list", help="list every task id the server would serve")
    p_list.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="DIR",
        help="a task directory or dataset folder (repeatable)",
    )
    p_list.add_argument("--no-builtin", action="store_true", help="leave out the catalog")
    p_list.add_argument("--json", action="store_true", help="print one JSON document")

    p_check = sub.add_parser("check", help="oracle must score 1.0 and a no-op episode 0.0")
    p_check.add_argument(
        "paths", nargs="+", metavar="PATH", help="task directories or dataset folders"
    )
    p_check.add_argument("--backend", default="local", help="sandbox backend (default: local)")
    p_check.add_argument(
        "--image-map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="run tasks based on image FROM on image TO (repeatable)",
    )
    p_check.add_argument("--seed", type=int, default=0, help="seed of procedural tasks")
    p_check.add_argument(
        "--allow-run",
        action="store_true",
        help="on backends that build no image, execute the Dockerfiles' RUN lines",
    )
    p_check.add_argument("--concurrency", type=int, default=2, help="tasks checked at once")
    p_check.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    if args.tasks_command == "list":
        return _list(args)
    if args.tasks_command == "check":
        return asyncio.run(_check_all(args))
    print("usage: sandgym tasks {list,check} ... (see --help)", file=sys.stderr)
    return 2


def _list(args: argparse.Namespace) -> int:
    try:
        reg = TaskRegistry(args.tasks, include_builtin=not args.no_builtin)
    except TaskError as exc:
        print(f"sandgym tasks list: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = {
            "tasks": [
                {
                    "task_id": t.id,
                    "format": t.source_format,
                    "procedural": t.procedural,
                    "verifier": t.verifier.kind,
                    "source_dir": str(t.source_dir) if t.source_dir else None,
                    "family": t.metadata.get("category"),
                }
                for t in reg.list()
            ],
            "errors": [{"path": p, "error": m} for p, m in reg.errors.items()],
        }
        print(json.dumps(doc))
    else:
        for t in reg.list():
            print(t.id)
    return 0


def _load_for_check(path: str) -> list[TaskSpec]:
    p = Path(path).absolute()
    if p.resolve() == CATALOG_DIR.resolve():
        return load_builtin()  # the catalog checks under its registry ids
    if p.parent.resolve() == CATALOG_DIR.resolve():
        return [t for t in load_builtin() if t.id == f"builtin/{p.name}"]
    return load_dataset(p)


async def check_task(
    task: TaskSpec, backend: Any, image_map: dict[str, str], seed: int, allow_run: bool = False
) -> dict[str, Any]:
    """Oracle episode then no-op episode, each in a fresh sandbox."""
    entry: dict[str, Any] = {
        "task_id": task.id,
        "oracle_reward": None,
        "noop_reward": None,
        "error": None,
    }
    errors: list[str] = []
    try:
        spec = sandbox_spec_for(task, image_map, allow_run=allow_run)
    except TaskError as exc:  # e.g. an env template whose host variable is unset
        log.warning("task %s: no sandbox spec: %s", task.id, exc)
        entry["error"] = f"setup: {type(exc).__name__}: {exc}"
        return entry
    for phase in ("oracle", "noop"):
        start = time.perf_counter()
        sandbox = None
        try:
            sandbox = await backend.create(spec)
            setup = await prepare_episode(task, sandbox, seed)
            if phase == "oracle":
                res = await run_oracle(task, sandbox, setup)
                if res.exit_code != 0:
                    log.warning(
                        "task %s: oracle exited %s: %s",
                        task.id,
                        res.exit_code,
                        (res.stderr or res.stdout)[-500:],
                    )
            result = await run_verifier(task, sandbox, setup)
            entry[f"{phase}_reward"] = result.reward
            expected = 1.0 if phase == "oracle" else 0.0
            if result.reward != expected:
                log.warning(
                    "task %s: %s reward %s (expected %s); verifier output:\n%s",
                    task.id,
                    phase,
                    result.reward,
                    expected,
                    result.output[-1500:],
                )
        except Exception as exc:  # every failure is reported per task, never aborts the run
            errors.append(f"{phase}: {type(exc).__name__}: {exc}")
            log.warning("task %s: %s failed: %s", task.id, phase, exc)
        finally:
            if sandbox is not None:
                try:
                    await asyncio.shield(sandbox.close())
                except Exception as exc:  # e.g. the engine restarted: report, keep checking
                    errors.append(f"{phase}: close: {type(exc).__name__}: {exc}")
                    log.warning("task %s: closing the %s sandbox failed: %s", task.id, phase, exc)
        log.info("task %s: %s done in %.1f s", task.id, phase, time.perf_counter() - start)
    entry["error"] = "; ".join(errors) or None
    return entry


def entry_ok(entry: dict[str, Any]) -> bool:
    return entry["error"] is None and entry["oracle_reward"] == 1.0 and entry["noop_reward"] == 0.0


async def check_tasks(
    tasks: list[TaskSpec],
    backend_name: str,
    image_map: dict[str, str],
    seed: int = 0,
    concurrency: int = 2,
    allow_run: bool = False,
) -> list[dict[str, Any]]:
    from sandboxes import get_backend

    backend = get_backend(backend_name)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: TaskSpec) -> dict[str, Any]:
        async with sem:
            return await check_task(t, backend, image_map, seed, allow_run)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await backend.aclose()


async def _check_all(args: argparse.Namespace) -> int:
    try:
        image_map = parse_image_map(args.image_map)
        tasks: list[TaskSpec] = []
        for p in args.paths:
            tasks.extend(_load_for_check(p))
    except (TaskError, ValueError) as exc:
        print(f"sandgym tasks check: {exc}", file=sys.stderr)
        return 2
    entries = await check_tasks(
        tasks, args.backend, image_map, args.seed, args.concurrency, args.allow_run
    )
    if args.json:
        print(json.dumps({"tasks": entries}))
    else:
        for e in entries:
            mark = "ok  " if entry_ok(e) else "FAIL"
            print(
                f"{mark} {e['task_id']}: oracle={e['oracle_reward']} noop={e['noop_reward']}"
                + (f" error={e['error']}" if e["error"] else "")
            )
    return 0 if all(entry_ok(e) for e in entries) else 1
