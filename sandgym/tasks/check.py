"""The check of one task (`sandgym tasks check`): an oracle episode, then a no-op episode, each
in a fresh sandbox, returned as a typed result.

`check_task` returns a `TaskCheck`: per phase (`oracle`, `noop`) a `PhaseCheck` with its outcome,
its reward and, where the phase failed, a `CheckError` (the exception's type name, the cause the
error carries where its class has one, e.g. `VerifierError.cause`, and its message); a check that
stopped before any episode (`setup`: no sandbox spec; `load`: the directory did not load) carries
that one error instead. Readers (the CLI, lab/bench/harbor_compat.py) read these fields, never the
joined text. `TaskCheck.to_entry()` is the JSON line of the command's contract (`task_id`,
`oracle_reward`, `noop_reward`, `error`, plus `phase_errors`, `shortfall` and the details).

The check also says how `verify = "pristine"` would take the task's outputs
(`TaskCheck.pristine`, read after the oracle's solution ran: sandgym.tasks.verifier.pristine):
`declared` (its `metadata.outputs`), `derived` (what the solution created under the working
directory; `pristine_kept_inputs` then lists the shipped files the solution edited, which a
pristine verifier would not carry: declare them as outputs), or `refused: WHY` (a backend
without a change set and no declared outputs, or a task pristine cannot verify at all).

How a phase ends, beside the episode loop every runner of the wire shares
(sandgym.client.episode_loop): a check drives the sandbox itself, below the wire (this layer may
import neither the wire nor the client), so no error code arises here; it checks the task, not
a policy. A phase the environment or the task failed (a lost sandbox, a verifier that gave no
reward, a task error) is an `error` with no reward (None), never a reward of 0.0: a no-op
phase "scored 0" by a broken verifier would read as passed. What the table of wire codes scores
as the agent's (sandgym.wire.codes: an action past its limit) is scored here too: the oracle's
solution past the task's agent timeout is killed, and the verifier scores what it left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from sandgym.sandboxes.errors import ChangesUnsupportedError, SandboxCreateError
from sandgym.sandboxes.lifetime import OwnLifetimes
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks.episode import score_step
from sandgym.tasks.episode_models import EpisodeSetup, VerifierReason
from sandgym.tasks.episode_start import prepare_episode
from sandgym.tasks.errors import TaskError, TaskUnsupportedError, VerifierError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.oracle import run_oracle
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.tasks.tamper import declared_outputs
from sandgym.tasks.verifier import FAIL_STATUSES
from sandgym.tasks.verifier.choice import pristine_needs_outputs, pristine_unsupported
from sandgym.tasks.verifier.pristine import output_plan

log = logging.getLogger(__name__)

#: how much of an output's tail `TaskCheck.to_entry(detail=True)` keeps
DETAIL_CHARS = 4000
#: how many failing tests a shortfall names before it says how many more there are
SHORTFALL_TESTS = 3

EpisodePhase = Literal["oracle", "noop"]
PhaseOutcome = Literal["passed", "wrong_reward", "error"]
#: the reward each episode must get: the oracle solves the task, the no-op leaves it untouched
EXPECTED_REWARD: dict[EpisodePhase, float] = {"oracle": 1.0, "noop": 0.0}


def error_cause(exc: BaseException) -> str | None:
    """The cause an error carries where its class has one, set where it was raised:
    `VerifierError.cause` (sandgym.tasks.errors.VERIFIER_CAUSES), `TaskUnsupportedError.cause`
    (UNSUPPORTED_CAUSES), `SandboxCreateError.cause` (`build`, `healthcheck`, `image_missing`,
    `subnet_in_use`, `create`)."""
    if isinstance(exc, VerifierError | TaskUnsupportedError | SandboxCreateError):
        return exc.cause
    return None


class CheckError(BaseModel):
    """One failure of a check: where, which error, its cause, what it said."""

    model_config = ConfigDict(frozen=True)

    phase: str = Field(
        description="`load`, `setup`, `oracle`, `noop`, or `oracle close`/`noop close` (closing "
        "that phase's sandbox failed)"
    )
    error_type: str = Field(description="the exception's class name, e.g. `VerifierError`")
    cause: str | None = Field(
        None,
        description="the cause the error carries (`VerifierError.cause`, "
        "`TaskUnsupportedError.cause`, `SandboxCreateError.cause`); None for other errors, and "
        "on lines written before this field existed",
    )
    message: str = Field(description="the error's message (`str(exc)`)")

    @classmethod
    def of(cls, phase: str, exc: BaseException) -> CheckError:
        return cls(
            phase=phase, error_type=type(exc).__name__, cause=error_cause(exc), message=str(exc)
        )

    def text(self) -> str:
        """The error as the contract's joined `error` string spells it."""
        if self.phase == "load":  # the load message already leads with its type
            return f"load: {self.message}"
        base, _, close = self.phase.partition(" ")
        return f"{base}: {close + ': ' if close else ''}{self.error_type}: {self.message}"


