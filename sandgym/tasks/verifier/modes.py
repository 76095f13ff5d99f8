"""How an episode is verified (`verify_episode`): the tamper report first, then the mode.

- `shared` (Harbor's default): the tests run where the agent left things (`run_verifier`); the
  tamper report says what of the agent's the verifier may have run;
- `pristine`: in a fresh sandbox holding only the agent's outputs (`sandgym.tasks.verifier.pristine`);
- `refuse-tampered`: as `shared`, unless the report names a path: then the verifier does not
  run and the step scores the task's lowest reward (0 on the default range), with the reason;
  a path only the trace of the run names (`verifier_opened`) scores the same after the run.

`shared` and `refuse-tampered` run the verifier under the tamper trace
(`sandgym.tasks.tamper_trace.run_traced`); `pristine` adds the paths fallback to its report.

The mode comes from the reset (`options.verify`), else the server (`verify`), else the task
(`metadata.verify` in task.toml), else `shared`: `resolve_verify_mode` (`sandgym.tasks.verifier.choice`,
re-exported here). docs/verification.md says when each fits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sandgym.sandboxes import Sandbox, SandboxBackend
from sandgym.tasks.episode_models import EpisodeSetup, VerifierResult
from sandgym.tasks.errors import VerifierError
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.tamper import tamper_report
from sandgym.tasks.tamper_trace import fallback_report, run_traced
from sandgym.tasks.verifier.choice import resolve_verify_mode
from sandgym.tasks.verifier.pristine import pristine_verifier_sandbox
from sandgym.tasks.verifier.run import reward_range, run_verifier

__all__ = ["resolve_verify_mode", "verify_episode"]


async def verify_episode(
    task: TaskSpec,
    sandbox: Sandbox,
    setup: EpisodeSetup,
    backend: SandboxBackend | None = None,
    image_map: Mapping[str, str] | None = None,
    **verifier_kw: Any,
) -> VerifierResult:
    """The tamper report, then the verifier as `setup.verify` says (the module docstring). A
    `VerifierError` of a tampered episode carries the report's summary in its message."""
    start = time.perf_counter()
    # one listing of the changed paths serves the report and a pristine copy's deletions
    now = await sandbox.changed_paths() if setup.change_baseline is not None else None
    report = await tamper_report(task, sandbox, setup.change_baseline, setup.workdir, now)
    mode = setup.verify
    if mode == "refuse-tampered" and report.tampered:
        low = reward_range(task)[0]
        note = f"[sandgym: not verified ({mode}): {report.summary()}]"
        return VerifierResult(
            reward=low,
            output=note,
            duration_s=time.perf_counter() - start,
            details={"refused": report.summary(limit=20)},
            tamper=report,
            verify=mode,
        )
    if mode == "pristine":  # its verifier runs apart from the agent's files: classed by paths
        note = "pristine: the verifier ran apart from the agent's files"
        report = await fallback_report(task, sandbox, report, setup.workdir, note)
    try:
        if mode == "pristine":
            async with pristine_verifier_sandbox(
                task, sandbox, setup, backend, image_map, now
            ) as pv:
                result = await run_verifier(
                    task, pv.sandbox, pv.setup, backend=backend, image_map=image_map
                )
                result.details["pristine"] = {
                    "sandbox": pv.sandbox.id,
                    "copied": pv.copied,
                    "dropped": pv.dropped[:100],
                    "deleted": pv.deleted[:100],
                    "outputs": "derived" if pv.plan and pv.plan.derived else "declared",
                    "kept_inputs": list(pv.plan.kept_inputs[:100]) if pv.plan else [],
                    "copy_bytes": pv.copy_bytes,
                    "copy_files": pv.copy_files,
                }
        else:  # traced: what of the agent's the run opened is added to the report
            result, report = await run_traced(
                task,
                sandbox,
                report,
                setup.workdir,
                lambda: run_verifier(
                    task, sandbox, setup, backend=backend, image_map=image_map, **verifier_kw
                ),
            )
            if mode == "refuse-tampered" and report.tampered:  # seen only by the trace
                return VerifierResult(
                    reward=reward_range(task)[0],
                    output=f"[sandgym: not paid ({mode}): {report.summary()}]",
                    duration_s=time.perf_counter() - start,
                    details={"refused": report.summary(limit=20), "verified": result.reward},
                    tamper=report,
                    verify=mode,
                )
    except VerifierError as exc:
        if report.tampered:
            exc.tamper = report.summary()
        raise
    result.tamper, result.verify = report, mode
    return result
