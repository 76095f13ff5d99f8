"""`sandgym bench harbor_compat`: how many real public Harbor tasks run here, and why not the rest.

It runs the `sandgym tasks check` path (`tasks.cli.check_task`: oracle episode, then a fresh
no-op episode, each scored by the task's own verifier) over every task directory under
`--tasks-dir` (a sample of a public Harbor dataset, brought in by hand: never committed), on
one backend (default docker), with bounded concurrency and a per-task timeout. Before the
episodes it builds the task's image on its own, so "the environment does not build" reads apart
from "the verifier gave no reward".

Each task ends in one verdict, and every failure in one or more named reasons (see `REASONS`),
found from the named error types and the build/verifier output: a base image that is not in
the local engine, a build step that needed a host other than Debian's mirror or PyPI, an apt
package the mapped base does not carry, a verifier that needed the network, no reward file, a
timeout, a loader error, no oracle shipped. The figures:

- `env_builds`: the image builds (or the named image is present);
- `verifier_rewards`: the image builds and the verifier gave a reward in the no-op episode (and
  in the oracle episode, when the task ships one) without a `verifier_error`;
- `noop_zero`: the no-op episode scored 0.0; `oracle_one`: the oracle scored 1.0 (over the
  tasks that ship a solution; `oracle_shipped` counts them).

`--json` prints one JSON document; `--out PATH` also writes it (committed figures:
`bench/results/harbor_compat.json`). `--prune-images` removes the `sandgym/ctx:*` images this
run built (only those that did not exist before it, found by the tasks' own context hashes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.report import save_json
from tasks.errors import TaskError
from tasks.loaders import is_task_dir, load_task_dir
from tasks.models import TaskSpec
from tasks.runtime import parse_image_map, sandbox_spec_for, task_dockerfile

log = logging.getLogger("bench.harbor_compat")

CTX_REPO = "sandgym/ctx"
#: pause before re-running a task after an engine failure (a restarting dockerd needs a moment)
INFRA_RETRY_WAIT_S = 10.0

#: reason -> what it means (the JSON carries this table, so the figures read on their own).
REASONS: dict[str, str] = {
    "loader_error": "the task directory did not load into a TaskSpec (our loader refused it)",
    "base_image_unavailable": "the Dockerfile's FROM image is not in the local engine and no "
    "registry is reachable (add an --image-map)",
    "build_network": "a build step needed a host that cannot be reached from here (only "
    "Debian's mirror and PyPI are)",
    "build_pip_unresolvable": "pip found no distribution for a pinned requirement (the version "
    "needs another Python than the mapped base's, or PyPI has none)",
    "build_apt_package_missing": "an apt package does not exist on the mapped base (Debian "
    "bookworm standing in for Ubuntu 24.04)",
    "build_timeout": "the image did not build within the per-task timeout",
    "build_other": "the build failed for another reason (see the task's build_error)",
    "verifier_network": "the verifier failed while fetching something from the network",
    "verifier_timeout": "the verifier did not finish within its timeout_sec",
    "verifier_tool_missing": "the verifier calls a program its image lacks or cannot install "
    "there (e.g. a grader baked into a base image that had to be substituted, or one needing a "
    "newer Python than the offline Debian bookworm base's 3.11)",
    "verifier_no_reward": "the verifier wrote no reward.txt/reward.json (its tests did not run)",
    "verifier_other": "the verifier's reward file was unusable for another reason",
    "noop_nonzero": "the untouched environment already scores above 0 (a graded partial-credit "
    "rubric, tests that do not discriminate, or an environment that ships the answer)",
    "oracle_not_shipped": "the task ships no solution/solve.sh, so no oracle run is possible",
    "oracle_below_one": "the shipped oracle solution scored below 1.0",
    "task_timeout": "the whole check (build + two episodes) ran past the per-task timeout",
    "infra": "the sandbox layer failed (engine unavailable or restarted, sandbox lost)",
    "task_unsupported": "the task cannot run here as configured (e.g. an env template whose host "
    "variable is unset)",
    "task_runtime_error": "a runtime step inside the sandbox failed (resetting /tests, COPY, "
    "the generator): see the task's error",
}

_NET = (
    r"Could not resolve|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|Connection refused|Connection timed out|Failed to connect|"
    r"curl: \(\d+\)|unable to resolve host|Failed to establish a new connection|"
    r"ConnectTimeout|ReadTimeout|Max retries exceeded|SSL: CERTIFICATE_VERIFY_FAILED|"
    r"failed: Temporary failure|Failed to fetch|fatal: unable to access"
)
_NET_RE = re.compile(_NET, re.IGNORECASE)
_BASE_RE = re.compile(
    r"pull access denied|manifest unknown|repository does not exist|"
    r"failed to resolve reference|not found: manifest|no such image",
    re.IGNORECASE,
)
_APT_MISSING_RE = re.compile(
    r"Unable to locate package|has no installation candidate|"
    r"Package '[^']+' has no installation candidate",
)
_PIP_RE = re.compile(
    r"No matching distribution found|Could not find a version that satisfies", re.IGNORECASE
)
_FAILED_STEP_RE = re.compile(r"The command '(.*?)' returned a non-zero code", re.DOTALL)
_FETCH_RE = re.compile(r"\b(wget|curl|git clone)\b[^|;&]*https?://(?!deb\.debian\.org|pypi)")
_PYVER_RE = re.compile(r"does not satisfy Python|Requires-Python|requires a different python")
_INFRA_RE = re.compile(
    r"ProtocolError|ConnectionError|SandboxLostError|BackendUnavailableError|"
    r"Connection aborted|IncompleteRead|no Docker engine answers",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--tasks-dir",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="a folder of Harbor task directories (a sample of a public dataset); repeatable, "
        "one dataset each, the --source-* options pair with them in order",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="check N tasks of each dataset"
    )
    parser.add_argument(
        "--sample-seed",
        type=int,
        default=None,
        help="shuffle the sorted task list with this seed before --limit (default: sorted)",
    )
    parser.add_argument("--concurrency", type=int, default=2, help="tasks checked at once")
    parser.add_argument("--backend", default="docker", help="sandbox backend (default: docker)")
    parser.add_argument(
        "--image-map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="run tasks based on image FROM on local image TO (repeatable)",
    )
    parser.add_argument(
        "--task-timeout-s",
        type=float,
        default=600.0,
        help="limit of one task's whole check: build, oracle and no-op episodes",
    )
    parser.add_argument(
        "--infra-retries",
        type=int,
        default=3,
        help="re-run a task whose check failed only in the sandbox layer (engine restarts)",
    )
    for key, what in (
        ("repo", "owner/name the tasks come from"),
        ("commit", "the commit they were taken at"),
        ("path", "the folder of the dataset inside that repository"),
        ("note", "how the sample was drawn, what was mapped or set (recorded verbatim)"),
    ):
        parser.add_argument(
            f"--source-{key}", action="append", default=[], help=f"{what} (one per --tasks-dir)"
        )
    parser.add_argument(
        "--prune-images",
        action="store_true",
        help="remove the sandgym/ctx images this run built (never ones that existed before)",
    )


# -- classification (pure; unit-tested) ---------------------------------------------------------


def classify_build_error(text: str) -> str:
    """The reason of a failed image build, from the build error and its log tail."""
    if _BASE_RE.search(text):
        return "base_image_unavailable"
    if _APT_MISSING_RE.search(text):
        return "build_apt_package_missing"
    if _PIP_RE.search(text):
        # pip reached an index but found nothing; when it could not reach one it says so too.
        return "build_network" if _NET_RE.search(text) else "build_pip_unresolvable"
    if _NET_RE.search(text):
        return "build_network"
    failed = _FAILED_STEP_RE.search(text)
    if failed and _FETCH_RE.search(failed.group(1)):
        return "build_network"  # a quiet download (wget -q, curl -s) from a host not reachable
    if _INFRA_RE.search(text):
        return "infra"
    return "build_other"


def classify_phase_error(text: str) -> str:
    """The reason of one failed `check_task` phase (`"<phase>: <ErrorType>: <message>"`)."""
    _, _, rest = text.partition(": ")
    etype, _, msg = rest.partition(": ")
    if etype == "TaskUnsupportedError" and "no oracle solution" in msg:
        return "oracle_not_shipped"
    if etype == "VerifierError":
        if "did not finish within" in msg:
            return "verifier_timeout"
        if _NET_RE.search(msg):
            return "verifier_network"
        if "command not found" in msg or _PYVER_RE.search(msg):
            return "verifier_tool_missing"
        if "wrote no reward" in msg:
            return "verifier_no_reward"
        return "verifier_other"
    if etype == "SandboxCreateError" and "building" in msg:
        return classify_build_error(msg)
    if _INFRA_RE.search(etype) or etype.startswith("Sandbox") or etype.endswith("Timeout"):
        return "infra"
    if etype == "TaskLoadError":
        return "loader_error"
    if etype == "TaskUnsupportedError":
        return "task_unsupported"
    return "task_runtime_error"


def split_phase_errors(error: str | None) -> list[str]:
    """`check_task` joins its phases' errors with '; '; split them back at the phase tags."""
    if not error:
        return []
    parts = re.split(r"(?:^|; )(?=(?:setup|oracle|noop): )", error)
    return [p for p in parts if p]


