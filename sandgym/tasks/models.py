"""`TaskSpec`: the one in-memory description every task format loads into.

Harbor directories, Terminal-Bench v1 directories, SETA tasks and LLM-in-Sandbox instances all
become a `TaskSpec` (see `sandgym.tasks.loaders`). The runtime (one module a job; the table is in
`sandgym.tasks`' docstring) turns a spec into a `SandboxSpec`, prepares an episode, runs the oracle
and the verifier. Units are in field names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandgym.sandboxes.network import NetworkPolicy, clamp
from sandgym.sandboxes.services import HealthcheckSpec, ServiceSpec

#: How the reward is obtained (see `sandgym.tasks.verifier`).
#: harbor: the test script writes /logs/verifier/reward.json or reward.txt.
#: tbench: all-or-nothing over the pytest summary of run-tests.sh.
#: seta:   weighted share of passed pytest tests (weights.json).
#: answer: /testbed/answer.txt compared with a ground truth (exact or numeric).
VerifierKind = Literal["harbor", "tbench", "seta", "answer"]
SourceFormat = Literal["harbor", "tbench", "seta", "lis", "builtin"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EnvironmentSpec(_Frozen):
    """Where the task runs: an image, or a build context with a Dockerfile, plus limits."""

    image: str | None = Field(None, description="prebuilt image name (Harbor docker_image)")
    build_context: Path | None = Field(None, description="directory the Dockerfile builds from")
    dockerfile: str = Field("Dockerfile", description="Dockerfile name inside build_context")
    cpus: float | None = Field(1.0, description="CPU share")
    memory_mb: int | None = Field(2048, description="memory limit in MiB")
    storage_mb: int | None = Field(None, description="disk limit in MiB")
    network: NetworkPolicy = Field(
        NetworkPolicy(mode="no-network"),
        description="the environment's network (Harbor's baseline; True/False: public/no-network)",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    workdir: str | None = Field(
        None, description="working directory; None = the Dockerfile's last WORKDIR, else /app"
    )
    services: tuple[ServiceSpec, ...] = Field(
        (), description="a compose file's other services, beside the main one (docker only)"
    )
    service_name: str = Field("main", description="the main service's compose name")
    bind_mounts: tuple[tuple[Path, str], ...] = Field(
        (),
        description="compose bind mounts of the task's own files: (host path, target), "
        "copied into the built image at the target",
    )
    healthcheck: HealthcheckSpec | None = Field(
        None, description="Harbor [environment] healthcheck: passes before the agent starts"
    )
    tmpfs: tuple[tuple[str, str], ...] = Field(
        (), description="the main service's compose `tmpfs` mounts: (target, options)"
    )
    dns: tuple[str, ...] = Field((), description="the main service's compose `dns` servers")
    extra_hosts: tuple[tuple[str, str], ...] = Field(
        (), description="the main service's compose `extra_hosts`: (host name, address)"
    )
    main_entrypoint: tuple[str, ...] | None = Field(
        None,
        description="the main service's compose `entrypoint` (an empty one clears the "
        "image's); None = not set",
    )
    main_command: tuple[str, ...] | None = Field(
        None, description="the main service's compose `command`; None = not set"
    )
    subnet: str | None = Field(
        None, description="the compose group network's fixed IPv4 subnet (`ipam` config)"
    )
    ipv4_address: str | None = Field(
        None, description="the main service's fixed address on that network (`ipv4_address`)"
    )

    @field_validator("network", mode="before")
    @classmethod
    def _legacy_bool(cls, value: object) -> object:
        return NetworkPolicy.from_bool(value) if isinstance(value, bool) else value


class TimeoutsSpec(_Frozen):
    """Time limits, in seconds."""

    agent_timeout_s: float = Field(600.0, description="the agent's whole episode")
    verifier_timeout_s: float = Field(120.0, description="one run of the verifier")
    build_timeout_s: float = Field(600.0, description="building the image, where one is built")


class AnswerSpec(_Frozen):
    """For `answer` verifiers: what the agent's answer file must contain."""

    ground_truth: str = Field(description="the expected answer (kept on the host)")
    match: Literal["exact", "numeric"] = Field("exact", description="comparison rule")
    answer_path: str = Field("/testbed/answer.txt", description="file the agent writes")
    rel_tol: float = Field(1e-4, description="numeric: relative tolerance")
    abs_tol: float = Field(1e-6, description="numeric: absolute tolerance")


