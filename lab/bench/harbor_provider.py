"""`sandgym bench harbor_provider`: Harbor's own runner with sandgym's provider and with Harbor's
own `docker` environment, side by side in one run, on the same engine and stand-in images.

Harbor 0.26.0 runs in its runner container (lab/bench/harbor_runner.py); sandgym's side talks to a
`sandgym serve --backend docker` this benchmark starts in-process. Per run (one Harbor job):
each trial's reward, wall time and environment start time (Harbor's `environment_setup`
phase), read from the result.json files Harbor wrote. The sequence:

1. `cold`: oracle, one trial per task, each environment (the first build of each image).
2. `nop`: the nop agent, one trial per task, each environment (rewards must be 0 alike).
3. `repeated`: oracle with `-k K` (default 4) trials per task, Harbor's docker first, then
   sandgym (where the warm pool should show).
4. `sandgym_only`: the catalog tasks as they are (network_mode = "no-network") and a task that
   switches network between phases, oracle, on sandgym's provider only: Harbor's docker
   environment cannot enforce a no-network policy on this machine (below).
5. `kill`: a Harbor job SIGKILLed mid-run (its container killed with SIGKILL, so Harbor's
   cleanup never runs), for each environment; then what is left on the engine (containers,
   networks, images of the job) and in the sandgym server (sandboxes it holds), at once and
   after sandgym's reaper had its chance (the server's idle sweep; the provider asks for a short
   idle timeout with `--ek idle_timeout_sec=`).

Why the side-by-side tasks are public-network copies: Harbor's docker environment enforces
`no-network` and `allowlist` only through its egress-control sidecar, which needs two registry
images pinned by digest (`alpine:3.23.4@sha256:5b10f4...` for a kernel probe and
`gogost/gost:3.2.7-nightly...@sha256:afc013...` for the sidecar). No registry is reachable here
and a digest-pinned reference cannot be met by a locally tagged stand-in, so Harbor refuses
every no-network task (`network_mode='no-network' is not supported by docker environment`). The
side-by-side runs therefore use copies of the catalog tasks with `network_mode = "public"`
(same Dockerfile, tests and solution); the originals run on sandgym alone.

Images (`--images`, default `shared`): each task copy's `environment/` is built once before the
first job, tagged, and named in the copy's `[environment] docker_image`; both sides then run
without `--force-build`, so each takes Harbor's prebuilt-image path and runs that one image
(lab/bench/harbor_shared_images.py), and the build time is recorded once per task
(`config.images`), in neither side's environment-start figures. `per-side` is the earlier way:
each side builds the Dockerfile itself (`--force-build`), so content made at build time may
differ between the sides.

Terminal-Bench 2.0 tasks (`--tb2-dir DIR --tb2-select N`, or `--tb2-tasks NAMES`): the clean
tasks of the committed `harbor_compat` record chosen by a rule fixed before the run, each copied
once with the compat run's substitutions (lab/bench/harbor_provider_tb2.py); both environments run
that one copy, and its Dockerfile's `FROM` resolves to the same local stand-in image. The result
records the rule, the source repository and commit, and what was applied to each task. Each job
records the host's load average at its start and end (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from lab.bench.harbor_provider_summary import HARBOR_DOCKER, SANDGYM, summarize
from lab.bench.harbor_runner import (
    REPO,
    SANDGYM_ENV,
    ensure_runner_image,
    harbor_argv,
    read_trials,
    runner_versions,
)
from lab.bench.report import save_json
from sandgym.server.settings import ServerSettings

#: catalog tasks that Harbor alone can run (no procedural generator, no desktop)
DEFAULT_TASKS = ("hello-file", "csv-to-json", "fix-mean", "dedupe-sort", "word-freq", "json-filter")
TOKEN = "bench-harbor-provider"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tasks", nargs="*", default=list(DEFAULT_TASKS), help="catalog task names (none: none)"
    )
    p.add_argument("-k", "--attempts", type=int, default=4, help="trials per task, repeated run")
    p.add_argument("--concurrency", type=int, default=1, help="Harbor's --n-concurrent")
    p.add_argument(
        "--extra-tasks-dir",
        type=Path,
        default=None,
        help="more Harbor task directories (e.g. Terminal-Bench 2.0 tasks) for the side by side",
    )
    p.add_argument(
        "--tb2-dir",
        type=Path,
        default=None,
        help="a Terminal-Bench 2.0 task folder (lab/bench/harbor_provider_tb2.py's SOURCE): its "
        "selected tasks run side by side, from one substituted copy",
    )
    p.add_argument(
        "--tb2-select",
        type=int,
        default=None,
        help="select this many clean TB2 tasks by lab/bench/harbor_provider_tb2.py's rule",
    )
    p.add_argument("--tb2-tasks", nargs="*", default=[], help="or name the TB2 tasks")
    p.add_argument(
        "--compat-jsonl",
        type=Path,
        default=REPO / "lab" / "bench" / "results" / "harbor_compat.jsonl",
        help="the harbor_compat record the TB2 selection reads",
    )
    p.add_argument(
        "--compat-json",
        type=Path,
        default=REPO / "lab" / "bench" / "results" / "harbor_compat.json",
        help="its summary (the --image-map the compat run used)",
    )
    p.add_argument(
        "--images",
        choices=("shared", "per-side"),
        default="shared",
        help="shared: each task's image built once before the jobs and named in the copies' "
        "[environment] docker_image, run by both sides (lab/bench/harbor_shared_images.py); "
        "per-side: each side builds its own (--force-build)",
    )
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/sandgym-bench-harbor-provider"))
    p.add_argument(
        "--skip", nargs="*", default=[], help="parts to skip: cold nop repeated sandgym_only kill"
    )
    p.add_argument(
        "--summarize",
        type=Path,
        default=None,
        metavar="FILE",
        help="run nothing: compute a stored document's summary and targets again from its raw "
        "runs (lab/bench/harbor_provider_summary.py) and write it to --out",
    )
    p.add_argument("--out", type=Path, default=None, help="write the JSON document here")
    p.add_argument("--json", action="store_true", help="print the JSON document")


def _log(msg: str) -> None:
    print(f"[harbor_provider {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prepare_tasks(names: list[str], root: Path, public: bool, extra: Path | None) -> Path:
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in names:
        shutil.copytree(REPO / "sandgym" / "tasks" / "catalog" / name, root / name)
        if public:
            toml = root / name / "task.toml"
            text = toml.read_text().replace(
                'network_mode = "no-network"', 'network_mode = "public"'
            )
            toml.write_text(text)
    if extra is not None:
        for task in sorted(p for p in extra.iterdir() if (p / "task.toml").is_file()):
            shutil.copytree(task, root / task.name)
    return root


class _Job:
    """One `harbor run`, its trials and wall time."""

    def __init__(self, part: str, env: str, agent: str, attempts: int) -> None:
        self.part, self.env, self.agent, self.attempts = part, env, agent, attempts
        self.name = f"{part}-{'sandgym' if env == SANDGYM_ENV else 'docker'}-{agent}-k{attempts}"

    def run(
        self, tasks: Path, jobs: Path, url: str, concurrency: int, extra: list[str]
    ) -> dict[str, Any]:
        argv = harbor_argv(
            tasks_path=tasks,
            jobs_dir=jobs,
            job_name=self.name,
            env=self.env,
            agent=self.agent,
            attempts=self.attempts,
            concurrency=concurrency,
            server_url=url if self.env == SANDGYM_ENV else None,
            token=TOKEN if self.env == SANDGYM_ENV else None,
            extra=extra,
        )
        _log(f"{self.name}: harbor run on {tasks.name}")
        load_start = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
        wall = time.perf_counter() - t0
        trials = read_trials(jobs / self.name)
        _log(f"{self.name}: exit {proc.returncode}, {len(trials)} trials in {wall:.0f}s")
        return {
            "part": self.part,
            "environment": SANDGYM if self.env == SANDGYM_ENV else HARBOR_DOCKER,
            "agent": self.agent,
            "attempts": self.attempts,
            "job": self.name,
            "harbor_exit_code": proc.returncode,
            "wall_s": round(wall, 2),
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
            "trials": [t.model_dump() for t in trials],
            "log_tail": (proc.stdout + proc.stderr)[-1500:] if proc.returncode else None,
        }


# -- leftovers ---------------------------------------------------------------------------------
def _docker_lines(*args: str) -> list[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    return [x for x in proc.stdout.splitlines() if x.strip()]


def _engine_objects(owner: str, task_names: list[str]) -> dict[str, list[str]]:
    """What a job may leave on the engine: sandgym's sandboxes (labelled with the server's
    owner id), Harbor's compose projects (named after its trials: `<task>__<id>...`), and
    the images each side built for a task (sandgym: `sandgym/ctx:*`, kept as a cache by
    design; Harbor: `hb__*`)."""
    containers = _docker_lines(
        "ps", "-a", "--filter", f"label=sandgym.owner={owner}", "--format", "{{.Names}}"
    )
    projects = _docker_lines(
        "ps",
        "-a",
        "--filter",
        "label=com.docker.compose.project",
        "--format",
        '{{.Label "com.docker.compose.project"}} {{.Names}}',
    )
    harbor = [
        line.split()[1]
        for line in projects
        if any(line.split()[0].startswith(t.replace(".", "-").lower()) for t in task_names)
    ]
    networks = _docker_lines("network", "ls", "--format", "{{.Name}}")
    ours_nets = [n for n in networks if n.startswith("sandgym") and owner[-8:] in n]
    harbor_nets = [
        n for n in networks if any(n.startswith(t.replace(".", "-").lower()) for t in task_names)
    ]
    images = _docker_lines("images", "--format", "{{.Repository}}:{{.Tag}}")
    return {
        "sandgym_containers": containers,
        "sandgym_networks": ours_nets,
        "harbor_containers": harbor,
        "harbor_networks": harbor_nets,
        "sandgym_ctx_images": [i for i in images if i.startswith("sandgym/ctx:")],
        "harbor_images": [i for i in images if i.startswith("hb__")],
    }


def _kill_run(
    env: str,
    tasks: Path,
    jobs: Path,
    url: str,
    owner: str,
    server: Any,
    task_names: list[str],
    idle_timeout_s: float,
) -> dict[str, Any]:
    """Start a Harbor job, SIGKILL it once some trial's environment is up, and count what it
    left: at once, and (sandgym) after the server's idle sweep had its chance."""
    side = SANDGYM if env == SANDGYM_ENV else HARBOR_DOCKER
    name = f"kill-{side}-{uuid.uuid4().hex[:6]}"
    container = f"sandgym-bench-harbor-{name}"
    extra = ["--ek", f"idle_timeout_sec={idle_timeout_s:g}"] if env == SANDGYM_ENV else []
    before = _engine_objects(owner, task_names)
    argv = harbor_argv(
        tasks_path=tasks,
        jobs_dir=jobs,
        job_name=name,
        env=env,
        agent="oracle",
        attempts=4,
        concurrency=2,
        server_url=url if env == SANDGYM_ENV else None,
        token=TOKEN if env == SANDGYM_ENV else None,
        container_name=container,
        extra=extra,
    )
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    up = False
    while time.monotonic() - t0 < 300 and proc.poll() is None:
        now = _engine_objects(owner, task_names)
        held = len(server.app.state.sandbox_api.leases)
        if (env == SANDGYM_ENV and held > 0) or (
            env != SANDGYM_ENV and len(now["harbor_containers"]) > len(before["harbor_containers"])
        ):
            up = True
            break
        time.sleep(0.2)
    killed_after = time.monotonic() - t0
    subprocess.run(["docker", "kill", "--signal", "KILL", container], capture_output=True)
    proc.wait(timeout=60)
    time.sleep(1.0)  # the engine settles the killed container's removal (--rm)
    at_kill = _engine_objects(owner, task_names)
    held_at_kill = len(server.app.state.sandbox_api.leases)
    result: dict[str, Any] = {
        "environment": side,
        "job": name,
        "killed_after_s": round(killed_after, 2),
        "environment_was_up": up,
        "at_kill": _counts(at_kill, before, held_at_kill),
    }
    if env == SANDGYM_ENV:
        pool = server.app.state.service.pool
        deadline = time.monotonic() + idle_timeout_s + 90
        while time.monotonic() < deadline:  # the idle sweep closes them; the pool removes them
            objs = _engine_objects(owner, task_names)
            left = set(_new(objs, before, "sandgym_containers")) - pool.ready_ids()
            busy = pool.snapshot().totals
            if not server.app.state.sandbox_api.leases and not left and not busy.creating:
                break
            time.sleep(0.5)
        after = _engine_objects(owner, task_names)
        ready = pool.ready_ids()
        result["after_reaper"] = _counts(after, before, len(server.app.state.sandbox_api.leases))
        # the pool's ready replacements (made after each release, for the next trial) are not
        # the killed job's: destroyed at server stop (`sandgym_containers_after_server_stop`)
        result["after_reaper"]["pool_ready_replacements"] = sorted(
            set(result["after_reaper"]["new_sandgym_containers"]) & ready
        )
        result["after_reaper"]["new_sandgym_containers"] = sorted(
            set(result["after_reaper"]["new_sandgym_containers"]) - ready
        )
        result["reaper_wait_s"] = round(time.monotonic() - t0 - killed_after, 2)
    else:
        result["after_reaper"] = None  # Harbor's docker environment has no reaper
        leftovers = _new(at_kill, before, "harbor_containers")
        for c in leftovers:  # clean the engine for what follows (not counted as Harbor's doing)
            subprocess.run(["docker", "rm", "-f", c], capture_output=True)
        for n in _new(at_kill, before, "harbor_networks"):
            subprocess.run(["docker", "network", "rm", n], capture_output=True)
    return result


