"""Loader for Harbor task directories (`task.toml` schema 1.x).

Layout: `task.toml`, `instruction.md`, `environment/` (Dockerfile and shipped files),
`tests/test.sh` (+ helpers), `solution/solve.sh`. The verifier writes
`/logs/verifier/reward.txt` or `reward.json`.

Network, as Harbor defines it: `[environment] network_mode` (`public` | `no-network` |
`allowlist` with `allowed_hosts`) is the baseline, else the legacy `allow_internet` (unset means
public); `[agent]` and `[verifier]` may each name their own `network_mode` / `allowed_hosts`
for their phase (see `TaskSpec.network_plan`).

sandgym extension (kept inside `[metadata]`, which Harbor leaves free-form): a procedural task
names its generator with `generator = "environment/generate.py"` (see `GeneratorSpec`), and
may give it `generator_timeout_sec` (default 60).
"""

from __future__ import annotations

import logging
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandgym.sandboxes.network import NetworkPolicy
from sandgym.tasks.errors import TaskLoadError
from sandgym.tasks.loaders.common import as_float, read_text, size_to_mb, str_dict
from sandgym.tasks.loaders.compose import harbor_environment, harbor_healthcheck
from sandgym.tasks.models import (
    EnvironmentSpec,
    GeneratorSpec,
    SolutionSpec,
    SourceFormat,
    StepSpec,
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
    "steps",
    "multi_step_reward_strategy",
    "artifacts",
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


_STEP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_STEP_KEYS = {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts"}


def _min_reward(value: Any, where: str) -> dict[str, float] | None:
    """Harbor's gate: a float gates on 'reward'; a table on each of its keys."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): as_float(v, f"{where}.{k}") for k, v in value.items()}
    return {"reward": as_float(value, where)}


def _load_step(
    path: Path,
    toml_path: Path,
    index: int,
    raw: Any,
    task_verifier_env: dict[str, str],
    task_solution: SolutionSpec | None,
    environment: EnvironmentSpec,
) -> StepSpec:
    where = f"{toml_path}: [[steps]] #{index + 1}"
    if not isinstance(raw, dict):
        raise TaskLoadError(f"{where}: expected a table, found {raw!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not _STEP_NAME.match(name) or ".." in name:
        raise TaskLoadError(
            f"{where}: name must be a directory name (letters, digits, '.', '_', '-'), "
            f"found {name!r}"
        )
    unknown = set(raw) - _STEP_KEYS
    if unknown:
        log.debug("%s: ignoring unknown step keys %s", where, sorted(unknown))
    step_dir = path / "steps" / name
    if not step_dir.is_dir():
        raise TaskLoadError(f"{where}: expected the folder steps/{name}/, found none")
    instruction = read_text(step_dir / "instruction.md", f"steps/{name}/instruction.md")
    if not instruction.strip():
        raise TaskLoadError(f"{step_dir / 'instruction.md'}: the instruction is empty")
    agent = raw.get("agent") or {}
    verifier = raw.get("verifier") or {}
    if not isinstance(agent, dict) or not isinstance(verifier, dict):
        raise TaskLoadError(f"{where}: [steps.agent] and [steps.verifier] must be tables")
    overlay = step_dir / "tests"
    shared = path / "tests"
    script = overlay / "test.sh" if (overlay / "test.sh").is_file() else shared / "test.sh"
    if not script.is_file():
        raise TaskLoadError(
            f"{where}: expected steps/{name}/tests/test.sh or tests/test.sh, found neither"
        )
    step_verifier = VerifierSpec(
        kind="harbor",
        tests_dir=shared if shared.is_dir() else None,
        script="test.sh",
        script_path=script,
        env={**task_verifier_env, **str_dict(verifier.get("env"), f"steps.{name}.verifier.env")},
    )
    solve = step_dir / "solution" / "solve.sh"
    solution = task_solution
    if solve.is_file():
        solution = SolutionSpec(
            script=solve,
            upload_dir=step_dir / "solution",
            env=task_solution.env if task_solution else {},
        )
    workdir = step_dir / "workdir"
    step_verifier_env, step_shared = _verifier_environment(
        verifier, overlay, environment, f"steps.{name}.verifier", toml_path
    )
    return StepSpec(
        name=name,
        instruction=instruction,
        workdir_dir=workdir if workdir.is_dir() else None,
        has_setup=(workdir / "setup.sh").is_file(),
        verifier=step_verifier,
        tests_overlay=overlay if overlay.is_dir() else None,
        solution=solution,
        min_reward=_min_reward(raw.get("min_reward"), f"steps.{name}.min_reward"),
        agent_timeout_s=(
            as_float(agent["timeout_sec"], f"steps.{name}.agent.timeout_sec")
            if "timeout_sec" in agent
            else None
        ),
        verifier_timeout_s=(
            as_float(verifier["timeout_sec"], f"steps.{name}.verifier.timeout_sec")
            if "timeout_sec" in verifier
            else None
        ),
        agent_network=_phase_network(agent, f"steps.{name}.agent", toml_path),
        verifier_network=_phase_network(verifier, f"steps.{name}.verifier", toml_path),
        agent_user=str(agent["user"]) if agent.get("user") else None,
        verifier_environment=step_verifier_env,
        verifier_shared=step_shared,
        healthcheck=(
            harbor_healthcheck(raw["healthcheck"], f"{where} healthcheck")
            if raw.get("healthcheck") is not None
            else None
        ),
    )


def _verifier_environment(
    table: dict[str, Any], tests_dir: Path, base: EnvironmentSpec, where: str, toml_path: Path
) -> tuple[EnvironmentSpec | None, bool]:
    """Harbor's `[verifier] environment_mode` / `[verifier.environment]`: (the separate
    verifier's environment or None, whether the table said `shared` explicitly). A verifier
    environment implies `separate`; its image is the table's `docker_image`, else one built from
    the tests' own Dockerfile, else the task's environment again."""
    mode = table.get("environment_mode")
    env_table = table.get("environment")
    if mode not in (None, "shared", "separate"):
        raise TaskLoadError(
            f"{toml_path}: [{where}] environment_mode must be 'shared' or 'separate', "
            f"found {mode!r}"
        )
    if env_table is not None and not isinstance(env_table, dict):
        raise TaskLoadError(f"{toml_path}: [{where}.environment] must be a table")
    if mode == "shared" and env_table is not None:
        raise TaskLoadError(
            f"{toml_path}: [{where}] environment_mode = 'shared' conflicts with a "
            f"[{where}.environment] table"
        )
    if mode is None:
        mode = "separate" if env_table is not None else None
    if mode != "separate":
        return None, mode == "shared"
    env_table = env_table or {}
    update: dict[str, Any] = {"services": (), "healthcheck": None}
    if env_table.get("docker_image"):
        update.update(image=str(env_table["docker_image"]), build_context=None)
    elif (tests_dir / "Dockerfile").is_file():
        update.update(image=None, build_context=tests_dir, dockerfile="Dockerfile")
    if "cpus" in env_table:
        update["cpus"] = as_float(env_table["cpus"], f"{where}.environment.cpus")
    if "memory_mb" in env_table:
        update["memory_mb"] = int(
            as_float(env_table["memory_mb"], f"{where}.environment.memory_mb")
        )
    if env_table.get("env") is not None:
        update["env"] = str_dict(env_table.get("env"), f"{where}.environment.env")
    if any(k in env_table for k in ("network_mode", "allowed_hosts", "allow_internet")):
        update["network"] = _baseline_network(env_table, toml_path)
    return base.model_copy(update=update), False


def _artifacts(data: dict[str, Any], toml_path: Path) -> tuple[str, ...]:
    """Harbor's top-level `artifacts`: paths (or `{source = ...}` tables) to carry over."""
    raw = data.get("artifacts") or []
    if not isinstance(raw, list):
        raise TaskLoadError(f"{toml_path}: artifacts must be a list, found {raw!r}")
    out = []
    for item in raw:
        src = item.get("source") if isinstance(item, dict) else item
        if not isinstance(src, str) or not src.startswith("/"):
            raise TaskLoadError(
                f"{toml_path}: artifacts entries must be absolute paths (or tables with an "
                f"absolute 'source'), found {item!r}"
            )
        out.append(src)
    return tuple(out)


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

    raw_steps = data.get("steps")
    if raw_steps is None and (path / "steps").is_dir() and not (path / "instruction.md").exists():
        raise TaskLoadError(
            f"{path}: expected [[steps]] in task.toml for the steps/ folders (a multi-step "
            "task), or an instruction.md (a single-step one); found neither"
        )
    if raw_steps is not None and (not isinstance(raw_steps, list) or not raw_steps):
        raise TaskLoadError(f"{toml_path}: [[steps]] must be a non-empty array of tables")
    task_table = _table(data, "task", toml_path)
    instruction = ""
    if raw_steps is None or (path / "instruction.md").exists():
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
    environment = harbor_environment(path, env, environment, toml_path)  # compose, healthcheck
    timeouts = TimeoutsSpec(
        agent_timeout_s=as_float(agent.get("timeout_sec", 600.0), "agent.timeout_sec"),
        verifier_timeout_s=as_float(verifier.get("timeout_sec", 120.0), "verifier.timeout_sec"),
        build_timeout_s=as_float(
            env.get("build_timeout_sec", 600.0), "environment.build_timeout_sec"
        ),
    )

    tests_dir = path / "tests"
    test_sh = tests_dir / "test.sh"
    verifier_env = str_dict(verifier.get("env"), "verifier.env")
    verifier_environment, _ = _verifier_environment(
        verifier, tests_dir, environment, "verifier", toml_path
    )
    verifier_spec = None
    if test_sh.is_file():
        verifier_spec = VerifierSpec(
            kind="harbor",
            tests_dir=tests_dir,
            script="test.sh",
            script_path=test_sh,
            env=verifier_env,
        )
    elif raw_steps is None:
        raise TaskLoadError(f"{path}: expected tests/test.sh (the verifier), found no such file")

    solve = path / "solution" / "solve.sh"
    solution_spec = None
    if solve.is_file():
        solution_spec = SolutionSpec(
            script=solve,
            upload_dir=path / "solution",
            env=str_dict(solution.get("env"), "solution.env"),
        )

    steps: tuple[StepSpec, ...] = ()
    if raw_steps is not None:
        steps = tuple(
            _load_step(path, toml_path, i, raw, verifier_env, solution_spec, environment)
            for i, raw in enumerate(raw_steps)
        )
        names = [st.name for st in steps]
        if len(set(names)) != len(names):
            raise TaskLoadError(f"{toml_path}: step names must be unique, found {names}")
        instruction = instruction or steps[0].instruction
        verifier_spec = steps[0].verifier
    strategy = data.get("multi_step_reward_strategy") or "mean"
    if strategy not in ("mean", "final"):
        raise TaskLoadError(
            f"{toml_path}: multi_step_reward_strategy must be 'mean' or 'final', found {strategy!r}"
        )
    assert verifier_spec is not None

    generator = None
    gen = metadata.get("generator")
    if gen is not None:
        gen_path = (path / str(gen)).resolve()
        if path.resolve() not in gen_path.parents or not gen_path.is_file():
            raise TaskLoadError(
                f"{toml_path}: metadata.generator must name a file inside the task, found {gen!r}"
            )
        timeout = metadata.get("generator_timeout_sec")
        generator = GeneratorSpec(
            script=gen_path,
            **(
                {"timeout_s": as_float(timeout, "metadata.generator_timeout_sec")}
                if timeout is not None
                else {}
            ),
        )

    return TaskSpec(
        id=path.name,
        instruction=instruction,
        environment=environment,
        timeouts=timeouts,
        verifier=verifier_spec,
        solution=solution_spec,
        verifier_environment=verifier_environment,
        artifacts=_artifacts(data, toml_path),
        agent_network=_phase_network(agent, "agent", toml_path),
        verifier_network=_phase_network(verifier, "verifier", toml_path),
        agent_user=agent.get("user") or None,
        verifier_user=str(verifier.get("user") or "root"),
        generator=generator,
        steps=steps,
        multi_step_reward=strategy,
        source_format=source_format,
        source_dir=path,
        metadata={
            "schema_version": version,
            **({"harbor_name": str(task_table["name"])} if task_table.get("name") else {}),
            **metadata,
        },
    )