class VerifierSpec(_Frozen):
    """How the task is scored."""

    kind: VerifierKind
    tests_dir: Path | None = Field(None, description="host dir copied to /tests at verify time")
    script: str | None = Field(
        None, description="entry point inside tests_dir (test.sh) or beside it (run-tests.sh)"
    )
    script_path: Path | None = Field(None, description="host path of the entry point")
    env: dict[str, str] = Field(default_factory=dict, description="verifier environment")
    weights: dict[str, float] | None = Field(None, description="seta: test name -> weight")
    answer: AnswerSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> VerifierSpec:
        if self.kind == "answer" and self.answer is None:
            raise ValueError("an 'answer' verifier needs an AnswerSpec")
        if self.kind != "answer" and self.script_path is None:
            raise ValueError(f"a {self.kind!r} verifier needs a script_path")
        return self


class Keystroke(_Frozen):
    """One step of a keystroke solution (Terminal-Bench `solution.yaml`)."""

    keys: str = Field(description="text sent to the terminal")
    append_enter: bool = Field(False, description="send a newline after keys")
    block: bool = Field(False, description="run as a command and wait for it to finish")
    min_timeout_s: float = Field(0.0, description="wait at least this long after sending")
    max_timeout_s: float = Field(180.0, description="block: the command's time limit")


class SolutionSpec(_Frozen):
    """The oracle: a script, or a list of keystrokes replayed through the shell."""

    script: Path | None = Field(None, description="host path of solve.sh / solution.sh")
    upload_dir: Path | None = Field(None, description="host dir copied to /solution first")
    keystrokes: list[Keystroke] | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> SolutionSpec:
        if (self.script is None) == (self.keystrokes is None):
            raise ValueError("a solution is either a script or keystrokes, exactly one")
        return self


class GeneratorSpec(_Frozen):
    """A procedural generator: run inside the sandbox as root before the agent starts.

    It is invoked as `python3 SCRIPT --seed N` in the task's workdir; it writes the instance
    files and prints the expected answer on stdout, which reaches the verifier only (as the
    secret file `/tests/secret/expected`). It may also write the seed's own instruction to the
    file named by `$SANDGYM_INSTRUCTION_FILE`: that text then replaces instruction.md as the
    agent's prompt, and the oracle solution receives it as `$SANDGYM_INSTRUCTION` (single-step
    tasks only; `file-ops` and `file-facts` of the catalog do this).
    """

    script: Path = Field(description="host path of the generator")
    timeout_s: float = Field(60.0, description="time limit of one generation")


class StepSpec(_Frozen):
    """One step of a Harbor multi-step task (`[[steps]]`, `steps/<name>/`): its own
    instruction, files, set-up, tests and solution, walked in order in the same sandbox."""

    name: str = Field(description="the step's directory name under steps/")
    instruction: str = Field(description="steps/<name>/instruction.md")
    workdir_dir: Path | None = Field(
        None, description="steps/<name>/workdir/: copied into the workdir before the step"
    )
    has_setup: bool = Field(False, description="workdir/setup.sh exists: run before the step")
    verifier: VerifierSpec = Field(description="the step's tests (its own tests/ over the task's)")
    tests_overlay: Path | None = Field(
        None, description="steps/<name>/tests/: copied over the task's tests/ for this step"
    )
    solution: SolutionSpec | None = Field(None, description="its solve.sh, else the task's")
    min_reward: dict[str, float] | None = Field(
        None, description="gate: any key below its threshold (or missing) ends the episode"
    )
    agent_timeout_s: float | None = Field(None, description="None = the task's")
    verifier_timeout_s: float | None = Field(None, description="None = the task's")
    agent_network: NetworkPolicy | None = Field(None, description="None = the task's agent's")
    verifier_network: NetworkPolicy | None = Field(None, description="None = the task's verifier's")
    agent_user: str | None = Field(None, description="None = the task's agent user")
    verifier_environment: EnvironmentSpec | None = Field(
        None, description="a separate verifier for this step (None = the task's choice)"
    )
    verifier_shared: bool = Field(
        False, description="`environment_mode = 'shared'` for this step: overrides the task's"
    )
    healthcheck: HealthcheckSpec | None = Field(
        None, description="Harbor's step healthcheck: passes after its set-up, before its agent"
    )