class PhaseCheck(BaseModel):
    """One episode of a check: its reward against the expected one, or the error that ended it."""

    phase: EpisodePhase
    reward: float | None = Field(None, description="the task's reward (None: none was given)")
    step_rewards: list[float] | None = Field(
        None, description="each step's reward, for a multi-step task"
    )
    solution_ran: bool = Field(False, description="the oracle's solution ran (oracle only)")
    solution_exit_code: int | None = Field(None, description="its exit code (last step's)")
    solution_output: str | None = Field(
        None, description="its whole stdout+stderr (last step's); not in the JSON line"
    )
    verifier_output: str | None = Field(
        None, description="the verifier's whole output (last step's); not in the JSON line"
    )
    verifier_reason: VerifierReason | None = Field(
        None,
        description="why the reward is not the tests' own verdict (`VerifierResult.reason`, e.g. "
        "`test_timeout`); the JSON line's `<phase>_verifier_reason`",
    )
    failed_tests: list[str] | None = Field(
        None,
        description="the tests the verifier read as failed (FAILED, ERROR, XPASS), sorted, from "
        "its per-test results (`VerifierResult.details['tests']`: Terminal-Bench 1 and SETA from "
        "pytest's JUnit report; Harbor from the CTRF report its tests write, naming only; last "
        "step's); None where it gives a reward alone (a Harbor reward file and no CTRF report) or "
        "no reward; the JSON line's `<phase>_failed_tests`",
    )
    error: CheckError | None = Field(None, description="what ended the episode, if anything")
    close_error: CheckError | None = Field(None, description="closing its sandbox failed")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def expected_reward(self) -> float:
        return EXPECTED_REWARD[self.phase]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> PhaseOutcome:
        """`error` when anything raised (closing included), else whether the reward was right."""
        if self.error is not None or self.close_error is not None:
            return "error"
        return "passed" if self.reward == self.expected_reward else "wrong_reward"

    def errors(self) -> list[CheckError]:
        return [e for e in (self.error, self.close_error) if e is not None]


#: the one sentence `TaskCheck.shortfall` gives for an error type a maintainer meets often
_ERROR_ACTIONS = {
    "VerifierError": "the verifier did not give a reward",
    "SandboxCreateError": "the environment did not start (its image did not build or run)",
    "TaskUnsupportedError": "the task cannot run here as configured",
    "TaskLoadError": "the task directory did not load",
}


