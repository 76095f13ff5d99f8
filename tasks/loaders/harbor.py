"""Loader for Harbor task directories (`task.toml` schema 1.x).

Layout: `task.toml`, `instruction.md`, `environment/` (Dockerfile and shipped files),
`tests/test.sh` (+ helpers), `solution/solve.sh`. The verifier writes
`/logs/verifier/reward.txt` or `reward.json`.

Network, as Harbor defines it: `[environment] network_mode` (`public` | `no-network` |
`allowlist` with `allowed_hosts`) is the baseline, else the legacy `allow_internet` (unset means
public); `[agent]` and `[verifier]` may each name their own `network_mode` / `allowed_hosts`
for their phase (see `TaskSpec.network_plan`).

sandgym extension (kept inside `[metadata]`, which Harbor leaves free-form): a procedural task
names its generator with `generator = "environment/generate.py"` (see `GeneratorSpec`).
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandboxes.network import NetworkPolicy
from tasks.errors import TaskLoadError
from tasks.loaders.common import as_float, read_text, size_to_mb, str_dict
from tasks.models import (
    EnvironmentSpec,
    GeneratorSpec,
    SolutionSpec,
    SourceFormat,
    TaskSpec,
    TimeoutsSpec,
    VerifierSpec,
)

log = logging.getLogger(__name__)

_KNOWN_TOP = {
    "version",
    "schema_version",
    "metadata",
    "agent",
    "verifier",
    "environment",
    "solution",
    "source",
    "task",  # schema 1.1: name, description, authors, keywords
}


def is_harbor_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def _table(data: dict[str, Any], key: str, path: Path) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise TaskLoadError(f"{path}: [{key}] must be a table, found {value!r}")
    return value


_MODES = ("public", "no-network", "allowlist")


def _phase_network(table: dict[str, Any], section: str, where: Path) -> NetworkPolicy | None:
    """A table's explicit `network_mode` / `allowed_hosts` (Harbor: hosts alone mean
    `allowlist`; hosts with another mode are an error), or None when it names neither."""
    mode = table.get("network_mode")
    hosts = table.get("allowed_hosts", [])
    if not isinstance(hosts, list):
        raise TaskLoadError(
            f"{where}: [{section}] allowed_hosts must be a list of host names, found {hosts!r}"
        )
    if mode is None and not hosts:
        return None
    mode = "allowlist" if mode is None else mode
    if mode not in _MODES:
        raise TaskLoadError(
            f"{where}: [{section}] network_mode must be one of {', '.join(_MODES)}, found {mode!r}"
        )
    if hosts and mode != "allowlist":
        raise TaskLoadError(
            f"{where}: [{section}] allowed_hosts is only valid with network_mode = 'allowlist', "
            f"found network_mode = {mode!r}"
        )
    try:
        return NetworkPolicy(mode=mode, allowed_hosts=hosts)
    except ValidationError as exc:
        raise TaskLoadError(
            f"{where}: [{section}] allowed_hosts: {exc.errors()[0]['msg']}"
        ) from None


def _baseline_network(env: dict[str, Any], where: Path) -> NetworkPolicy:
    """Harbor's environment baseline: `network_mode` (+ `allowed_hosts`) when given, else the
    legacy `allow_internet` (unset means true: public)."""
    explicit = _phase_network(env, "environment", where)
    if explicit is not None:
        return explicit
    allow = env.get("allow_internet", env.get("network", True))
    if not isinstance(allow, bool):
        raise TaskLoadError(
            f"{where}: [environment] allow_internet must be true or false, found {allow!r}"
        )
    return NetworkPolicy.from_bool(allow)


def load_harbor_dir(path: Path, source_format: SourceFormat = "harbor") -> TaskSpec:
    toml_path = path / "task.toml"
    try:
        data = tomllib.loads(read_text(toml_path, "task.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(f"{toml_path}: invalid TOML: {exc}") from None
    version = str(data.get("schema_version", data.get("version", "1.0")))
    if not version.startswith("1"):
        raise TaskLoadError(f"{toml_path}: expected schema version 1.x, found {version!r}")
    unknown = set(data) - _KNOWN_TOP
    if unknown:
        log.debug("%s: ignoring unknown top-level keys %s", toml_path, sorted(unknown))

    metadata = dict(_table(data, "metadata", toml_path))
    agent = _table(data, "agent", toml_path)
    verifier = _table(data, "verifier", toml_path)
    env = _table(data, "environment", toml_path)
    solution = _table(data, "solution", toml_path)

    if data.get("steps") or ((path / "steps").is_dir() and not (path / "instruction.md").exists()):
        # Harbor multi-step tasks: each steps/<name>/ carries its own instruction, tests and
        # solution, scored per `multi_step_reward_strategy`. One TaskSpec holds one of each.
        raise TaskLoadError(
            f"{path}: a multi-step Harbor task ([[steps]] in task.toml, steps/<name>/ folders) "
            "is not supported: expected one instruction.md, tests/test.sh and solution at the "
            "top level"
        )
    task_table = _table(data, "task", toml_path)
    instruction = read_text(path / "instruction.md", "instruction.md")
    if not instruction.strip():
        raise TaskLoadError(f"{path / 'instruction.md'}: the instruction is empty")

    memory_mb: int | None = 2048
    if "memory_mb" in env:
        memory_mb = int(as_float(env["memory_mb"], "environment.memory_mb"))
    elif "memory" in env:  # deprecated string form
        memory_mb = size_to_mb(env["memory"], "environment.memory")
    storage_mb: int | None = None
    if "storage_mb" in env:
        storage_mb = int(as_float(env["storage_mb"], "environment.storage_mb"))
    elif "storage" in env:
        storage_mb = size_to_mb(env["storage"], "environment.storage")

    env_dir = path / "environment"
    dockerfile = env_dir / "Dockerfile"
    image = env.get("docker_image") or None
    if image is None and not dockerfile.is_file():
        raise TaskLoadError(
            f"{path}: expected environment/Dockerfile or [environment] docker_image, found neither"
        )
    environment = EnvironmentSpec(
        image=str(image) if image else None,
        build_context=env_dir if dockerfile.is_file() else None,
        cpus=as_float(env.get("cpus", 1), "environment.cpus"),
        memory_mb=memory_mb,
        storage_mb=storage_mb,
        network=_baseline_network(env, toml_path),
        env=str_dict(env.get("env"), "environment.env"),
        workdir=env.get("workdir"),
    )
    timeouts = TimeoutsSpec(
        agent_timeout_s=as_float(agent.get("timeout_sec", 600.0), "agent.timeout_sec"),
        verifier_timeout_s=as_float(verifier.get("timeout_sec", 120.0), "verifier.timeout_sec"),
        build_timeout_s=as_float(
            env.get("build_timeout_sec", 600.0), "environment.build_timeout_sec"
        ),
    )

    tests_dir = path / "tests"
    test_sh = tests_dir / "test.sh"
    if not test_sh.is_file():
        raise TaskLoadError(f"{path}: expected tests/test.sh (the verifier), found no such file")
    verifier_spec = VerifierSpec(
        kind="harbor",
        tests_dir=tests_dir,
        script="test.sh",
        script_path=test_sh,
        env=str_dict(verifier.get("env"), "verifier.env"),
    )

    solve = path / "solution" / "solve.sh"
    solution_spec = None
    if solve.is_file():
        solution_spec = SolutionSpec(
            script=solve,
            upload_dir=path / "solution",
            env=str_dict(solution.get("env"), "solution.env"),
        )

    generator = None
    gen = metadata.get("generator")
    if gen is not None:
        gen_path = (path / str(gen)).resolve()
        if path.resolve() not in gen_path.parents or not gen_path.is_file():
            raise TaskLoadError(
                f"{toml_path}: metadata.generator must name a file inside the task, found {gen!r}"
            )
        generator = GeneratorSpec(script=gen_path)

    return TaskSpec(
        id=path.name,
        instruction=instruction,
        environment=environment,
        timeouts=timeouts,
        verifier=verifier_spec,
        solution=solution_spec,
        agent_network=_phase_network(agent, "agent", toml_path),
        verifier_network=_phase_network(verifier, "verifier", toml_path),
        agent_user=agent.get("user") or None,
        verifier_user=str(verifier.get("user") or "root"),
        generator=generator,
        source_format=source_format,
        source_dir=path,
        metadata={
            "schema_version": version,
            **({"harbor_name": str(task_table["name"])} if task_table.get("name") else {}),
            **metadata,
        },
    )
