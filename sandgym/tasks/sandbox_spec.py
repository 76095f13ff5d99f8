"""What sandbox a task's episodes need: `sandbox_spec_for` turns a `TaskSpec` into a
`SandboxSpec` (image or rewritten build context with its base images mapped, workdir, env,
resources, network per phase); `parse_image_map` reads `--image-map FROM=TO`, and
`resolve_env_templates` resolves Harbor's `${VAR}` templates from the host."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.network import NetworkPolicy, clamp
from sandgym.tasks.dockerfile import needs_rewrite, rewritten_context, spec_dockerfile
from sandgym.tasks.errors import TaskUnsupportedError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.paths import AGENT_LOGS, DEFAULT_WORKDIR, VERIFIER_LOGS


def parse_image_map(items: list[str] | None) -> dict[str, str]:
    """`["FROM=TO", ...]` -> dict; raises ValueError on an item without '='."""
    out: dict[str, str] = {}
    for item in items or []:
        src, eq, dst = item.partition("=")
        if not eq or not src or not dst:
            raise ValueError(f"expected --image-map FROM=TO, found {item!r}")
        out[src.strip()] = dst.strip()
    return out


_ENV_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve_env_templates(
    env: Mapping[str, str], where: str, host_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Resolve Harbor's `${VAR}` / `${VAR:-default}` templates in a task's env table from the
    host environment (Harbor does this at trial time, e.g. `OPENROUTER_API_KEY =
    "${OPENROUTER_API_KEY}"`), so the sandbox never sees the literal template. A variable that
    is unset on the host and has no default makes the task unrunnable here: a named error."""
    host = os.environ if host_env is None else host_env
    out: dict[str, str] = {}
    for key, value in env.items():

        def sub(m: re.Match[str], key: str = key) -> str:
            name, default = m.group(1), m.group(2)
            if name in host:
                return host[name]
            if default is not None:
                return default
            raise TaskUnsupportedError(
                f"{where}.{key} is the template {m.group(0)!r}: expected host variable {name} "
                "to be set (or a ${VAR:-default}), found it unset"
            )

        out[key] = _ENV_TEMPLATE.sub(sub, value)
    return out


def sandbox_spec_for(
    task: TaskSpec,
    image_map: Mapping[str, str] | None = None,
    *,
    allow_run: bool = False,
    network_ceiling: NetworkPolicy | None = None,
) -> SandboxSpec:
    """The `SandboxSpec` a task's episodes need. `image_map` (FROM -> TO) replaces base images
    that cannot be pulled here with local ones, in `docker_image` and in the Dockerfile's FROM.
    `allow_run` opts in to executing Dockerfile RUN lines on backends that build no image.
    The sandbox starts with the environment's network and can switch to the agent's and the
    verifier's (`TaskSpec.network_plan`), each made no more open than `network_ceiling`."""
    image_map = dict(image_map or {})
    env = task.environment
    df = spec_dockerfile(task)
    build_context = env.build_context
    image = None
    if env.build_context is None:
        image = image_map.get(env.image or "", env.image)
    else:
        text = (env.build_context / env.dockerfile).read_text(encoding="utf-8")
        if needs_rewrite(text, image_map, env.build_context) or env.bind_mounts:
            build_context = rewritten_context(task, image_map)
    workdir = env.workdir or (df.workdir if df else None) or DEFAULT_WORKDIR
    task_env = resolve_env_templates(env.env, f"task {task.id}: environment.env")
    # The Dockerfile's ENV as parsed fills in only where no image is built (`env`); a backend
    # that runs a built or named image takes the image's own environment and working directory
    # and lays the task's own env over it (`own_env`, `own_workdir`: SandboxSpec).
    spec_env = {**(df.env if df else {}), **task_env}
    policies = [clamp(p, network_ceiling) for p in task.network_policies()]
    later = tuple(dict.fromkeys(p for p in policies[1:] if p != policies[0]))
    return SandboxSpec(
        image=image,
        build_context=build_context,
        dockerfile=env.dockerfile,
        workdir=workdir,
        env=spec_env,
        own_env=task_env,
        own_workdir=env.workdir is not None,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network=policies[0],
        network_later=later,
        user=task.agent_user,
        make_dirs=(VERIFIER_LOGS, AGENT_LOGS),
        labels={"sandgym.task": task.id[:63]},
        allow_run=allow_run,
        services=env.services,
        service_name=env.service_name,
        healthcheck=env.healthcheck,
        tmpfs=env.tmpfs,
        dns=env.dns,
        extra_hosts=env.extra_hosts,
        main_entrypoint=env.main_entrypoint,
        main_command=env.main_command,
        subnet=env.subnet,
        ipv4_address=env.ipv4_address,
    )
