"""Loader for Terminal-Bench v1 task directories, and SETA tasks (the same layout + weights).

Terminal-Bench v1: `task.yaml` (`instruction`, or the legacy `descriptions` list whose entry
with key `base` holds it; `max_agent_timeout_sec`, `max_test_timeout_sec`, `parser_name`,
`run_tests_in_same_shell`), `Dockerfile` and `docker-compose.yaml` (the main service is the one
whose `container_name` is the harness's `${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}`, which
Terminal-Bench's harness attaches to; `client` when none names it),
`run-tests.sh` (uses `$TEST_DIR`, which is `/tests`), `tests/`, and `solution.sh` or
`solution.yaml` (a keystroke list). Scored all-or-nothing on the pytest summary.

SETA: the same files plus `weights.json` (test name -> weight, at the top or in `tests/`);
the reward is the weighted share of passed tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from sandgym.sandboxes.network import NetworkPolicy
from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders.common import as_float, read_text, read_yaml
from sandgym.tasks.loaders.compose import ComposeEnvironment, find_compose, load_compose
from sandgym.tasks.models import (
    EnvironmentSpec,
    Keystroke,
    SolutionSpec,
    TaskSpec,
    TimeoutsSpec,
    VerifierSpec,
)


def is_tbench_dir(path: Path) -> bool:
    return (path / "task.yaml").is_file() or (path / "task.yml").is_file()


def _weights_path(path: Path) -> Path | None:
    for p in (path / "weights.json", path / "tests" / "weights.json"):
        if p.is_file():
            return p
    return None


def is_seta_dir(path: Path) -> bool:
    return is_tbench_dir(path) and _weights_path(path) is not None


def _instruction(data: dict[str, Any], where: Path) -> str:
    text = data.get("instruction")
    if isinstance(text, str) and text.strip():
        return text
    descriptions = data.get("descriptions")
    if isinstance(descriptions, list):
        for d in descriptions:
            if isinstance(d, dict) and d.get("key") == "base" and d.get("description"):
                return str(d["description"])
    raise TaskLoadError(
        f"{where}: expected 'instruction' or a 'descriptions' entry with key 'base', found neither"
    )


#: the container Terminal-Bench's harness attaches to (`DockerComposeManager` gets the client
#: container by this name), so the service that carries it is the one the agent works in
CLIENT_CONTAINER_VAR = "T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME"
_CLIENT_CONTAINER = re.compile(r"^\$\{?" + CLIENT_CONTAINER_VAR + r"\}?$")


def main_service(compose_path: Path) -> str:
    """The compose service Terminal-Bench's harness runs the agent in: the one whose
    `container_name` is `${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}`, else `client`."""
    services = read_yaml(compose_path).get("services")
    if isinstance(services, dict):
        named = [
            str(name)
            for name, svc in services.items()
            if isinstance(svc, dict)
            and _CLIENT_CONTAINER.match(str(svc.get("container_name", "")).strip())
        ]
        if len(named) > 1:
            raise TaskLoadError(
                f"{compose_path}: expected one service with container_name "
                f"${{{CLIENT_CONTAINER_VAR}}}, found {named}"
            )
        if named:
            return named[0]
    return "client"


def _compose(path: Path) -> ComposeEnvironment | None:
    """The task's compose file (main service: `main_service`), or None when it has none."""
    p = find_compose(path)
    if p is None:
        return None
    return load_compose(p, main=main_service(p), task_dir=path, harness_prefix="T_BENCH_")


def _keystrokes(path: Path) -> list[Keystroke]:
    try:
        items = yaml.safe_load(read_text(path, "solution.yaml"))
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(items, list) or not items:
        raise TaskLoadError(f"{path}: expected a non-empty list of keystroke steps")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "command" not in item:
            raise TaskLoadError(
                f"{path}: step {i}: expected a mapping with 'command', got {item!r}"
            )
        out.append(
            Keystroke(
                keys=str(item["command"]),
                append_enter=bool(item.get("append_enter", False)),
                block=bool(item.get("block", False)),
                min_timeout_s=as_float(item.get("min_timeout_sec", 0.0), f"step {i}"),
                max_timeout_s=as_float(item.get("max_timeout_sec", 180.0), f"step {i}"),
            )
        )
    return out