def _new(objs: dict[str, list[str]], before: dict[str, list[str]], key: str) -> list[str]:
    return sorted(set(objs[key]) - set(before[key]))


def _counts(objs: dict[str, list[str]], before: dict[str, list[str]], held: int) -> dict[str, Any]:
    return {
        "new_sandgym_containers": _new(objs, before, "sandgym_containers"),
        "new_sandgym_networks": _new(objs, before, "sandgym_networks"),
        "new_harbor_containers": _new(objs, before, "harbor_containers"),
        "new_harbor_networks": _new(objs, before, "harbor_networks"),
        "new_sandgym_ctx_images": _new(objs, before, "sandgym_ctx_images"),
        "new_harbor_images": _new(objs, before, "harbor_images"),
        "sandboxes_held_by_server": held,
    }


# -- the run -----------------------------------------------------------------------------------
def _prepare_tb2(args: argparse.Namespace, public: Path, work: Path) -> dict[str, Any] | None:
    """The Terminal-Bench 2.0 tasks asked for, selected and prepared into `public` (one copy,
    run by both environments); what the result records of them."""
    from lab.bench import harbor_provider_tb2 as tb2

    if args.tb2_dir is None:
        return None
    if args.tb2_tasks:
        chosen, rule = tb2.named_tasks(args.compat_jsonl, list(args.tb2_tasks)), "named"
    else:
        image_map = json.loads(args.compat_json.read_text(encoding="utf-8")).get("image_map") or {}
        chosen = tb2.select_tasks(args.compat_jsonl, image_map, args.tb2_select or 6, args.tb2_dir)
        rule = tb2.SELECTION_RULE.replace("the N ", f"the {len(chosen)} ")
    prepared = tb2.prepare(chosen, args.tb2_dir, public, work)
    _log(f"terminal-bench-2.0: {[t.task for t in prepared]}")
    return {
        "dataset": tb2.DATASET,
        "source": tb2.SOURCE,
        "selection": rule,
        "compat_record": str(args.compat_jsonl.resolve().relative_to(REPO))
        if args.compat_jsonl.resolve().is_relative_to(REPO)
        else str(args.compat_jsonl),
        "tasks": [t.model_dump() for t in prepared],
    }