class TaskCheck(BaseModel):
    """The check of one task: both episodes, or the error that stopped it before them."""

    task_id: str
    stopped: CheckError | None = Field(
        None, description="a `load` or `setup` error: no episode ran"
    )
    oracle: PhaseCheck | None = None
    noop: PhaseCheck | None = None
    pristine: str | None = Field(
        None,
        description="how verify='pristine' takes the outputs: `declared`, `derived` or "
        "`refused: why` (module docstring); None where the oracle's solution did not run",
    )
    pristine_kept_inputs: list[str] = Field(
        default_factory=list,
        description="shipped files under the working directory the oracle's solution edited: "
        "derived outputs leave them out, so a pristine verifier sees the shipped ones",
    )

    @property
    def oracle_reward(self) -> float | None:
        return self.oracle.reward if self.oracle is not None else None

    @property
    def noop_reward(self) -> float | None:
        return self.noop.reward if self.noop is not None else None

    @property
    def phase_errors(self) -> list[CheckError]:
        """Every error of the check, in the order they happened."""
        if self.stopped is not None:
            return [self.stopped]
        return [e for p in (self.oracle, self.noop) if p is not None for e in p.errors()]

    @property
    def error(self) -> str | None:
        """The contract's `error`: every phase's error joined with '; ', or None."""
        return "; ".join(e.text() for e in self.phase_errors) or None

    @property
    def ok(self) -> bool:
        """No error, the oracle scored 1.0 and the no-op 0.0."""
        return self.error is None and self.oracle_reward == 1.0 and self.noop_reward == 0.0

    def shortfall(self) -> str | None:
        """The one reason a maintainer can act on why this check fell short (None when it did
        not): its first error (type and message), else the oracle's exit code and reward (with
        the tests that failed, where the verifier names them), else the no-op's reward."""
        errors = self.phase_errors
        if errors:
            first = errors[0]
            if first.phase == "load":
                return f"the task directory did not load: {first.message}"
            what = _ERROR_ACTIONS.get(first.error_type, f"{first.error_type} raised")
            return f"{first.phase}: {what}: {first.message[:300]}"
        oracle, noop = self.oracle_reward, self.noop_reward
        if oracle is not None and oracle != 1.0:
            if self.oracle is not None and self.oracle.verifier_reason == "test_timeout":
                return (
                    "oracle: the tests did not finish within the task's max_test_timeout_sec "
                    f"(test_timeout: unresolved, as Terminal-Bench 1 scores it), reward {oracle}"
                )
            if self.oracle is not None and self.oracle.verifier_reason == "parse_error":
                return (
                    "oracle: the tests reported no result (parse_error: unresolved, as "
                    f"Terminal-Bench 1 scores it), reward {oracle}"
                )
            code = self.oracle.solution_exit_code if self.oracle is not None else None
            failing = _failing_tests_text(self.oracle)
            if code not in (None, 0):
                return (
                    f"oracle: the solution exited {code} and the verifier gave it {oracle}"
                    + failing
                )
            return f"oracle: the solution ran but the verifier gave it {oracle}, not 1.0" + failing
        if noop is not None and noop != 0.0:
            return (
                f"noop: the untouched environment already scores {noop}: its tests do not tell "
                "it from a solved one"
            )
        return None

    def to_entry(self, detail: bool = False) -> dict[str, Any]:
        """The task's JSON line (`sandgym tasks check --json/--jsonl`): the contract's four keys,
        then, where they apply, `oracle_exit_code`, each phase's `*_step_rewards` and
        `*_verifier_reason` and `*_failed_tests`; with
        `detail`, the tails of the oracle's output and of each verifier run (`oracle_output`,
        `oracle_verifier_output`, `noop_verifier_output`); then `phase_errors` (each with its
        `cause`) and `shortfall`."""
        entry: dict[str, Any] = {
            "task_id": self.task_id,
            "oracle_reward": self.oracle_reward,
            "noop_reward": self.noop_reward,
            "error": self.error,
        }
        for p in (self.oracle, self.noop):
            if p is None:
                continue
            if p.solution_ran:
                entry["oracle_exit_code"] = p.solution_exit_code
                if detail:
                    entry["oracle_output"] = (p.solution_output or "")[-DETAIL_CHARS:]
            if p.step_rewards is not None:
                entry[f"{p.phase}_step_rewards"] = p.step_rewards
            if p.verifier_reason is not None:
                entry[f"{p.phase}_verifier_reason"] = p.verifier_reason
            if p.failed_tests is not None:
                entry[f"{p.phase}_failed_tests"] = p.failed_tests
            if detail and p.verifier_output is not None:
                entry[f"{p.phase}_verifier_output"] = p.verifier_output[-DETAIL_CHARS:]
        if self.pristine is not None:
            entry["pristine"] = self.pristine
            if self.pristine_kept_inputs:
                entry["pristine_kept_inputs"] = self.pristine_kept_inputs
        entry["phase_errors"] = [e.model_dump() for e in self.phase_errors]
        entry["shortfall"] = self.shortfall()
        return entry


