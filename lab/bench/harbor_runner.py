"""Harbor's own released runner (`harbor run`, harbor 0.26.0) in a container, for the end-to-end
test of the Harbor provider and for `sandgym bench harbor_provider`.

Harbor needs Python >= 3.12 and this host has 3.11, so `harbor` runs in `RUNNER_IMAGE`, built
once (cached by the engine) from `images/harbor-runner/Dockerfile` on the python:3.13 stand-in,
with the engine's socket mounted (Harbor's own `docker` environment drives the same engine) and
the host's network (to reach a `sandgym serve` on loopback). The sandgym repository is mounted
read-only on PYTHONPATH, so `--env sandgym.integrations.harbor:SandgymEnvironment` imports this
checkout's provider. Task and job folders are mounted at their host paths, so a path means the
same thing inside and out.

`read_trials(job_dir)` reads the per-trial `result.json` files Harbor wrote into typed records.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

REPO = Path(__file__).resolve().parents[2]
RUNNER_IMAGE = "sandgym/harbor-runner:0.26.0"
RUNNER_CONTEXT = REPO / "images" / "harbor-runner"
SANDGYM_ENV = "sandgym.integrations.harbor:SandgymEnvironment"


class HarborRunnerError(RuntimeError):
    """The runner image could not be built, or `harbor run` could not be started."""


def runner_image_present(image: str = RUNNER_IMAGE) -> bool:
    proc = subprocess.run(
        ["docker", "image", "inspect", image], capture_output=True, text=True, check=False
    )
    return proc.returncode == 0


def ensure_runner_image(
    image: str = RUNNER_IMAGE, timeout_s: float = 1200.0, context: Path = RUNNER_CONTEXT
) -> str:
    """`image`, built from `context` (images/harbor-runner; images/nemo-gym-runner for the
    NeMo-Gym check) when the engine lacks it (pip installs the released package from the
    package index: a few minutes, once)."""
    if runner_image_present(image):
        return image
    proc = subprocess.run(
        ["docker", "build", "-t", image, str(context)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        check=False,
    )
    if proc.returncode != 0:
        raise HarborRunnerError(
            f"building {image} from {context} failed (exit {proc.returncode}): "
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return image


def runner_versions(image: str = RUNNER_IMAGE) -> dict[str, str]:
    """Versions inside the runner: harbor, docker CLI, compose, Python."""
    script = (
        "python -c 'import importlib.metadata as m, sys; "
        'print(m.version("harbor")); print(sys.version.split()[0])\'; '
        "docker --version; docker compose version --short"
    )
    proc = subprocess.run(
        ["docker", "run", "--rm", image, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = proc.stdout.strip().splitlines() + ["?"] * 4
    return {"harbor": lines[0], "python": lines[1], "docker_cli": lines[2], "compose": lines[3]}


def harbor_argv(
    *,
    tasks_path: Path,
    jobs_dir: Path,
    job_name: str,
    env: str,
    agent: str = "oracle",
    attempts: int = 1,
    concurrency: int = 1,
    extra: list[str] | None = None,
    server_url: str | None = None,
    token: str | None = None,
    image: str = RUNNER_IMAGE,
    container_name: str | None = None,
) -> list[str]:
    """The `docker run ... harbor run ...` command line of one Harbor job. `env` is Harbor's
    `--env`: `docker` (Harbor's own) or `SANDGYM_ENV`."""
    mounts = {str(REPO): "ro", str(tasks_path): "ro", str(jobs_dir): "rw"}
    argv = ["docker", "run", "--rm", "--network", "host"]
    if container_name:
        argv += ["--name", container_name]
    argv += ["-v", "/var/run/docker.sock:/var/run/docker.sock"]
    for path, mode in mounts.items():
        argv += ["-v", f"{path}:{path}:{mode}"]
    argv += ["-e", f"PYTHONPATH={REPO}", "-e", "DOCKER_BUILDKIT=0", "-w", str(jobs_dir)]
    # litellm (a Harbor dependency) otherwise tries to fetch its price list from GitHub at
    # start, unreachable here: three attempts, ten seconds, per job
    argv += ["-e", "LITELLM_LOCAL_MODEL_COST_MAP=True"]
    if server_url:
        argv += ["-e", f"SANDGYM_URL={server_url}"]
    if token:
        argv += ["-e", f"SANDGYM_TOKEN={token}"]
    argv += [image, "harbor", "run", "-p", str(tasks_path), "--agent", agent, "--env", env]
    argv += ["--jobs-dir", str(jobs_dir), "--job-name", job_name, "--yes"]
    argv += ["--n-attempts", str(attempts), "--n-concurrent", str(concurrency)]
    return argv + list(extra or [])


class TrialRecord(BaseModel):
    """One Harbor trial as its result.json tells it."""

    task: str
    trial: str
    reward: float | None = Field(description="the verifier's `reward` (None: none written)")
    exception: str | None = Field(None, description="exception type, when the trial failed")
    exception_message: str | None = None
    trial_s: float | None = Field(None, description="started_at to finished_at")
    environment_start_s: float | None = Field(
        None, description="Harbor's environment_setup phase (start of the environment)"
    )
    agent_s: float | None = None
    verifier_s: float | None = None


def _span(timing: dict[str, Any] | None) -> float | None:
    if not timing or not timing.get("started_at") or not timing.get("finished_at"):
        return None
    a = datetime.fromisoformat(timing["started_at"])
    b = datetime.fromisoformat(timing["finished_at"])
    return round((b - a).total_seconds(), 3)


def read_trials(job_dir: Path) -> list[TrialRecord]:
    """Every trial of a Harbor job folder (`<job>/<trial>/result.json`), sorted by name."""
    out = []
    for path in sorted(job_dir.glob("*/result.json")):
        data = json.loads(path.read_text())
        rewards = (data.get("verifier_result") or {}).get("rewards") or {}
        exc = data.get("exception_info") or {}
        out.append(
            TrialRecord(
                task=data["task_name"],
                trial=data["trial_name"],
                reward=rewards.get("reward"),
                exception=exc.get("exception_type"),
                exception_message=(exc.get("exception_message") or "")[:500] or None,
                trial_s=_span(data),
                environment_start_s=_span(data.get("environment_setup")),
                agent_s=_span(data.get("agent_execution")),
                verifier_s=_span(data.get("verifier")),
            )
        )
    return out