def _images_config(mode: str, public: Path, owner: str) -> dict[str, Any]:
    """How the two sides got each task's image; with `shared`, build them now (before any job:
    the build time is recorded here, in neither side's figures)."""
    if mode != "shared":
        return {
            "mode": "per-side",
            "how": "each side builds each task's environment/Dockerfile itself (--force-build)",
        }
    from lab.bench.harbor_shared_images import build_shared

    built = []
    for task in sorted(p for p in public.iterdir() if (p / "task.toml").is_file()):
        img = build_shared(task, owner)
        _log(f"shared image {img.image} ({img.image_id[:19]}) built in {img.build_s:.1f}s")
        built.append(img.model_dump())
    return {
        "mode": "shared",
        "how": "each task's environment/ built once before the jobs (docker build, classic "
        "builder), tagged, and named in the copy's [environment] docker_image; both sides run "
        "without --force-build, so Harbor's docker environment and sandgym's provider both take "
        "Harbor's prebuilt-image path and run that one image (lab/bench/harbor_shared_images.py)",
        "built": built,
        "build_total_s": round(sum(x["build_s"] for x in built), 2),
    }


def run(args: argparse.Namespace) -> int:
    if args.summarize is not None:
        return resummarize(args)
    # lazy: server.runner loads fastapi+uvicorn: +0.19 s CPU at every `sandgym` start (measured)
    from sandgym.server.runner import BackgroundServer

    image = ensure_runner_image()
    work: Path = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    jobs = work / "jobs"
    if jobs.exists():
        shutil.rmtree(jobs)
    jobs.mkdir()
    public = _prepare_tasks(list(args.tasks), work / "tasks-public", True, args.extra_tasks_dir)
    tb2 = _prepare_tb2(args, public, work)
    original = _prepare_tasks(list(args.tasks), work / "tasks-catalog", False, None)
    shutil.copytree(
        REPO / "tests" / "fixtures" / "harbor_provider" / "net-phases", original / "net-phases"
    )
    owner = "bench-harbor-" + uuid.uuid4().hex[:8]
    images = _images_config(args.images, public, owner)
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        backend="docker",
        backend_options={"owner_id": owner},
        include_builtin=False,
        token=TOKEN,
        sweep_interval_s=1.0,
    )
    runs: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    k = args.attempts
    c = args.concurrency
    # shared: both sides run the one image named in each copy's docker_image (Harbor's prebuilt
    # path); per-side: both build each task's Dockerfile themselves (no registry here)
    extra = [] if args.images == "shared" else ["--force-build"]
    task_names = sorted(p.name for p in public.iterdir())
    with BackgroundServer(settings) as server:
        url = server.http_url
        if "cold" not in args.skip:
            for env in (HARBOR_DOCKER, SANDGYM_ENV):
                runs.append(_Job("cold", env, "oracle", 1).run(public, jobs, url, c, extra))
        if "nop" not in args.skip:
            for env in (HARBOR_DOCKER, SANDGYM_ENV):
                runs.append(_Job("nop", env, "nop", 1).run(public, jobs, url, c, extra))
        if "repeated" not in args.skip:
            for env in (HARBOR_DOCKER, SANDGYM_ENV):
                runs.append(_Job("repeated", env, "oracle", k).run(public, jobs, url, c, extra))
        if "sandgym_only" not in args.skip:
            runs.append(
                _Job("sandgym_only", SANDGYM_ENV, "oracle", 1).run(original, jobs, url, c, extra)
            )
        if "kill" not in args.skip:
            for env in (HARBOR_DOCKER, SANDGYM_ENV):
                try:
                    kills.append(
                        _kill_run(
                            env, public, jobs, url, owner, server, task_names, idle_timeout_s=10
                        )
                    )
                except Exception as exc:  # recorded: the runs before it are kept
                    kills.append({"environment": env, "error": f"{type(exc).__name__}: {exc}"})
        pool = server.app.state.service.pool.snapshot()
    after_stop = _engine_objects(owner, task_names)["sandgym_containers"]
    if images["mode"] == "shared":
        from lab.bench.harbor_shared_images import SharedImage, remove_shared

        built = [SharedImage(**x) for x in images["built"]]
        images["left_after_run"] = remove_shared(built)

    doc = {
        "benchmark": "harbor_provider",
        "versions": {
            "runner_image": image,
            **runner_versions(image),
            "engine": (_docker_lines("version", "--format", "{{.Server.Version}}") or ["?"])[0],
            "sandgym_provider": SANDGYM_ENV,
            "sandgym_commit": subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
        },
        "config": {
            "tasks": task_names,
            "attempts": k,
            "concurrency": c,
            "harbor_extra_args": extra,
            "images": images,
            "side_by_side_tasks": "catalog copies with network_mode = public (see docstring)"
            + ("; terminal-bench-2.0: one prepared copy per task (config.tb2)" if tb2 else ""),
            "host_cpus": os.cpu_count(),
            "catalog_tasks": sorted(args.tasks),
            "tb2": tb2,
        },
        "runs": runs,
        "kill": kills,
        "sandgym_containers_after_server_stop": after_stop,
        "pool_at_end": {"hits": pool.hits, "misses": pool.misses},
    }
    doc["summary"], doc["targets"] = summarize(doc)
    return _write(doc, args)


def _write(doc: dict[str, Any], args: argparse.Namespace) -> int:
    text = save_json(doc, args.out)
    if args.json:
        print(text)
    else:
        print(json.dumps({"summary": doc["summary"], "targets": doc["targets"]}, indent=2))
    return 0


def resummarize(args: argparse.Namespace) -> int:
    """`--summarize FILE`: the summary and targets of a stored document computed again by this
    code from its raw runs (nothing re-measured). The runs and the run's own `provenance` are
    kept as they were; `summary_by` records this command's provenance and the file read."""
    from lab.bench.report import provenance

    path: Path = args.summarize
    doc = json.loads(path.read_text(encoding="utf-8"))
    for key in ("runs", "config", "provenance"):
        if key not in doc:
            raise SystemExit(f"{path}: not a harbor_provider document (no {key!r})")
    doc.pop("summary", None)
    doc.pop("targets", None)
    doc["summary"], doc["targets"] = summarize(doc)
    doc["summary_by"] = {**provenance(), "from_file": str(path)}
    text = json.dumps(doc, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    print(
        text
        if args.json
        else json.dumps({"summary": doc["summary"], "targets": doc["targets"]}, indent=2)
    )
    return 0