class NetworkPlan(_Frozen):
    """The network policy of each phase of an episode (see `sandgym.sandboxes.network`)."""

    environment: NetworkPolicy = Field(description="setup: the sandbox starts with this")
    agent: NetworkPolicy = Field(description="while the agent (or the oracle) acts")
    verifier: NetworkPolicy = Field(description="while the tests run")
    ceiling: NetworkPolicy | None = Field(
        None, description="the server's clamp, when one was applied (see `clamped`)"
    )
    clamped: bool = Field(False, description="whether the clamp made some phase stricter")

    def clamp(self, ceiling: NetworkPolicy | None) -> NetworkPlan:
        """Each phase made at most as open as `ceiling` (an operator's server-wide setting)."""
        if ceiling is None:
            return self
        env, agent, ver = (clamp(p, ceiling) for p in (self.environment, self.agent, self.verifier))
        changed = (env, agent, ver) != (self.environment, self.agent, self.verifier)
        return NetworkPlan(
            environment=env,
            agent=agent,
            verifier=ver,
            ceiling=ceiling,
            clamped=changed or self.clamped,
        )

    def describe(self) -> dict[str, object]:
        """The JSON shape of `info.network`."""
        return {
            "environment": self.environment.describe(),
            "agent": self.agent.describe(),
            "verifier": self.verifier.describe(),
            "clamp": self.ceiling.describe() if self.ceiling is not None else None,
            "clamped": self.clamped,
        }


class TaskSpec(_Frozen):
    """Everything needed to run and score one task, whatever format it came from."""

    id: str = Field(description="registry id: builtin/<name> or the task's directory name")
    instruction: str = Field(description="the prompt the agent sees")
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    timeouts: TimeoutsSpec = Field(default_factory=TimeoutsSpec)
    verifier: VerifierSpec
    solution: SolutionSpec | None = None
    agent_network: NetworkPolicy | None = Field(
        None, description="the agent phase's network (Harbor [agent]); None = the environment's"
    )
    verifier_network: NetworkPolicy | None = Field(
        None,
        description="the verifier phase's network (Harbor [verifier]); None = the environment's",
    )
    verifier_environment: EnvironmentSpec | None = Field(
        None,
        description="Harbor's separate verifier: the environment its own sandbox is made from "
        "(None: the verifier runs in the agent's sandbox)",
    )
    artifacts: tuple[str, ...] = Field(
        (), description="paths copied from the agent's sandbox to a separate verifier's"
    )
    agent_user: str | None = Field(None, description="user the agent runs as (None = root)")
    verifier_user: str = Field("root", description="user the verifier runs as")
    generator: GeneratorSpec | None = None
    input_files: dict[str, str] = Field(
        default_factory=dict, description="sandbox path -> text, uploaded at prepare (LIS)"
    )
    steps: tuple[StepSpec, ...] = Field(
        (), description="Harbor multi-step tasks: the steps in order (empty: one step)"
    )
    multi_step_reward: Literal["mean", "final"] = Field(
        "mean", description="the episode's reward from its steps' (Harbor's strategy)"
    )
    source_format: SourceFormat
    source_dir: Path | None = Field(None, description="where it was loaded from")
    metadata: dict[str, Any] = Field(default_factory=dict)

    def network_plan(self, step: StepSpec | None = None) -> NetworkPlan:
        """The network of each phase, as Harbor resolves it: the step's own policy, else the
        task's phase's, else the environment's."""
        base = self.environment.network
        return NetworkPlan(
            environment=base,
            agent=(step.agent_network if step else None) or self.agent_network or base,
            verifier=(step.verifier_network if step else None) or self.verifier_network or base,
        )

    def network_policies(self) -> list[NetworkPolicy]:
        """Every policy some phase of some step may run under, the environment's first."""
        plans = [self.network_plan(st) for st in self.steps] or [self.network_plan()]
        out = [plans[0].environment]
        for plan in plans:
            for p in (plan.agent, plan.verifier):
                if p not in out:
                    out.append(p)
        return out

    @property
    def procedural(self) -> bool:
        """True when each seed yields a new instance. A generator that only sets the task up
        (same files for every seed) says so with `procedural = false` in its metadata."""
        return self.generator is not None and bool(self.metadata.get("procedural", True))
