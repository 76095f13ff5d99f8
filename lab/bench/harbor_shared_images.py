"""One image per task for both sides of `sandgym bench harbor_provider`: each task's
`environment/` is built once, before any Harbor job, tagged, and named in the task copy's
`[environment] docker_image`, so sandgym's provider and Harbor's own `docker` environment run
the very same image (build-time content such as random bytes or fetched versions alike).

Harbor 0.26.0's rule (`harbor.environments.definition.should_use_prebuilt_docker_image`): a task
with `docker_image` set runs that image unless `--force-build` is given and `environment/`
holds a Dockerfile. Its docker environment then uses `docker-compose-prebuilt.yaml`
(`image: ${PREBUILT_IMAGE_NAME}`, the engine's local image, no pull while it is present) and
`stop(delete=True)` runs `docker compose down --rmi local`, which leaves a custom-tagged image in
place. sandgym's provider follows the same rule (sandgym/integrations/harbor/environment.py) and sends
the image name instead of the build context; the server runs that local image as it is. The
Dockerfile stays in each copy (the environment definition is unchanged; neither side uploads
`environment/` after start, Harbor's `should_upload_environment_dir`). So the benchmark runs
without `--force-build`, and the build time is recorded here, once per task, out of both sides'
environment-start figures.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import tomllib
from pathlib import Path

from pydantic import BaseModel, Field

#: repository of the shared images; tag: the run's id (one run never meets another's image)
SHARED_REPO = "sandgym-bench-shared"
#: label on every shared image (a run removes its own at the end)
SHARED_LABEL = "sandgym.bench=harbor_provider-shared"
_HEADER_RE = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
_DOCKER_IMAGE_RE = re.compile(r"^\s*docker_image\s*=")


class SharedImageError(RuntimeError):
    """A task's shared image could not be built, or its task.toml could not name it."""


class SharedImage(BaseModel):
    """One task's image, built once and run by both environments."""

    task: str
    image: str = Field(description="the tag both sides run ([environment] docker_image)")
    image_id: str = Field(description="the engine's id of that image")
    build_s: float = Field(description="wall time of its one build (in neither side's figures)")
    previous_docker_image: str | None = Field(
        None, description="the docker_image the task named before (replaced)"
    )


def image_name(task: str, run_id: str) -> str:
    """The shared image's tag for `task` in run `run_id` (a valid lower-case reference)."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", task.lower()).strip("._-") or "task"
    tag = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_id)[:128]
    return f"{SHARED_REPO}/{clean}:{tag}"


def set_docker_image(toml_text: str, image: str) -> str:
    """`toml_text` (a Harbor task.toml) with `[environment] docker_image = image`: the key
    replaced where the table has it, else added at the table's top, else the table added."""
    lines = toml_text.splitlines()
    value = f'docker_image = "{image}"'
    table: str | None = None
    header_at: int | None = None
    replaced = False
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line)
        if m:
            table = m.group(1).strip()
            if table == "environment":
                header_at = i
            continue
        if table == "environment" and _DOCKER_IMAGE_RE.match(line):
            lines[i] = value
            replaced = True
    if not replaced:
        if header_at is not None:
            lines.insert(header_at + 1, value)
        else:
            lines += ["", "[environment]", value]
    out = "\n".join(lines) + "\n"
    try:
        found = tomllib.loads(out).get("environment", {}).get("docker_image")
    except tomllib.TOMLDecodeError as exc:
        raise SharedImageError(f"task.toml no longer parses after naming {image}: {exc}") from None
    if found != image:
        raise SharedImageError(
            f"expected [environment] docker_image = {image!r} in the rewritten task.toml, "
            f"found {found!r}"
        )
    return out


def build_argv(task_dir: Path, image: str) -> list[str]:
    """The one `docker build` of `task_dir/environment` (the engine's classic builder, as both
    sides' builds were before: no buildx here)."""
    env_dir = task_dir / "environment"
    return [
        "docker",
        "build",
        "-q",
        "--label",
        SHARED_LABEL,
        "-t",
        image,
        "-f",
        str(env_dir / "Dockerfile"),
        str(env_dir),
    ]


def engine_image_id(image: str) -> str | None:
    """The engine's id of `image` (`docker image inspect`), None when the engine lacks it."""
    proc = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _image_id(image: str) -> str:
    found = engine_image_id(image)
    if found is None:
        raise SharedImageError(f"expected image {image} on the engine after its build, found none")
    return found


def build_shared(task_dir: Path, run_id: str, timeout_s: float = 1800.0) -> SharedImage:
    """Build `task_dir`'s environment once, tag it, and name it in the copy's task.toml."""
    if not (task_dir / "environment" / "Dockerfile").is_file():
        raise SharedImageError(
            f"expected {task_dir}/environment/Dockerfile (a shared image is built from it), "
            "found none"
        )
    image = image_name(task_dir.name, run_id)
    t0 = time.perf_counter()
    proc = subprocess.run(
        build_argv(task_dir, image),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
        check=False,
    )
    build_s = round(time.perf_counter() - t0, 2)
    if proc.returncode != 0:
        raise SharedImageError(
            f"building {image} from {task_dir}/environment failed (exit {proc.returncode}): "
            f"{(proc.stdout + proc.stderr)[-2000:]}"
        )
    toml = task_dir / "task.toml"
    text = toml.read_text(encoding="utf-8")
    previous = tomllib.loads(text).get("environment", {}).get("docker_image")
    toml.write_text(set_docker_image(text, image), encoding="utf-8")
    return SharedImage(
        task=task_dir.name,
        image=image,
        image_id=_image_id(image),
        build_s=build_s,
        previous_docker_image=previous,
    )


def remove_shared(images: list[SharedImage]) -> list[str]:
    """Remove this run's shared images (not forced: one still in use stays); the ones left."""
    left = []
    for s in images:
        proc = subprocess.run(["docker", "rmi", s.image], capture_output=True, check=False)
        if proc.returncode != 0:
            left.append(s.image)
    return left