#: the most shipped files under the working directory whose content a check compares
MAX_SHIPPED_COMPARED = 2000


def _shipped(setup: EpisodeSetup) -> list[str]:
    """The files the task's set-up wrote under the working directory (on a backend that builds
    no image, its shipped files: their kind is `created` in the baseline as well)."""
    if setup.change_baseline is None:
        return []
    top = setup.workdir.rstrip("/") or "/"
    return sorted(
        p
        for p, kind in setup.change_baseline.kinds.items()
        if kind != "deleted" and p.startswith(top + "/")
    )[:MAX_SHIPPED_COMPARED]


async def shipped_fingerprints(sandbox: Any, setup: EpisodeSetup) -> dict[str, str | None]:
    """Fingerprints of `_shipped` files, taken before the oracle's solution runs."""
    paths = _shipped(setup)
    if not paths:
        return {}
    try:
        return dict(await sandbox.path_fingerprints(paths))
    except (ChangesUnsupportedError, NotImplementedError):
        return {}


async def pristine_note(
    task: TaskSpec, sandbox: Any, setup: EpisodeSetup, before: dict[str, str | None] | None = None
) -> tuple[str, list[str]]:
    """(how verify='pristine' takes this task's outputs, the shipped files it would leave out)
    for the sandbox as the oracle's solution left it (module docstring); `before`: the
    `shipped_fingerprints` taken before it ran (the set-up's files it rewrote count too)."""
    why = pristine_unsupported(task)
    if why is not None:
        return f"refused: {why}", []
    if declared_outputs(task):
        return "declared", []
    try:
        changes = await sandbox.changed_paths()
    except ChangesUnsupportedError:
        return f"refused: {pristine_needs_outputs(task)}", []
    baseline = setup.change_baseline.kinds if setup.change_baseline is not None else {}
    plan = output_plan(task, setup.workdir, changes, baseline)
    kept = set(plan.kept_inputs)
    if before:
        after = await sandbox.path_fingerprints(list(before))
        kept |= {p for p, fp in before.items() if after.get(p) != fp and after.get(p) is not None}
    return "derived", sorted(kept)


def _failing_tests_text(phase: PhaseCheck | None) -> str:
    """`; failing tests: a, b, c (+N more)` where the phase's verifier named failed tests, else
    an empty string."""
    names = phase.failed_tests if phase is not None else None
    if not names:
        return ""
    more = len(names) - SHORTFALL_TESTS
    return (
        "; failing tests: "
        + ", ".join(names[:SHORTFALL_TESTS])
        + (f" (+{more} more)" if more > 0 else "")
    )


def failed_tests(details: dict[str, Any]) -> list[str] | None:
    """The tests a verifier's per-test results (`details['tests']`: name -> status) read as
    failed, sorted; None where it reported no per-test results."""
    tests = details.get("tests")
    if not isinstance(tests, dict):
        return None
    return sorted(name for name, status in tests.items() if status in FAIL_STATUSES)


def load_error_check(path: str | Path, error_type: str, message: str) -> TaskCheck:
    """The check of a task directory that did not load (its id is the directory name);
    `message` is the loader's reason, without the type."""
    return TaskCheck(
        task_id=Path(path).name,
        stopped=CheckError(phase="load", error_type=error_type, message=f"{error_type}: {message}"),
    )


def setup_error_check(task: TaskSpec, exc: BaseException) -> TaskCheck:
    """The check of a task that has no sandbox spec (e.g. an env template whose host variable is
    unset): no episode ran."""
    return TaskCheck(task_id=task.id, stopped=CheckError.of("setup", exc))


