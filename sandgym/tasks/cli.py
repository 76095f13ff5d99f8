"""`sandgym tasks list|check`: list the ids a server would serve; check tasks end to end.

`check` runs, for each task, the oracle solution in a fresh sandbox and then the verifier
(must give 1.0), and a no-op episode in another fresh sandbox (must give 0.0). With `--json`
it prints exactly one document:
`{"tasks":[{"task_id":..., "oracle_reward":float|null, "noop_reward":float|null,
"error":str|null}, ...]}`; the exit status is 1 when any task misses either mark. Each check
is a typed `TaskCheck` (sandgym/tasks/check.py: per phase its outcome, reward and typed error); its line
is `TaskCheck.to_entry()`.

A task directory that fails to load does not stop the run: it is reported as an entry of its
own (`task_id` = the directory name, both rewards null, `error` = `"load: <ErrorType>:
<reason>"`) and every other task is still checked.

Streaming and resuming: `--jsonl` prints one JSON line per task as soon as it finishes (same
keys as the entries of `--json`) instead of the document at the end; `--out FILE` also appends
each line to FILE (flushed per task, so a run that is cut off keeps what it finished);
`--resume FILE` reads FILE, skips every task whose line is already there (a cut-off last line
is ignored) and appends the rest to it. With `--json` and `--resume`, the document holds the
earlier entries too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from sandgym.sandboxes import get_backend
from sandgym.tasks.check import TaskCheck, check_task, load_error_check
from sandgym.tasks.errors import TaskError
from sandgym.tasks.loaders import load_dataset
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.prepare import add_prepare_arguments, run_prepare
from sandgym.tasks.registry import CATALOG_DIR, TaskRegistry, load_builtin
from sandgym.tasks.sandbox_spec import parse_image_map

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

    add_prepare_arguments(
        sub.add_parser("prepare", help="build every task's environment ahead of training")
    )
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
    p_check.add_argument(
        "--jsonl",
        action="store_true",
        help="print one JSON line per task as it finishes (instead of one document at the end)",
    )
    p_check.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="also append each task's JSON line to FILE as it finishes",
    )
    p_check.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="FILE",
        help="skip the tasks FILE already holds a line for; append the others to it",
    )


def run(args: argparse.Namespace) -> int:
    if args.tasks_command == "prepare":
        return run_prepare(args)
    if args.tasks_command == "list":
        return _list(args)
    if args.tasks_command == "check":
        missing = [p for p in args.paths if not Path(p).exists()]
        # nothing to check at all is a typo; a missing path among others is an entry of its own
        # (a failure never hides the other tasks)
        if missing and len(missing) == len(args.paths):
            print(
                "sandgym tasks check: expected a task or dataset directory, found nothing at "
                + ", ".join(missing),
                file=sys.stderr,
            )
            return 2
        return asyncio.run(_check_all(args))
    print("usage: sandgym tasks {list,check} ... (see --help)", file=sys.stderr)
    return 2


def _list(args: argparse.Namespace) -> int:
    try:
        reg = TaskRegistry(args.tasks, include_builtin=not args.no_builtin)
    except TaskError as exc:  # a path the user gave that holds no tasks
        print(f"sandgym tasks list: {exc}", file=sys.stderr)
        return 2
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


def _load_for_check(path: str, errors: dict[str, str] | None = None) -> list[TaskSpec]:
    p = Path(path).absolute()
    if p.resolve() == CATALOG_DIR.resolve():
        return load_builtin()  # the catalog checks under its registry ids
    if p.parent.resolve() == CATALOG_DIR.resolve():
        return [t for t in load_builtin() if t.id == f"builtin/{p.name}"]
    return load_dataset(p, errors)


def load_for_check(paths: Iterable[str]) -> tuple[list[TaskSpec], list[TaskCheck]]:
    """Every task below `paths`, and one check (`stopped` at `load`) per directory (or path)
    that failed to load; a failure never hides the other tasks."""
    tasks: list[TaskSpec] = []
    failed: list[TaskCheck] = []
    for p in paths:
        errors: dict[str, str] = {}
        try:
            tasks.extend(_load_for_check(p, errors))
        except TaskError as exc:
            failed.append(load_error_check(p, type(exc).__name__, str(exc)))
        for child, msg in sorted(errors.items()):
            failed.append(load_error_check(child, "TaskLoadError", msg))
    return tasks, failed


# -- streaming results (shared with lab/bench/harbor_compat.py) -----------------------------------


def read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    """The complete lines of a JSONL results file (none if it does not exist). A line that
    does not parse, i.e. the last one of a run that was cut off mid-write, is skipped."""
    if path is None or not path.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s: skipping an incomplete line (a cut-off run)", path)
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


class JsonlSink:
    """Writes one JSON line per finished task: to a stream (stdout) and/or appended to a file,
    flushed and synced per line, so a run that is killed keeps every line it finished."""

    def __init__(self, stream: IO[str] | None = None, path: Path | None = None) -> None:
        self.stream = stream
        self.path = path
        self._fh: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a cut-off run may have left a partial last line: start ours on a fresh one
            if path.exists() and path.stat().st_size > 0:
                with path.open("rb") as fh:
                    fh.seek(-1, 2)
                    needs_nl = fh.read(1) != b"\n"
            else:
                needs_nl = False
            self._fh = path.open("a", encoding="utf-8")
            if needs_nl:
                self._fh.write("\n")

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=False)
        if self.stream is not None:
            self.stream.write(line + "\n")
            self.stream.flush()
        if self._fh is not None:
            self._fh.write(line + "\n")
            self._fh.flush()
            try:
                os.fsync(self._fh.fileno())
            except OSError:  # e.g. a pipe; flushed is as good as it gets
                pass

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def entry_ok(entry: dict[str, Any]) -> bool:
    """A JSON line (as `TaskCheck.to_entry` writes it, or read back from a file) met both marks."""
    return entry["error"] is None and entry["oracle_reward"] == 1.0 and entry["noop_reward"] == 0.0


async def check_tasks(
    tasks: list[TaskSpec],
    backend_name: str,
    image_map: dict[str, str],
    seed: int = 0,
    concurrency: int = 2,
    allow_run: bool = False,
    on_result: Callable[[TaskCheck], None] | None = None,
) -> list[TaskCheck]:
    """Check `tasks` with bounded concurrency; `on_result` sees each check as it finishes.
    The list comes back in the order of `tasks`."""

    backend = get_backend(backend_name)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: TaskSpec) -> TaskCheck:
        async with sem:
            check = await check_task(t, backend, image_map, seed, allow_run)
        if on_result is not None:
            on_result(check)
        return check

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await backend.aclose()


async def _check_all(args: argparse.Namespace) -> int:
    try:
        image_map = parse_image_map(args.image_map)
    except ValueError as exc:
        print(f"sandgym tasks check: {exc}", file=sys.stderr)
        return 2
    tasks, failed = load_for_check(args.paths)
    for c in failed:
        log.warning("task %s did not load: %s", c.task_id, c.error)
    if args.json and args.jsonl:
        print("sandgym tasks check: give --json or --jsonl, not both", file=sys.stderr)
        return 2
    out_path: Path | None = args.resume or args.out
    if args.resume is not None and args.out is not None and args.out != args.resume:
        print("sandgym tasks check: --out and --resume name different files", file=sys.stderr)
        return 2
    earlier = read_jsonl(args.resume)
    done = {e.get("task_id") for e in earlier}
    if done:
        log.info("resuming: %d task(s) already in %s", len(done), args.resume)
    failed = [c for c in failed if c.task_id not in done]
    tasks = [t for t in tasks if t.id not in done]
    sink = JsonlSink(sys.stdout if args.jsonl else None, out_path)
    try:
        for c in failed:
            sink.write(c.to_entry())
        checks = await check_tasks(
            tasks,
            args.backend,
            image_map,
            args.seed,
            args.concurrency,
            args.allow_run,
            on_result=lambda c: sink.write(c.to_entry()),
        )
    finally:
        sink.close()
    # the lines read back from --resume stay as they were written
    entries = earlier + [c.to_entry() for c in failed + checks]
    # (with --jsonl every line already went out as its task finished)
    if args.json and not args.jsonl:
        print(json.dumps({"tasks": entries}))
    elif not args.jsonl:
        for e in entries:
            mark = "ok  " if entry_ok(e) else "FAIL"
            print(
                f"{mark} {e['task_id']}: oracle={e['oracle_reward']} noop={e['noop_reward']}"
                + (f" -- {e['shortfall']}" if e.get("shortfall") else "")
            )
            if e.get("pristine_kept_inputs"):  # what verify=pristine would not carry
                print(
                    f"     pristine: outputs derived; the solution edits shipped "
                    f"{', '.join(e['pristine_kept_inputs'][:5])}, which a pristine verifier "
                    "would not see: declare them in metadata.outputs"
                )
            elif str(e.get("pristine", "")).startswith("refused"):
                print(f"     pristine: {e['pristine']}")
    return 0 if all(entry_ok(e) for e in entries) else 1