def load_tbench_dir(path: Path) -> TaskSpec:
    yaml_path = path / "task.yaml" if (path / "task.yaml").is_file() else path / "task.yml"
    data = read_yaml(yaml_path)
    instruction = _instruction(data, yaml_path)
    parser_name = str(data.get("parser_name", "pytest"))
    if parser_name != "pytest":
        raise TaskLoadError(f"{yaml_path}: expected parser_name 'pytest', found {parser_name!r}")

    compose = _compose(path)  # the client's build, image, environment; the other services
    context, dockerfile = path, "Dockerfile"
    if compose is not None and compose.build_context is not None:
        context, dockerfile = compose.build_context, compose.dockerfile or "Dockerfile"
    has_dockerfile = (context / dockerfile).is_file()
    image = compose.image if compose is not None else None
    if not has_dockerfile and not image:
        raise TaskLoadError(f"{path}: expected a Dockerfile or a compose image, found neither")
    # (harness-substituted variables, ${T_BENCH_...}, are set by us, not the task)
    env = dict(compose.env) if compose is not None else {}
    environment = EnvironmentSpec(
        image=image if not has_dockerfile else None,
        build_context=context if has_dockerfile else None,
        dockerfile=dockerfile,
        env=env,
        # Terminal-Bench's harness runs the client service on compose's default network, and
        # its run-tests.sh scripts install their test tools (curl | sh uv, pip) from it.
        network=NetworkPolicy(mode="public"),
        services=compose.services if compose is not None else (),
        service_name=compose.main if compose is not None else "client",
        bind_mounts=compose.bind_mounts if compose is not None else (),
        tmpfs=compose.tmpfs if compose is not None else (),
        dns=compose.dns if compose is not None else (),
        extra_hosts=compose.extra_hosts if compose is not None else (),
        main_entrypoint=compose.main_entrypoint if compose is not None else None,
        main_command=compose.main_command if compose is not None else None,
        subnet=compose.subnet if compose is not None else None,
        ipv4_address=compose.ipv4_address if compose is not None else None,
    )
    timeouts = TimeoutsSpec(
        agent_timeout_s=as_float(data.get("max_agent_timeout_sec", 360.0), "max_agent_timeout_sec"),
        verifier_timeout_s=as_float(data.get("max_test_timeout_sec", 60.0), "max_test_timeout_sec"),
    )

    run_tests = path / "run-tests.sh"
    if not run_tests.is_file():
        raise TaskLoadError(f"{path}: expected run-tests.sh, found no such file")
    tests_dir = path / "tests" if (path / "tests").is_dir() else None

    weights_file = _weights_path(path)
    weights = None
    if weights_file is not None:
        try:
            raw = json.loads(read_text(weights_file, "weights.json"))
        except json.JSONDecodeError as exc:
            raise TaskLoadError(f"{weights_file}: invalid JSON: {exc}") from None
        if not isinstance(raw, dict) or not raw:
            raise TaskLoadError(f"{weights_file}: expected a non-empty object test -> weight")
        weights = {str(k): as_float(v, f"weights[{k}]") for k, v in raw.items()}
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise TaskLoadError(f"{weights_file}: weights must be >= 0 with a positive sum")

    verifier = VerifierSpec(
        kind="seta" if weights is not None else "tbench",
        tests_dir=tests_dir,
        script="run-tests.sh",
        script_path=run_tests,
        env={"TEST_DIR": "/tests"},
        weights=weights,
    )

    solution = None
    if (path / "solution.sh").is_file():
        solution = SolutionSpec(script=path / "solution.sh")
    elif (path / "solution.yaml").is_file():
        solution = SolutionSpec(keystrokes=_keystrokes(path / "solution.yaml"))

    metadata = {k: v for k, v in data.items() if k not in ("instruction", "descriptions")}
    return TaskSpec(
        id=path.name,
        instruction=instruction,
        environment=environment,
        timeouts=timeouts,
        verifier=verifier,
        solution=solution,
        source_format="seta" if weights is not None else "tbench",
        source_dir=path,
        metadata=metadata,
    )