async def check_task(
    task: TaskSpec,
    backend: Any,
    image_map: dict[str, str],
    seed: int,
    allow_run: bool = False,
    on_phase: Callable[[EpisodePhase], None] | None = None,
) -> TaskCheck:
    """Oracle episode then no-op episode, each in a fresh sandbox; every failure is recorded on
    its phase, never raised (one task's failure never aborts a run). `on_phase(phase)` is
    called as each episode starts (a caller that records what the sandboxes do, e.g. their DNS
    lookups, tells the phases apart by it)."""
    try:
        spec = sandbox_spec_for(task, image_map, allow_run=allow_run)
    except TaskError as exc:  # e.g. an env template whose host variable is unset
        log.warning("task %s: no sandbox spec: %s", task.id, exc)
        return setup_error_check(task, exc)
    check = TaskCheck(task_id=task.id)
    # Each phase's sandbox has its own hard lifetime (sandgym.sandboxes.lifetime): the task's limits
    # (its agent timeout and a verifier run per step) plus the grace, moved on while this
    # process lives; it ends itself if the process is killed.
    limit_s = task.timeouts.agent_timeout_s + max(1, len(task.steps)) * (
        task.timeouts.verifier_timeout_s
    )
    phases: tuple[EpisodePhase, ...] = ("oracle", "noop")
    async with OwnLifetimes() as lifetimes:
        for phase in phases:
            if on_phase is not None:
                on_phase(phase)
            await _check_phase(
                task, backend, image_map, seed, spec, check, phase, lifetimes, limit_s
            )
    return check


async def _check_phase(
    task: TaskSpec,
    backend: Any,
    image_map: dict[str, str],
    seed: int,
    spec: SandboxSpec,
    check: TaskCheck,
    phase: EpisodePhase,
    lifetimes: OwnLifetimes,
    limit_s: float,
) -> None:
    """One episode of the check in a fresh sandbox, recorded on `check`'s `phase`."""
    result = PhaseCheck(phase=phase)
    setattr(check, phase, result)
    start = time.perf_counter()
    sandbox = None
    try:
        sandbox = await lifetimes.create(backend, spec, limit_s)
        setup = await prepare_episode(task, sandbox, seed)
        while True:  # once, or once per step of a multi-step task
            if phase == "oracle":
                before = await shipped_fingerprints(sandbox, setup) if not task.steps else {}
                res = await run_oracle(task, sandbox, setup)
                result.solution_ran = True
                result.solution_exit_code = res.exit_code
                result.solution_output = (res.stdout or "") + (res.stderr or "")
                if not task.steps:
                    check.pristine, check.pristine_kept_inputs = await pristine_note(
                        task, sandbox, setup, before
                    )
                if res.exit_code != 0:
                    log.warning(
                        "task %s: oracle exited %s: %s",
                        task.id,
                        res.exit_code,
                        (res.stderr or res.stdout)[-500:],
                    )
            verified, outcome = await score_step(
                task, sandbox, setup, backend=backend, image_map=image_map
            )
            if outcome.done:
                break
        if outcome.step is not None:
            result.step_rewards = outcome.step["rewards"]
        result.reward = outcome.reward
        result.verifier_output = verified.output
        result.verifier_reason = verified.reason
        result.failed_tests = failed_tests(verified.details)
        if outcome.reward != result.expected_reward:
            log.warning(
                "task %s: %s reward %s (expected %s); verifier output:\n%s",
                task.id,
                phase,
                outcome.reward,
                result.expected_reward,
                verified.output[-1500:],
            )
    except Exception as exc:  # every failure is reported per task, never aborts the run
        result.error = CheckError.of(phase, exc)
        log.warning("task %s: %s failed: %s", task.id, phase, exc)
    finally:
        if sandbox is not None:
            try:
                await asyncio.shield(sandbox.close())
            except Exception as exc:  # e.g. the engine restarted: report, keep checking
                result.close_error = CheckError.of(f"{phase} close", exc)
                log.warning("task %s: closing the %s sandbox failed: %s", task.id, phase, exc)
    log.info("task %s: %s done in %.1f s", task.id, phase, time.perf_counter() - start)
