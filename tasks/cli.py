"""`sandgym tasks list|check`: list the ids a server would serve; check tasks end to end.

`check` runs, for each task, the oracle solution in a fresh sandbox and then the verifier
(must give 1.0), and a no-op episode in another fresh sandbox (must give 0.0). With `--json`
it prints exactly one document:
`{"tasks":[{"task_id":..., "oracle_reward":float|null, "noop_reward":float|null,
"error":str|null}, ...]}`; the exit status is 1 when any task misses either mark.

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
import re
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from tasks.errors import TaskError
from tasks.loaders import load_dataset
from tasks.models import TaskSpec
from tasks.registry import CATALOG_DIR, TaskRegistry, load_builtin
from tasks.runtime import (
    parse_image_map,
    prepare_episode,
    run_oracle,
    sandbox_spec_for,
    score_step,
)

log = logging.getLogger(__name__)

#: how much of an output's tail `check_task(detail=True)` keeps
DETAIL_CHARS = 4000
#: a line that says a connection or a name lookup failed: `check_task(detail=True)` keeps such
#: lines of the whole oracle output (`oracle_network_lines`), since the tail often lacks them
NETWORK_FAILURE_RE = re.compile(
    r"Name or service not known|Temporary failure in name resolution|Could not resolve|"
    r"Failed to resolve|Max retries exceeded|Network is unreachable|Connection timed out|"
    r"Failed to establish a new connection|couldn't connect to|Could not connect to|"
    r"unable to access|Failed to connect to|is not available for this version of R|"
    r"Download_fail",
    re.IGNORECASE,
)
NETWORK_LINES = 20


def network_failure_lines(text: str) -> list[str]:
    """The distinct lines of `text` that say a connection or name lookup failed (at most
    NETWORK_LINES, each cut to 400 characters)."""
    out: list[str] = []
    for line in text.splitlines():
        if NETWORK_FAILURE_RE.search(line):
            line = line.strip()[:400]
            if line not in out:
                out.append(line)
                if len(out) == NETWORK_LINES:
                    break
    return out


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

    from tasks.prepare import add_prepare_arguments

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
        from tasks.prepare import run_prepare

        return run_prepare(args)
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


def _load_for_check(path: str, errors: dict[str, str] | None = None) -> list[TaskSpec]:
    p = Path(path).absolute()
    if p.resolve() == CATALOG_DIR.resolve():
        return load_builtin()  # the catalog checks under its registry ids
    if p.parent.resolve() == CATALOG_DIR.resolve():
        return [t for t in load_builtin() if t.id == f"builtin/{p.name}"]
    return load_dataset(p, errors)


def load_error_entry(path: str | Path, message: str) -> dict[str, Any]:
    """The entry of a task directory that did not load (its id is the directory name)."""
    return {
        "task_id": Path(path).name,
        "oracle_reward": None,
        "noop_reward": None,
        "error": f"load: {message}",
        "phase_errors": [
            {"phase": "load", "error_type": message.partition(":")[0], "message": message}
        ],
        "shortfall": f"the task directory did not load: {message}",
    }


def load_for_check(paths: Iterable[str]) -> tuple[list[TaskSpec], list[dict[str, Any]]]:
    """Every task below `paths`, and one error entry per directory (or path) that failed to
    load; a failure never hides the other tasks."""
    tasks: list[TaskSpec] = []
    failed: list[dict[str, Any]] = []
    for p in paths:
        errors: dict[str, str] = {}
        try:
            tasks.extend(_load_for_check(p, errors))
        except TaskError as exc:
            failed.append(load_error_entry(p, f"{type(exc).__name__}: {exc}"))
        for child, msg in sorted(errors.items()):
            failed.append(load_error_entry(child, f"TaskLoadError: {msg}"))
    return tasks, failed


# -- streaming results (shared with bench/harbor_compat.py) -----------------------------------


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


async def check_task(
    task: TaskSpec,
    backend: Any,
    image_map: dict[str, str],
    seed: int,
    allow_run: bool = False,
    detail: bool = False,
) -> dict[str, Any]:
    """Oracle episode then no-op episode, each in a fresh sandbox. With `detail`, the entry also
    carries the tails of the oracle's output and of each verifier run (`oracle_exit_code`,
    `oracle_output`, `oracle_verifier_output`, `noop_verifier_output`) and the oracle output's
    failed connections wherever they were (`oracle_network_lines`), for reports that must say
    why a reward fell short."""
    entry: dict[str, Any] = {
        "task_id": task.id,
        "oracle_reward": None,
        "noop_reward": None,
        "error": None,
    }
    errors: list[str] = []
    typed: list[dict[str, str]] = []
    try:
        spec = sandbox_spec_for(task, image_map, allow_run=allow_run)
    except TaskError as exc:  # e.g. an env template whose host variable is unset
        log.warning("task %s: no sandbox spec: %s", task.id, exc)
        entry["error"] = f"setup: {type(exc).__name__}: {exc}"
        entry["phase_errors"] = [
            {"phase": "setup", "error_type": type(exc).__name__, "message": str(exc)}
        ]
        entry["shortfall"] = shortfall(entry)
        return entry
    for phase in ("oracle", "noop"):
        start = time.perf_counter()
        sandbox = None
        try:
            sandbox = await backend.create(spec)
            setup = await prepare_episode(task, sandbox, seed)
            while True:  # once, or once per step of a multi-step task
                if phase == "oracle":
                    res = await run_oracle(task, sandbox, setup)
                    entry["oracle_exit_code"] = res.exit_code
                    if detail:
                        out = (res.stdout or "") + (res.stderr or "")
                        entry["oracle_output"] = out[-DETAIL_CHARS:]
                        entry["oracle_network_lines"] = network_failure_lines(out)
                    if res.exit_code != 0:
                        log.warning(
                            "task %s: oracle exited %s: %s",
                            task.id,
                            res.exit_code,
                            (res.stderr or res.stdout)[-500:],
                        )
                result, outcome = await score_step(
                    task, sandbox, setup, backend=backend, image_map=image_map
                )
                if outcome.done:
                    break
            if outcome.step is not None:
                entry[f"{phase}_step_rewards"] = outcome.step["rewards"]
            entry[f"{phase}_reward"] = outcome.reward
            if detail:
                entry[f"{phase}_verifier_output"] = result.output[-DETAIL_CHARS:]
            expected = 1.0 if phase == "oracle" else 0.0
            if outcome.reward != expected:
                log.warning(
                    "task %s: %s reward %s (expected %s); verifier output:\n%s",
                    task.id,
                    phase,
                    outcome.reward,
                    expected,
                    result.output[-1500:],
                )
        except Exception as exc:  # every failure is reported per task, never aborts the run
            errors.append(f"{phase}: {type(exc).__name__}: {exc}")
            typed.append({"phase": phase, "error_type": type(exc).__name__, "message": str(exc)})
            log.warning("task %s: %s failed: %s", task.id, phase, exc)
        finally:
            if sandbox is not None:
                try:
                    await asyncio.shield(sandbox.close())
                except Exception as exc:  # e.g. the engine restarted: report, keep checking
                    errors.append(f"{phase}: close: {type(exc).__name__}: {exc}")
                    typed.append(
                        {
                            "phase": f"{phase} close",
                            "error_type": type(exc).__name__,
                            "message": str(exc),
                        }
                    )
                    log.warning("task %s: closing the %s sandbox failed: %s", task.id, phase, exc)
        log.info("task %s: %s done in %.1f s", task.id, phase, time.perf_counter() - start)
    entry["error"] = "; ".join(errors) or None
    entry["phase_errors"] = typed
    entry["shortfall"] = shortfall(entry)
    return entry


#: the one sentence `shortfall` gives for an error type a maintainer meets often
_ERROR_ACTIONS = {
    "VerifierError": "the verifier did not give a reward",
    "SandboxCreateError": "the environment did not start (its image did not build or run)",
    "TaskUnsupportedError": "the task cannot run here as configured",
    "TaskLoadError": "the task directory did not load",
}


def shortfall(entry: dict[str, Any]) -> str | None:
    """The one reason a maintainer can act on why this check fell short (None when it did
    not), read from the entry's typed fields: its first phase error (type and message), else
    the oracle's exit code and reward, else the no-op's reward."""
    typed = entry.get("phase_errors") or []
    if typed:
        first = typed[0]
        what = _ERROR_ACTIONS.get(first["error_type"], f"{first['error_type']} raised")
        return f"{first['phase']}: {what}: {first['message'][:300]}"
    oracle, noop = entry.get("oracle_reward"), entry.get("noop_reward")
    if oracle is not None and oracle != 1.0:
        code = entry.get("oracle_exit_code")
        if code not in (None, 0):
            return f"oracle: the solution exited {code} and the verifier gave it {oracle}"
        return f"oracle: the solution ran but the verifier gave it {oracle}, not 1.0"
    if noop is not None and noop != 0.0:
        return (
            f"noop: the untouched environment already scores {noop}: its tests do not tell it "
            "from a solved one"
        )
    return None


def entry_ok(entry: dict[str, Any]) -> bool:
    return entry["error"] is None and entry["oracle_reward"] == 1.0 and entry["noop_reward"] == 0.0


async def check_tasks(
    tasks: list[TaskSpec],
    backend_name: str,
    image_map: dict[str, str],
    seed: int = 0,
    concurrency: int = 2,
    allow_run: bool = False,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Check `tasks` with bounded concurrency; `on_result` sees each entry as it finishes.
    The list comes back in the order of `tasks`."""
    from sandboxes import get_backend

    backend = get_backend(backend_name)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: TaskSpec) -> dict[str, Any]:
        async with sem:
            entry = await check_task(t, backend, image_map, seed, allow_run)
        if on_result is not None:
            on_result(entry)
        return entry

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
    for e in failed:
        log.warning("task %s did not load: %s", e["task_id"], e["error"])
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
    failed = [e for e in failed if e["task_id"] not in done]
    tasks = [t for t in tasks if t.id not in done]
    sink = JsonlSink(sys.stdout if args.jsonl else None, out_path)
    try:
        for e in failed:
            sink.write(e)
        entries = await check_tasks(
            tasks,
            args.backend,
            image_map,
            args.seed,
            args.concurrency,
            args.allow_run,
            on_result=sink.write,
        )
    finally:
        sink.close()
    entries = earlier + failed + entries
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
    return 0 if all(entry_ok(e) for e in entries) else 1