def verdict(entry: Mapping[str, Any]) -> list[str]:
    """Every reason this task's check fell short of a clean oracle 1.0 / no-op 0.0 (or [])."""
    reasons: list[str] = []
    if entry.get("load_error"):
        return ["loader_error"]
    if entry.get("timed_out"):
        reasons.append("task_timeout")
    if entry.get("build_error"):
        reasons.append(entry["build_reason"])
        return reasons
    for part in split_phase_errors(entry.get("error")):
        r = classify_phase_error(part)
        if r not in reasons:
            reasons.append(r)
    noop = entry.get("noop_reward")
    if noop is not None and noop != 0.0:
        reasons.append("noop_nonzero")
    oracle = entry.get("oracle_reward")
    if oracle is not None and oracle != 1.0:
        reasons.append("oracle_below_one")
    return reasons


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and shares over all checked task directories."""
    n = len(entries)

    def share(k: int, d: int) -> dict[str, Any]:
        return {"count": k, "of": d, "share": round(k / d, 3) if d else None}

    loaded = [e for e in entries if not e.get("load_error")]
    builds = [e for e in loaded if e.get("env_builds")]
    rewards = [
        e
        for e in builds
        if e.get("noop_reward") is not None
        and not any(r.startswith("verifier_") for r in e["reasons"])
        and not (e.get("oracle_shipped") and e.get("oracle_reward") is None)
    ]
    shipped = [e for e in loaded if e.get("oracle_shipped")]
    return {
        "tasks": n,
        "loaded": share(len(loaded), n),
        "env_builds": share(len(builds), n),
        "verifier_rewards": share(len(rewards), n),
        "noop_zero": share(sum(1 for e in entries if e.get("noop_reward") == 0.0), n),
        "oracle_shipped": share(len(shipped), n),
        "oracle_one": share(sum(1 for e in shipped if e.get("oracle_reward") == 1.0), len(shipped)),
        "clean": share(sum(1 for e in entries if not e["reasons"]), n),
    }


def group_reasons(entries: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for e in entries:
        for r in e["reasons"]:
            groups.setdefault(r, []).append(e["task_id"])
    return {
        r: {"count": len(ids), "meaning": REASONS.get(r, ""), "tasks": sorted(ids)}
        for r, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    }


# -- the run ------------------------------------------------------------------------------------


def _task_dirs(root: Path, limit: int | None, seed: int | None) -> list[Path]:
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if seed is not None:
        random.Random(seed).shuffle(dirs)
    return dirs[:limit] if limit is not None else dirs


def _load(path: Path) -> tuple[TaskSpec | None, str | None]:
    if not is_task_dir(path):
        return None, f"{path.name}: not a task directory (no task.toml/task.yaml/instance.json)"
    try:
        return load_task_dir(path), None
    except TaskError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _base_image(task: TaskSpec) -> str | None:
    try:
        df = task_dockerfile(task)
    except TaskError:
        return None
    return df.base_image if df is not None else task.environment.image


async def _check_one(
    task: TaskSpec,
    backend: Any,
    image_map: dict[str, str],
    timeout_s: float,
    retries: int,
) -> dict[str, Any]:
    from sandboxes import SandboxCreateError
    from tasks.cli import check_task

    entry: dict[str, Any] = {
        "task_id": task.id,
        "base_image": _base_image(task),
        "oracle_shipped": task.solution is not None,
        "env_builds": False,
        "build_s": None,
        "build_error": None,
        "oracle_reward": None,
        "noop_reward": None,
        "error": None,
        "timed_out": False,
        "attempts": 0,
    }
    start = time.perf_counter()
    try:
        spec = sandbox_spec_for(task, image_map)
    except TaskError as exc:  # reported like check_task reports it
        entry["error"] = f"setup: {type(exc).__name__}: {exc}"
        entry["duration_s"] = round(time.perf_counter() - start, 1)
        entry["reasons"] = verdict(entry)
        return entry
    image_for = getattr(backend, "image_for", None)
    for attempt in range(retries + 1):
        entry["attempts"] = attempt + 1
        entry.update(build_error=None, error=None, oracle_reward=None, noop_reward=None)
        remaining = timeout_s - (time.perf_counter() - start)
        try:
            if image_for is not None:
                t0 = time.perf_counter()
                try:
                    await asyncio.wait_for(image_for(spec), remaining)
                except TimeoutError:
                    raise
                except Exception as exc:  # e.g. the engine restarted under a streaming build
                    text = f"{type(exc).__name__}: {exc}"
                    entry["build_error"] = text[-3000:]
                    entry["build_reason"] = (
                        classify_build_error(text)
                        if isinstance(exc, SandboxCreateError)
                        else "infra"
                    )
                    entry["build_s"] = round(time.perf_counter() - t0, 1)
                    if entry["build_reason"] == "infra" and attempt < retries:
                        log.warning(
                            "task %s: build hit an infra failure, retrying: %s", task.id, text[:200]
                        )
                        await _wait_for_engine()
                        continue
                    break
                entry["build_s"] = round(time.perf_counter() - t0, 1)
            entry["env_builds"] = True
            remaining = timeout_s - (time.perf_counter() - start)
            try:
                res = await asyncio.wait_for(check_task(task, backend, image_map, 0), remaining)
            except TimeoutError:
                raise
            except Exception as exc:  # check_task reports per phase; anything else is infra
                res = {
                    "oracle_reward": None,
                    "noop_reward": None,
                    "error": f"noop: {type(exc).__name__}: {exc}",
                }
            entry.update(
                oracle_reward=res["oracle_reward"],
                noop_reward=res["noop_reward"],
                error=res["error"],
            )
        except TimeoutError:
            entry["timed_out"] = True
            if entry["build_s"] is None and image_for is not None:
                entry["build_error"] = f"no image within {timeout_s} s"
                entry["build_reason"] = "build_timeout"
            break
        phases = [classify_phase_error(p) for p in split_phase_errors(entry["error"])]
        if phases and all(p == "infra" for p in phases) and attempt < retries:
            log.warning("task %s: infra failure, retrying: %s", task.id, entry["error"])
            await _wait_for_engine()
            continue
        break
    entry["duration_s"] = round(time.perf_counter() - start, 1)
    entry["reasons"] = verdict(entry)
    return entry


async def _wait_for_engine(limit_s: float = 120.0) -> None:
    """After an engine failure: pause, then poll `docker info` until it answers (or give up)."""
    await asyncio.sleep(INFRA_RETRY_WAIT_S)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            "docker", "info", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        if await proc.wait() == 0:
            return
        await asyncio.sleep(2.0)


def _existing_ctx_tags() -> set[str]:
    out = subprocess.run(
        ["docker", "images", CTX_REPO, "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(out.stdout.split())


def _ctx_tag(task: TaskSpec, image_map: dict[str, str]) -> str | None:
    try:
        spec = sandbox_spec_for(task, image_map)
    except TaskError:
        return None
    if spec.build_context is None:
        return None
    digest = spec.context_hash()
    return f"{CTX_REPO}:{digest[:16]}" if digest else None


def _nth(values: list[str], i: int) -> str | None:
    return values[i] if i < len(values) else None


async def run_dataset(
    args: argparse.Namespace,
    index: int,
    backend: Any,
    image_map: dict[str, str],
    progress: Any = None,
) -> dict[str, Any]:
    """Check one dataset folder; its own summary, reasons and per-task entries."""
    tasks_dir: Path = args.tasks_dir[index]
    dirs = _task_dirs(tasks_dir, args.limit, args.sample_seed)
    loaded: list[TaskSpec] = []
    entries: list[dict[str, Any]] = []
    for d in dirs:
        task, err = _load(d)
        if task is None:
            entries.append({"task_id": d.name, "load_error": err, "reasons": ["loader_error"]})
        else:
            loaded.append(task)
    sem = asyncio.Semaphore(max(1, args.concurrency))
    done = 0

    async def one(t: TaskSpec) -> dict[str, Any]:
        nonlocal done
        async with sem:
            e = await _check_one(t, backend, image_map, args.task_timeout_s, args.infra_retries)
        done += 1
        if progress is not None:
            progress(e)
        log.info(
            "[%d/%d] %s: build=%s oracle=%s noop=%s reasons=%s (%.0f s)",
            done,
            len(loaded),
            t.id,
            e["env_builds"],
            e["oracle_reward"],
            e["noop_reward"],
            e["reasons"],
            e["duration_s"],
        )
        return e

    start = time.perf_counter()
    entries.extend(await asyncio.gather(*(one(t) for t in loaded)))
    bases: dict[str, int] = {}
    for t in loaded:
        b = _base_image(t) or "?"
        bases[b] = bases.get(b, 0) + 1
    return {
        "source": {
            "repo": _nth(args.source_repo, index),
            "commit": _nth(args.source_commit, index),
            "path": _nth(args.source_path, index),
            "sample": _nth(args.source_note, index),
            "tasks_dir": str(tasks_dir),
        },
        "base_images": bases,
        "wall_s": round(time.perf_counter() - start, 1),
        "summary": summarize(entries),
        "reasons": group_reasons(entries),
        "tasks": sorted(entries, key=lambda e: e["task_id"]),
        "_loaded": loaded,
    }


async def run_compat(args: argparse.Namespace) -> dict[str, Any]:
    """Every dataset in turn on one backend; a combined summary over all their tasks."""
    from sandboxes import get_backend

    image_map = parse_image_map(args.image_map)
    before = await asyncio.to_thread(_existing_ctx_tags) if args.prune_images else set()
    backend = get_backend(args.backend)
    start = time.perf_counter()
    datasets: list[dict[str, Any]] = []
    finished: list[dict[str, Any]] = []

    def progress(entry: dict[str, Any]) -> None:
        # a partial document after every task: a run cut short still leaves its figures
        finished.append(entry)
        if args.out is not None:
            partial = {"bench": "harbor_compat", "complete": False, "tasks_done": finished}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(partial, indent=1) + "\n", encoding="utf-8")

    try:
        for i in range(len(args.tasks_dir)):
            datasets.append(await run_dataset(args, i, backend, image_map, progress))
    finally:
        await backend.aclose()
    wall_s = time.perf_counter() - start
    loaded = [t for d in datasets for t in d.pop("_loaded")]

    pruned: list[str] = []
    if args.prune_images:
        ours = {tag for t in loaded if (tag := _ctx_tag(t, image_map))} - before
        for tag in sorted(ours):
            rc = await asyncio.to_thread(
                subprocess.run, ["docker", "image", "rm", tag], capture_output=True, check=False
            )
            if rc.returncode == 0:
                pruned.append(tag)

    entries = [e for d in datasets for e in d["tasks"]]
    return {
        "bench": "harbor_compat",
        "complete": True,
        "backend": args.backend,
        "image_map": image_map,
        "concurrency": args.concurrency,
        "task_timeout_s": args.task_timeout_s,
        "wall_s": round(wall_s, 1),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "summary": summarize(entries),
        "reasons": group_reasons(entries),
        "reason_meanings": REASONS,
        "pruned_images": len(pruned),
        "datasets": datasets,
    }


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for d in args.tasks_dir:
        if not d.is_dir():
            print(f"sandgym bench harbor_compat: no directory at {d}", file=sys.stderr)
            return 2
    try:
        doc = asyncio.run(run_compat(args))
    except ValueError as exc:  # a malformed --image-map
        print(f"sandgym bench harbor_compat: {exc}", file=sys.stderr)
        return 2
    text = save_json(doc, args.out, indent=1)
    if args.json:
        print(text)
    else:
        s = doc["summary"]
        for key in ("loaded", "env_builds", "verifier_rewards", "noop_zero", "oracle_one"):
            print(f"{key}: {s[key]['count']}/{s[key]['of']}")
        for r, g in doc["reasons"].items():
            print(f"  {r}: {g['count']}")
    return 0
