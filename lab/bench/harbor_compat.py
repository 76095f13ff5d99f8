"""`sandgym bench harbor_compat`: how many real public Harbor tasks run here, and why not the rest.

It runs the `sandgym tasks check` path (`sandgym.tasks.check.check_task`: oracle episode, then a fresh
no-op episode, each scored by the task's own verifier) over every task directory under
`--tasks-dir` (a sample of a public Harbor dataset, brought in by hand: never committed), on
one backend (default docker), with bounded concurrency and a per-task timeout. Before the
episodes it builds the task's image on its own, so "the environment does not build" reads apart
from "the verifier gave no reward".

Each task ends in one verdict, and every failure in one or more named reasons (see `REASONS`),
found from the named error types and the build/verifier output: a base image that is not in
the local engine, a build step that needed a host other than Debian's mirror or PyPI, an apt
package the mapped base does not carry, a verifier that needed the network, no reward file, a
timeout, a loader error, no oracle shipped. The figures:

- `env_builds`: the image builds (or the named image is present);
- `verifier_rewards`: the image builds and the verifier gave a reward in the no-op episode (and
  in the oracle episode, when the task ships one) without a `verifier_error`;
- `noop_zero`: the no-op episode scored 0.0; `oracle_one`: the oracle scored 1.0 (over the
  tasks that ship a solution; `oracle_shipped` counts them).

`--json` prints one JSON document; `--out PATH` also writes it (committed figures:
`lab/bench/results/harbor_compat.json`). `--prune-images` removes each `sandgym/ctx:*` image this
run built as soon as its task is done (only those that did not exist before it, found by the
tasks' own context hashes), so a long run does not fill the disk; a removal waits until no other
task's image is building (lab/bench/build_gate.py), since the engine's builder shares step images
between builds.

Several datasets, one run: each `--tasks-dir` is one dataset, named by `--source-name` and
described by `--source-repo/-commit/-path/-note` (recorded in the report; the tasks themselves
are never committed); `--source-sample N:SEED` checks a seeded sample of N of its tasks. The
tasks of all datasets are interleaved (round robin), so a run that is cut short has covered
every dataset about equally.

Long runs: `--jsonl FILE` streams one JSON line per finished task (the `sandgym tasks check`
streaming, `sandgym.tasks.cli.JsonlSink`, flushed and synced per line); `--resume` skips every task
FILE already holds and appends the rest; `--report-only` builds the document from FILE without
running anything; `--rerun TASK` (with `--resume`) checks a task FILE holds once more (after a
fix), before the tasks not yet run, its new line superseding the old one, which stays in FILE.
Every line names the commit that checked it (`code_commit`), when, and under what limit and
concurrency; the document
counts the reported tasks by commit (`entries_by_commit`) and carries the provenance of the
runs it continues (`earlier_provenance`). A document from a run that did not cover every
selected task says `"complete": false` and counts what was run (`tasks_selected`, `tasks_run`).
`--task-timeout-s 0` gives each task its own limits (build, agent, two verifier runs) plus a
margin, as Harbor would, instead of one cap for all.

Substitutions (`--substitute`, opt-in; `lab/bench/substitutions.py` describes them): a few fetches
of *tools* from hosts that cannot be reached here are replaced in a rewritten copy of the task
(under `--work-dir`) by the same tool from a package registry (uv from PyPI; a CPython from
Debian's mirror). Each is listed on the task's entry and the report counts substituted tasks
apart. A task that needs an unreachable host for anything else (data, models, sources, a base
image) gets the reason `needs_unreachable_host` with the hosts it tried, is never counted as
passed, and leaves the denominator of the `reachable` figures, which are the ones the targets
are read on: over the tasks whose needs are reachable from here, `oracle_one_noop_zero` (the
oracle scores 1.0 and the no-op 0.0; for sets that ship solutions) and `reward_no_verifier_error`
(the verifier gave a reward without a `verifier_error`; for sets without solutions).

`--dns-log` (docker, concurrency 1) gives the sandboxes a logging DNS forwarder
(lab/bench/dns_log.py) and records on each line the names each episode looked up that got no address
here (`dns_unanswered`): run-time evidence of what a failing phase tried to reach
(`lab.bench.compat_outcome.dns_evidence`).

Each line's category (clean, failing in sandgym, needs a host unreachable here, stand-in limit,
public copy incomplete), its one actionable reason and its evidence are decided when the task
runs (`judge`, lab/bench/compat_outcome.py) and recorded on the line (`outcome`); the document
reads every stored line as its own run classified it, never with newer rules, and names the
commit that did (`classified_by`). It leads with the absolute figure (clean of all tasks, beside
the set's published oracle pass rate where one is published: `PUBLISHED_ORACLE`).

Why over 500 lines: the classification of each task's outcome (build, phase and network causes,
verdicts) and the run that produces them must agree on one vocabulary of reasons; the
substitutions live apart (lab/bench/substitutions.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.bench.build_gate import BuildGate
from lab.bench.compat_outcome import (
    CATEGORIES,
    CATEGORY_REASON,
    NOT_REACHABLE,
    PIP_INDEX_RE,
    Outcome,
    classified_by,
    decide,
    recorded_category,
)
from lab.bench.dns_log import DnsLog
from lab.bench.host_load import DiskSpace, HostLoad
from lab.bench.report import save_json
from sandgym.sandboxes import SandboxCreateError, get_backend
from sandgym.tasks.check import CheckError, PhaseCheck, TaskCheck, check_task, setup_error_check
from sandgym.tasks.cli import JsonlSink, read_jsonl
from sandgym.tasks.dockerfile.copy_dest import copy_destinations
from sandgym.tasks.dockerfile.load import task_dockerfile
from sandgym.tasks.errors import TaskError
from sandgym.tasks.loaders import is_task_dir, load_task_dir
from sandgym.tasks.models import TaskSpec
from sandgym.tasks.sandbox_spec import parse_image_map, sandbox_spec_for

log = logging.getLogger("lab.bench.harbor_compat")

CTX_REPO = "sandgym/ctx"
#: pause before re-running a task after an engine failure (a restarting dockerd needs a moment)
INFRA_RETRY_WAIT_S = 10.0

#: reason -> what it means (the JSON carries this table, so the figures read on their own).
REASONS: dict[str, str] = {
    "loader_error": "the task directory did not load into a TaskSpec (our loader refused it)",
    "base_image_unavailable": "the Dockerfile's FROM image is not in the local engine and no "
    "registry is reachable (add an --image-map)",
    "service_image_unavailable": "a compose service's named image is not in the local engine "
    "and no registry is reachable (add a local image of that name)",
    "build_network": "a build step needed a host that cannot be reached from here (only "
    "Debian's mirror and PyPI are)",
    "build_pip_unresolvable": "pip found no distribution for a pinned requirement (the version "
    "needs another Python than the mapped base's, or PyPI has none)",
    "build_apt_package_missing": "an apt package (or a pinned version) does not exist in the "
    "Debian release of the local stand-in image (e.g. Debian trixie standing in for "
    "python:3.13-slim-bookworm); on a stand-in for an Ubuntu image this is reported as "
    "needs_unreachable_host (archive.ubuntu.com) instead",
    "build_timeout": "the image did not build within the per-task timeout",
    "build_other": "the build failed for another reason (see the task's build_error)",
    "disk_full": "a write ran out of space (`No space left on device`) in the build or in an "
    "episode's verifier: the engine's disk was full or the task's storage limit was reached, so "
    "the phase measured nothing about the task; counted as failing, never excluded",
    "verifier_network": "the verifier failed while fetching something from the network",
    "verifier_timeout": "the verifier did not finish within its timeout_sec",
    "test_timeout": "a Terminal-Bench 1 task's tests did not finish within its "
    "max_test_timeout_sec: its harness scores that trial unresolved, so the episode scored 0 "
    "(for the oracle, a failure; recorded as <phase>_verifier_reason)",
    "parse_error": "a Terminal-Bench 1 task's tests reported no result (pytest missing, or "
    "the test script stopped before it ran): its harness scores that trial unresolved "
    "(FailureMode.PARSE_ERROR), so the episode scored 0 (recorded as <phase>_verifier_reason)",
    "verifier_tool_missing": "the verifier calls a program its image lacks or cannot install "
    "there (e.g. a grader baked into a base image that had to be substituted, or one needing a "
    "newer Python than the stand-in's)",
    "verifier_no_reward": "the verifier wrote no reward.txt/reward.json (its tests did not run)",
    "verifier_other": "the verifier's reward file was unusable for another reason",
    "noop_nonzero": "the untouched environment already scores above 0 (a graded partial-credit "
    "rubric, tests that do not discriminate, or an environment that ships the answer)",
    "oracle_not_shipped": "the task ships no solution/solve.sh, so no oracle run is possible",
    "oracle_below_one": "the shipped oracle solution scored below 1.0",
    "task_timeout": "the whole check (build + two episodes) ran past the per-task timeout",
    "infra": "the sandbox layer failed (engine unavailable or restarted, sandbox lost)",
    "task_unsupported": "the task cannot run here as configured (e.g. an env template whose host "
    "variable is unset)",
    "task_runtime_error": "a runtime step inside the sandbox failed (resetting /tests, COPY, "
    "the generator): see the task's error",
    "stand_in_limit": "the task needs the real image a local stand-in only approximates (a "
    "real Ubuntu image: the Ubuntu stand-ins are Debian)",
    "dataset_incomplete": "the public copy of the task lacks some of its files",
    "needs_unreachable_host": "the task needs a host unreachable here (only the package "
    "registries answer) for something no listed substitution replaces: data, a model, sources, a "
    "CPython build; or files its public copy lacks (see unreachable_hosts / absent_files)",
}

#: reasons that mean "needs something this machine cannot reach": such a task is reported, never
#: passed, and left out of the denominator of the `reachable` figures
UNREACHABLE_REASONS = (
    "needs_unreachable_host",
    "base_image_unavailable",
    "service_image_unavailable",
)

_NET = (
    r"Could not resolve|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|Connection refused|Connection timed out|Failed to connect|"
    r"curl: \(\d+\)|unable to resolve host|Failed to establish a new connection|"
    r"ConnectTimeout|ReadTimeout|Max retries exceeded|SSL: CERTIFICATE_VERIFY_FAILED|"
    r"failed: Temporary failure|Failed to fetch|fatal: unable to access|couldn't connect to|"
    r"Could not connect to|Failed to resolve|"
    # opam's download error: curl's exit code 6 (host not resolved) or 7 (no connection)
    r"Download_fail.*exited with code [67]\b"
)
_NET_RE = re.compile(_NET, re.IGNORECASE)
_BASE_RE = re.compile(
    r"pull access denied|manifest unknown|repository does not exist|"
    r"failed to resolve reference|not found: manifest|no such image|"
    r"Get \"https://registry-1\.docker\.io/v2/\": dial tcp",  # FROM, not local, no registry
    re.IGNORECASE,
)
_APT_MISSING_RE = re.compile(
    r"Unable to locate package|has no installation candidate|"
    r"Package '[^']+' has no installation candidate|E: Version '[^']+' for '[^']+' was not found",
)
_PIP_RE = re.compile(
    r"No matching distribution found|Could not find a version that satisfies", re.IGNORECASE
)
_FAILED_STEP_RE = re.compile(r"The command '(.*?)' returned a non-zero code", re.DOTALL)
_FETCH_RE = re.compile(r"\b(wget|curl|git clone)\b[^|;&]*https?://(?!deb\.debian\.org|pypi)")
_PYVER_RE = re.compile(r"does not satisfy Python|Requires-Python|requires a different python")
_ENGINE_RE = re.compile(
    r"failed to create endpoint|could not find bridge|no such network interface|"
    r"Cannot connect to the Docker daemon|"
    # the engine's own image store lost a layer image a build step was committed on (an image
    # removed under a concurrent build that shared its cached steps: --prune-images)
    r"failed to get digest sha256:[0-9a-f]+: open \S*/imagedb/content/"
)
#: what a tool prints when a write finds no space (errno 28: pip's OSError, uv's os error)
_DISK_FULL_RE = re.compile(r"No space left on device|\[Errno 28\]|\(os error 28\)")
_INFRA_RE = re.compile(
    r"ProtocolError|ConnectionError|SandboxLostError|BackendUnavailableError|"
    r"Connection aborted|IncompleteRead|no Docker engine answers|failed to create endpoint|"
    r"could not find bridge|no such network interface",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument(
        "--tasks-dir",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="a folder of Harbor task directories (a sample of a public dataset); repeatable, "
        "one dataset each, the --source-* options pair with them in order",
    )
    parser.add_argument(
        "--limit", type=int, default=None, metavar="N", help="check N tasks of each dataset"
    )
    parser.add_argument(
        "--sample-seed",
        type=int,
        default=None,
        help="shuffle the sorted task list with this seed before --limit (default: sorted)",
    )
    parser.add_argument("--concurrency", type=int, default=2, help="tasks checked at once")
    parser.add_argument("--backend", default="docker", help="sandbox backend (default: docker)")
    parser.add_argument(
        "--image-map",
        action="append",
        default=[],
        metavar="FROM=TO",
        help="run tasks based on image FROM on local image TO (repeatable)",
    )
    parser.add_argument(
        "--task-timeout-s",
        type=float,
        default=600.0,
        help="limit of one task's whole check: build, oracle and no-op episodes "
        "(0: the task's own build, agent and verifier limits, plus a margin)",
    )
    parser.add_argument(
        "--infra-retries",
        type=int,
        default=3,
        help="re-run a task whose check failed only in the sandbox layer (engine restarts)",
    )
    for key, what in (
        ("repo", "owner/name the tasks come from"),
        ("commit", "the commit they were taken at"),
        ("path", "the folder of the dataset inside that repository"),
        ("note", "how the sample was drawn, what was mapped or set (recorded verbatim)"),
    ):
        parser.add_argument(
            f"--source-{key}", action="append", default=[], help=f"{what} (one per --tasks-dir)"
        )
    parser.add_argument(
        "--source-name",
        action="append",
        default=[],
        help="short name of the dataset (default: its folder's name; one per --tasks-dir)",
    )
    parser.add_argument(
        "--source-sample",
        action="append",
        default=[],
        metavar="N:SEED",
        help="check a seeded sample of N tasks of this dataset ('' for all; one per --tasks-dir)",
    )
    parser.add_argument(
        "--source-absent",
        action="append",
        default=[],
        metavar="JSON",
        help="a JSON file {task: [paths]} of files the public copy lacks ('' for none; one per "
        "--tasks-dir)",
    )
    parser.add_argument(
        "--unavailable-dataset",
        action="append",
        default=[],
        metavar="NAME=WHY",
        help="a dataset that was asked for but could not be had here, and why (recorded)",
    )
    parser.add_argument(
        "--prune-images",
        action="store_true",
        help="remove each sandgym/ctx image this run built once its task is done",
    )
    parser.add_argument(
        "--dns-log",
        action="store_true",
        help="docker, --concurrency 1: give the sandboxes a logging DNS forwarder "
        "(lab/bench/dns_log.py) and record per episode the names looked up that got no address "
        "here (`dns_unanswered`; run-time evidence of an unreachable host)",
    )
    parser.add_argument(
        "--jsonl",
        type=Path,
        default=None,
        metavar="FILE",
        help="append one JSON line per finished task to FILE",
    )
    parser.add_argument(
        "--resume", action="store_true", help="skip the tasks --jsonl FILE already holds"
    )
    parser.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="TASK",
        help="with --resume: check this task again even though FILE holds it (repeatable; "
        "TASK or DATASET/TASK); its new line supersedes the old, which stays in FILE",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="build the document from --jsonl FILE without running anything",
    )
    parser.add_argument(
        "--substitute",
        action="store_true",
        help="apply the substitution layer (lab/bench/substitutions.py) to rewritten task copies",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path("/tmp/sandgym-harbor-compat"),
        help="where --substitute writes the rewritten task copies",
    )


# -- classification (pure; unit-tested) ---------------------------------------------------------


def classify_build_error(text: str) -> str:
    """The reason of a failed image build, from the build error and its log tail."""
    if _ENGINE_RE.search(text):
        return "infra"  # the engine could not run a build step at all (e.g. its bridge is gone)
    if _DISK_FULL_RE.search(text):
        return "disk_full"
    if _BASE_RE.search(text):
        return "base_image_unavailable"
    if _APT_MISSING_RE.search(text):
        return "build_apt_package_missing"
    if _PIP_RE.search(text):
        # pip reached an index but found nothing; when it could not reach one it says so too.
        return "build_network" if _NET_RE.search(text) else "build_pip_unresolvable"
    if _NET_RE.search(text):
        return "build_network"
    failed = _FAILED_STEP_RE.search(text)
    if failed and _FETCH_RE.search(failed.group(1)):
        return "build_network"  # a quiet download (wget -q, curl -s) from a host not reachable
    if _INFRA_RE.search(text):
        return "infra"
    return "build_other"


def classify_phase_error(err: CheckError) -> str:
    """The reason of one failed `check_task` phase, read from its typed error: the exception's
    type and the cause it carries (set where it was raised). Only what an outside tool printed
    is read as text: the verifier's output (`verifier_output_reason`) and docker build's
    (`classify_build_error`). A line written before errors carried a cause (`cause` None) is
    read by its message, as the code of its day did (`_legacy_cause`)."""
    etype = err.error_type
    cause = err.cause if err.cause is not None else _legacy_cause(err)
    if etype == "TaskUnsupportedError":
        return "oracle_not_shipped" if cause == "no_oracle" else "task_unsupported"
    if etype == "VerifierError":
        if cause == "timeout":
            return "verifier_timeout"
        said = verifier_output_reason(err.message)
        if said is not None:
            return said
        return "verifier_no_reward" if cause == "no_reward" else "verifier_other"
    if etype == "SandboxCreateError" and cause == "build":
        return classify_build_error(err.message)  # the build's own output
    if etype == "SandboxCreateError" and cause == "image_missing":
        return "service_image_unavailable"
    if _INFRA_RE.search(etype) or etype.startswith("Sandbox") or etype.endswith("Timeout"):
        return "infra"  # the sandbox layer's errors, and the engine client's by type name
    if etype == "TaskLoadError":
        return "loader_error"
    return "task_runtime_error"


def verifier_output_reason(message: str) -> str | None:
    """`verifier_network` or `verifier_tool_missing` when the verifier's own output (which a
    `VerifierError`'s message ends with) says a fetch failed or a program is missing or needs
    another Python; else None. Text on purpose: only the task's test script and the tools it
    runs (curl, pip, uv, bash) know this, and they say it only in what they print."""
    if _NET_RE.search(message):
        return "verifier_network"
    if "command not found" in message or _PYVER_RE.search(message):
        return "verifier_tool_missing"
    return None


def _legacy_cause(err: CheckError) -> str | None:
    """LEGACY, for lines written before `CheckError.cause` existed (their errors carry no
    cause): the cause as the code of their day read it from the message. New lines never take
    this path."""
    msg = err.message
    if err.error_type == "TaskUnsupportedError" and "no oracle solution" in msg:
        return "no_oracle"
    if err.error_type == "VerifierError":
        if "did not finish within" in msg:
            return "timeout"
        if "wrote no reward" in msg:
            return "no_reward"
    if err.error_type == "SandboxCreateError" and "building" in msg:
        return "build"
    return None


def split_phase_errors(error: str | None) -> list[str]:
    """LEGACY: a line written before `phase_errors` existed has only the joined `error`
    (`"<phase>: <ErrorType>: <message>; ..."`); split it back at the phase tags."""
    if not error:
        return []
    parts = re.split(r"(?:^|; )(?=(?:setup|oracle|noop): )", error)
    return [p for p in parts if p]


def phase_errors_of(entry: Mapping[str, Any]) -> list[CheckError]:
    """The typed errors of a line: its `phase_errors` (a line from before `cause` existed reads
    with `cause` None), or for a line older still, its joined `error` split back (LEGACY)."""
    typed = entry.get("phase_errors")
    if typed is not None:
        return [CheckError.model_validate(pe) for pe in typed]
    out = []
    for part in split_phase_errors(entry.get("error")):
        phase, _, rest = part.partition(": ")
        etype, _, msg = rest.partition(": ")
        out.append(CheckError(phase=phase, error_type=etype, message=msg))
    return out


def verdict(entry: Mapping[str, Any]) -> list[str]:
    """Every reason this task's check fell short of a clean oracle 1.0 / no-op 0.0 (or []),
    without the category's own reason (`outcome` adds that: see `judge`)."""
    reasons: list[str] = []
    if entry.get("load_error"):
        return ["loader_error"]
    if entry.get("timed_out"):
        reasons.append("task_timeout")
    if entry.get("build_error"):
        reasons.append(entry["build_reason"])
    else:
        for err in phase_errors_of(entry):
            r = classify_phase_error(err)
            if r not in reasons:
                reasons.append(r)
        noop = entry.get("noop_reward")
        if noop is not None and noop != 0.0:
            reasons.append("noop_nonzero")
        if _DISK_FULL_RE.search(str(entry.get("noop_verifier_output") or "")):
            # the no-op's tests never judged it: a test script that writes 0 whenever its runner
            # fails scored the no-op 0.0 for want of space, which says nothing about the task
            reasons.append("disk_full")
        oracle = entry.get("oracle_reward")
        if oracle is not None and oracle != 1.0:
            why = entry.get("oracle_verifier_reason")
            tests_said = str(entry.get("oracle_verifier_output") or "")
            out = str(entry.get("oracle_output") or "") + tests_said
            if _DISK_FULL_RE.search(out) and "disk_full" not in reasons:
                reasons.append("disk_full")
            if why in ("test_timeout", "parse_error"):
                reasons.append(why)
                said = verifier_output_reason(tests_said)
                if why == "parse_error" and said is not None:
                    reasons.append(said)  # what the tests' own output says stopped them
            reasons.append("oracle_below_one")
    failing = [r for r in reasons if r not in ("oracle_not_shipped", "noop_nonzero")]
    if failing and reachable_host_failed(entry):
        # a host that answers from this machine did not answer the sandbox: its network went
        # away under it (the engine's bridge was removed), which says nothing about the task
        return ["infra"]
    return reasons


def judge(entry: Mapping[str, Any]) -> tuple[list[str], Outcome]:
    """A line's reasons and its outcome (category, one actionable reason, evidence), decided
    from what its run recorded (lab/bench/compat_outcome.py); an excluding category's reason goes
    first (`needs_unreachable_host`, `stand_in_limit`, `dataset_incomplete`)."""
    reasons = verdict(entry)
    outcome = decide(entry, reasons)
    if outcome.category in CATEGORY_REASON:
        reasons = [CATEGORY_REASON[outcome.category], *reasons]
    return reasons, outcome


#: colour codes of docker build's streamed stderr (they split words, and so host names)
_ANSI_RE = re.compile(r"\x1b?\[[0-9;]*m")


_CONNECT_RE = re.compile(
    r"Unable to connect to|Could not resolve|Temporary failure resolving|Connection refused|"
    r"Connection timed out|Network is unreachable|Failed to connect to|Could not connect to|"
    r"Failed to establish a new connection|Temporary failure in name resolution|dns error",
    re.IGNORECASE,
)
_UV_FETCH_RE = re.compile(r"Failed to fetch: `https?://(pypi\.org|files\.pythonhosted\.org)/")
_REACHABLE_RE = re.compile(
    r"deb\.debian\.org|security\.debian\.org|pypi\.org|files\.pythonhosted\.org"
)


def reachable_host_failed(entry: Mapping[str, Any]) -> bool:
    """A connection to a host that answers from this machine failed (so the sandbox's own
    network failed: infrastructure, not the task)."""
    for k in OUTPUT_KEYS:
        lines = _ANSI_RE.sub("", _text(entry.get(k))).splitlines()
        for i, line in enumerate(lines):
            if _CONNECT_RE.search(line) and _REACHABLE_RE.search(line):
                return True
            # uv names the URL on one line and the lookup that failed on its "Caused by" lines
            if _UV_FETCH_RE.search(line) and any(
                _CONNECT_RE.search(x) for x in lines[i + 1 : i + 8]
            ):
                return True
    return False


#: a line that says a connection or a name lookup failed, in the oracle's output
#: (`network_failure_lines`)
NETWORK_FAILURE_RE = re.compile(
    r"Name or service not known|Temporary failure in name resolution|Could not resolve|"
    r"Failed to resolve|Max retries exceeded|Network is unreachable|Connection timed out|"
    r"Failed to establish a new connection|couldn't connect to|Could not connect to|"
    r"unable to access|Failed to connect to|is not available for this version of R|"
    r"Download_fail",
    re.IGNORECASE,
)
NETWORK_LINES = 20


def network_failure_lines(text: str) -> list[str]:
    """The distinct lines of the oracle's output `text` that say a connection or name lookup
    failed (at most NETWORK_LINES, each cut to 400 characters), kept on the line as
    `oracle_network_lines` since the output's tail often lacks them. Text on purpose: only the
    task's solution and the tools it runs (curl, wget, pip, R, opam) know a fetch failed, and
    they say it only in what they print. pip's own line naming the index it looks in is kept
    too: its failed connections name only a path (`compat_outcome._pip_index_evidence`)."""
    out: list[str] = []
    for line in text.splitlines():
        if NETWORK_FAILURE_RE.search(line) or PIP_INDEX_RE.search(line):
            line = line.strip()[:400]
            if line not in out:
                out.append(line)
                if len(out) == NETWORK_LINES:
                    break
    return out


#: the fields of an entry that hold what its check printed (read for network failures)
OUTPUT_KEYS = (
    "build_error",
    "error",
    "oracle_output",
    "oracle_verifier_output",
    "noop_verifier_output",
    "oracle_network_lines",
)


def _text(value: Any) -> str:
    """An entry's output field as text (`oracle_network_lines` is a list of lines)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return value or ""


def summarize(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and shares over all checked task directories, each line taken as its own run
    classified it (`recorded_category`): the per-category table, the absolute figure (clean of
    all tasks), then the figures over the reachable tasks (those not in `NOT_REACHABLE`)."""
    n = len(entries)

    def share(k: int, d: int) -> dict[str, Any]:
        return {"count": k, "of": d, "share": round(k / d, 3) if d else None}

    cats = {id(e): recorded_category(e)[0] for e in entries}
    table = {c: sum(1 for e in entries if cats[id(e)] == c) for c in CATEGORIES}
    loaded = [e for e in entries if not e.get("load_error")]
    builds = [e for e in loaded if e.get("env_builds")]
    rewards = [
        e
        for e in builds
        if e.get("noop_reward") is not None
        and not any(r.startswith("verifier_") for r in e["reasons"])
        and not (e.get("oracle_shipped") and e.get("oracle_reward") is None)
    ]
    shipped = [e for e in loaded if e.get("oracle_shipped")]
    reachable = [e for e in entries if cats[id(e)] not in NOT_REACHABLE]
    subst = [e for e in entries if e.get("substitutions")]
    by_name: dict[str, int] = {}
    for e in subst:
        for name in sorted({r["name"] for r in e["substitutions"]}):
            by_name[name] = by_name.get(name, 0) + 1
    reach_shipped = [e for e in reachable if e.get("oracle_shipped")]
    reach_rewards = [e for e in reachable if e in rewards]
    clean = [e for e in entries if cats[id(e)] == "clean"]
    return {
        "tasks": n,
        "table": table,
        "absolute_clean": share(len(clean), n),
        "loaded": share(len(loaded), n),
        "env_builds": share(len(builds), n),
        "verifier_rewards": share(len(rewards), n),
        "noop_zero": share(sum(1 for e in entries if e.get("noop_reward") == 0.0), n),
        "oracle_shipped": share(len(shipped), n),
        "oracle_one": share(sum(1 for e in shipped if e.get("oracle_reward") == 1.0), len(shipped)),
        "clean": share(len(clean), n),
        "needs_unreachable_host": share(table["unreachable_host"], n),
        "reachable": {
            "tasks": len(reachable),
            "oracle_one_noop_zero": share(
                sum(
                    1
                    for e in reach_shipped
                    if e.get("oracle_reward") == 1.0 and e.get("noop_reward") == 0.0
                ),
                len(reach_shipped),
            ),
            "reward_no_verifier_error": share(len(reach_rewards), len(reachable)),
            "noop_zero": share(
                sum(1 for e in reachable if e.get("noop_reward") == 0.0), len(reachable)
            ),
            "clean": share(sum(1 for e in reachable if e in clean), len(reachable)),
        },
        "shortfalls": shortfalls(entries),
        "substituted": {
            "tasks": len(subst),
            "by_substitution": by_name,
            "clean": sum(1 for e in subst if cats[id(e)] == "clean"),
            "clean_without_substitution": sum(1 for e in clean if not e.get("substitutions")),
        },
    }


def shortfalls(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per task short of clean: its category, its one reason and the action it names
    (the line's `outcome`, or for an older line its first recorded reason and host), and the
    code commit that classified it."""
    rows = []
    for e in sorted(entries, key=lambda x: str(x.get("task_id"))):
        cat, reason = recorded_category(e)
        if cat == "clean":
            continue
        outcome = e.get("outcome") or {}
        hosts = e.get("unreachable_hosts") or []
        action = outcome.get("action") or (
            f"needs {hosts[0]}" if hosts and cat != "failing" else f"{reason} (recorded)"
        )
        rows.append(
            {
                "task_id": e.get("task_id"),
                "category": cat,
                "reason": reason,
                "action": action,
                "classified_by": classified_by(e),
            }
        )
    return rows


def group_reasons(entries: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for e in entries:
        for r in e["reasons"]:
            groups.setdefault(r, []).append(e["task_id"])
    return {
        r: {"count": len(ids), "meaning": REASONS.get(r, ""), "tasks": sorted(ids)}
        for r, ids in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    }


# -- the run ------------------------------------------------------------------------------------

#: how much of each output tail an entry keeps (in the JSONL and the committed document)
KEEP_CHARS = 1500


@dataclass
class Item:
    """One selected task directory of one dataset, loaded (or not), ready to check."""

    dataset: str
    path: Path
    task: TaskSpec | None = None
    load_error: str | None = None
    substitutions: list[dict[str, str]] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    refs: dict[str, list[str]] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return self.task.id if self.task is not None else self.path.name


def _task_dirs(root: Path, limit: int | None, seed: int | None) -> list[Path]:
    dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if seed is not None:
        random.Random(seed).shuffle(dirs)
    return dirs[:limit] if limit is not None else dirs


def parse_sample(text: str | None) -> tuple[int | None, int | None]:
    """`"N:SEED"` -> (N, SEED); `"N"` -> (N, None); empty -> (None, None)."""
    if not text:
        return None, None
    n, _, seed = text.partition(":")
    return int(n), (int(seed) if seed else None)


def _load(path: Path) -> tuple[TaskSpec | None, str | None]:
    if not is_task_dir(path):
        return None, f"{path.name}: not a task directory (no task.toml/task.yaml/instance.json)"
    try:
        return load_task_dir(path), None
    except TaskError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _base_image(task: TaskSpec) -> str | None:
    """The image the task's container runs on: its Dockerfile's last stage's `FROM` (read
    from the text where the local parser refuses the file, e.g. `COPY --from` another image),
    else its `docker_image`."""
    try:
        df = task_dockerfile(task)
    except TaskError:
        df = None
        env = task.environment
        if env.build_context is not None:
            path = env.build_context / env.dockerfile
            text = path.read_text(encoding="utf-8") if path.is_file() else ""
            froms = [
                [t for t in ln.split()[1:] if not t.startswith("--")]
                for ln in text.splitlines()
                if ln.split()[:1] and ln.split()[0].upper() == "FROM"
            ]
            if froms and froms[-1]:
                return froms[-1][0]
        return None
    return df.base_image if df is not None else task.environment.image


def _nth(values: list[str], i: int) -> str | None:
    return values[i] if i < len(values) and values[i] != "" else None


def dataset_name(args: argparse.Namespace, index: int) -> str:
    return _nth(args.source_name, index) or Path(args.tasks_dir[index]).name


def plan_dataset(args: argparse.Namespace, index: int, load: bool = True) -> list[Item]:
    """The selected task directories of one dataset, loaded, substituted when asked."""
    from lab.bench.substitutions import prepare_task_copy, referenced_unreachable_hosts

    name = dataset_name(args, index)
    root: Path = args.tasks_dir[index]
    n, seed = parse_sample(_nth(args.source_sample, index))
    if n is None:
        n, seed = args.limit, args.sample_seed
    absent_file = _nth(args.source_absent, index)
    absent: dict[str, list[str]] = (
        json.loads(Path(absent_file).read_text(encoding="utf-8")) if absent_file else {}
    )
    cpython: dict[str, list[str] | None] = {}
    if load and args.substitute:
        from lab.bench.substitutions import DEBIAN_CPYTHON, debian_cpython_debs

        cpython = {v: debian_cpython_debs(v, Path(args.work_dir)) for v in DEBIAN_CPYTHON}
    items: list[Item] = []
    for d in _task_dirs(root, n, seed):
        item = Item(dataset=name, path=d, absent=sorted(absent.get(d.name, [])))
        if load:
            src = d
            if args.substitute and is_task_dir(d):
                dst = Path(args.work_dir) / name / d.name
                item.substitutions = prepare_task_copy(d, dst, cpython)
                src = dst if item.substitutions else d
                for rec in item.substitutions:
                    if rec["name"] == "uv-image-from-pypi":
                        _ensure_uv_image(rec["version"], Path(args.work_dir))
            item.refs = referenced_unreachable_hosts(d) if d.is_dir() else {}
            item.task, item.load_error = _load(src)
            if item.task is not None:
                item.substitutions += classic_builder_records(item.task, d)
                item.substitutions += service_stand_in_records(item.task)
        items.append(item)
    return items


def classic_builder_records(task: TaskSpec, task_dir: Path) -> list[dict[str, str]]:
    """One record per `COPY`/`ADD` of several sources whose destination the runtime spells
    with its slash for the classic builder (`sandgym.tasks.dockerfile.copy_dest`): the rewrite is made
    for every run, and listed on the task's entry like a substitution."""

    env = task.environment
    if env.build_context is None:
        return []
    path = env.build_context / env.dockerfile
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    try:
        rel = str(path.resolve().relative_to(Path(task_dir).resolve()))
    except ValueError:  # loaded from its rewritten copy under --work-dir
        rel = env.dockerfile
    return [
        {"name": "copy-dest-dir-for-classic-builder", "original": line, "file": rel}
        for line in copy_destinations(text, env.build_context)[1]
    ]


def service_stand_in_records(task: TaskSpec) -> list[dict[str, str]]:
    """One record per compose service whose named image (no build) runs on a local stand-in
    (`sandgym images`, e.g. postgres:15): listed on the task's entry like a substitution."""
    from lab.images import standin_for

    out: list[dict[str, str]] = []
    for svc in task.environment.services:
        standin = standin_for(svc.image) if svc.image and svc.build_context is None else None
        if standin is not None:
            out.append(
                {
                    "name": "service-image-stand-in",
                    "original": f"image: {svc.image}",
                    "file": "docker-compose.yaml",
                    "service": svc.name,
                    "stand_in": standin.image,
                }
            )
    return out


def _ensure_uv_image(version: str, work_dir: Path) -> None:
    """The local image a `uv-image-from-pypi` substitution copies from; a failure is logged
    (the task's build then fails on the missing image and is reported so)."""
    from lab.bench.substitutions import ensure_uv_image

    try:
        ensure_uv_image(version, work_dir)
    except Exception as exc:
        log.warning("substitution uv-image-from-pypi %s: %s", version, exc)


def interleave(groups: list[list[Item]]) -> list[Item]:
    """Round robin over the datasets: a run cut short has covered each about equally."""
    out: list[Item] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def _trim(entry: dict[str, Any]) -> dict[str, Any]:
    for k in ("oracle_output", "oracle_verifier_output", "noop_verifier_output", "error"):
        v = entry.get(k)
        if isinstance(v, str) and len(v) > KEEP_CHARS:
            entry[k] = "..." + v[-KEEP_CHARS:]
    return entry


#: beyond the task's own limits: starting sandboxes, copying tests, two episodes' set-up
LIMIT_SLACK_S = 300.0


def task_limit_s(task: TaskSpec, cap_s: float) -> float:
    """The limit of one task's whole check: `cap_s`, or with `cap_s <= 0` the task's own
    limits (its image build, the oracle's episode under the agent's limit, two verifier runs)
    plus `LIMIT_SLACK_S`, as Harbor would give that task."""
    if cap_s > 0:
        return cap_s
    t = task.timeouts
    return t.build_timeout_s + t.agent_timeout_s + 2 * t.verifier_timeout_s + LIMIT_SLACK_S


async def _check_one(
    task: TaskSpec,
    backend: Any,
    image_map: dict[str, str],
    timeout_s: float,
    retries: int,
    item: Item | None = None,
    dns: DnsLog | None = None,
    gate: BuildGate | None = None,
    engine_root: Path | None = None,
) -> dict[str, Any]:
    async def build_image(image_for: Callable[[Any], Any]) -> None:
        # no image removal (--prune-images) while it builds
        async with gate.build() if gate is not None else contextlib.nullcontext():
            await image_for(spec)

    entry: dict[str, Any] = {
        "task_id": task.id,
        "base_image": _base_image(task),
        "oracle_shipped": task.solution is not None,
        "env_builds": False,
        "build_s": None,
        "build_error": None,
        "oracle_reward": None,
        "noop_reward": None,
        "error": None,
        "timed_out": False,
        "attempts": 0,
    }
    if item is not None:
        entry.update(
            dataset=item.dataset,
            substitutions=item.substitutions,
            absent_files=item.absent,
            referenced_unreachable_hosts=item.refs,
        )
    start = time.perf_counter()
    load = HostLoad()
    disk = DiskSpace(engine_root) if engine_root is not None else None
    try:
        spec = sandbox_spec_for(task, image_map)
    except TaskError as exc:  # reported like check_task reports it
        entry.update(setup_error_check(task, exc).to_entry())
        entry["duration_s"] = round(time.perf_counter() - start, 1)
        entry["reasons"], outcome = judge(entry)
        entry["outcome"] = outcome.model_dump()
        return entry
    image_for = getattr(backend, "image_for", None)
    if image_for is not None and entry["base_image"]:
        # the local image the task's FROM names here, as it is when the task starts: a stand-in
        # rebuilt later (a new recipe, a new engine) is another image, and the line says which
        base = entry["base_image"]
        entry["base_image_local"] = (await asyncio.to_thread(_stand_ins, [base], image_map))[base]
    for attempt in range(retries + 1):
        entry["attempts"] = attempt + 1
        entry.update(build_error=None, error=None, oracle_reward=None, noop_reward=None)
        remaining = timeout_s - (time.perf_counter() - start)
        if dns is not None:  # this attempt's lookups only; the build's come first
            dns.reset()
            dns.mark("build")
        try:
            if image_for is not None:
                t0 = time.perf_counter()
                try:
                    await asyncio.wait_for(build_image(image_for), remaining)
                except TimeoutError:
                    raise
                except Exception as exc:  # e.g. the engine restarted under a streaming build
                    text = f"{type(exc).__name__}: {exc}"
                    entry["build_error"] = text[-3000:]
                    entry["build_reason"] = (
                        classify_build_error(text)
                        if isinstance(exc, SandboxCreateError)
                        else "infra"
                    )
                    entry["build_s"] = round(time.perf_counter() - t0, 1)
                    engine = entry["build_reason"] == "infra" or reachable_host_failed(entry)
                    if engine and attempt < retries:
                        log.warning(
                            "task %s: build hit an infra failure, retrying: %s", task.id, text[:200]
                        )
                        await _wait_for_engine()
                        continue
                    break
                entry["build_s"] = round(time.perf_counter() - t0, 1)
            entry["env_builds"] = True
            remaining = timeout_s - (time.perf_counter() - start)
            try:
                check = await asyncio.wait_for(
                    check_task(
                        task,
                        backend,
                        image_map,
                        0,
                        on_phase=dns.mark if dns is not None else None,
                    ),
                    remaining,
                )
            except TimeoutError:
                raise
            except Exception as exc:  # check_task reports per phase; anything else is infra
                check = TaskCheck(
                    task_id=task.id,
                    noop=PhaseCheck(phase="noop", error=CheckError.of("noop", exc)),
                )
            res = check.to_entry(detail=True)
            if check.oracle is not None and check.oracle.solution_ran:
                # the whole output's failed connections: its tail often lacks them
                res["oracle_network_lines"] = network_failure_lines(
                    check.oracle.solution_output or ""
                )
            entry.update(res)
            entry["task_id"] = task.id
        except TimeoutError:
            entry["timed_out"] = True
            if entry["build_s"] is None and image_for is not None:
                entry["build_error"] = f"no image within {timeout_s} s"
                entry["build_reason"] = "build_timeout"
            break
        if infra_only({"reasons": verdict(entry)}) and attempt < retries:
            log.warning("task %s: infra failure, retrying: %s", task.id, entry["error"])
            await _wait_for_engine()
            continue
        break
    if dns is not None:  # what the last attempt's build and episodes looked up, unanswered
        dns.mark(None)
        entry["dns_log"] = True
        entry["dns_unanswered"] = dns.unanswered(["build", "oracle", "noop"])
    entry["duration_s"] = round(time.perf_counter() - start, 1)
    entry["host_load"] = load.finish()
    if disk is not None:  # the engine's data root: its images, layers and containers
        entry["engine_disk"] = disk.finish()
    # decided now, from what this run saw, and never again (the report reads it as recorded)
    entry["reasons"], outcome = judge(entry)
    entry["outcome"] = outcome.model_dump()
    ev = outcome.evidence
    entry["unreachable_hosts"] = [ev.needs] if ev is not None else []
    return _trim(entry)


def infra_only(entry: Mapping[str, Any]) -> bool:
    """The entry's check failed in the sandbox layer and nowhere else."""
    reasons = [r for r in entry.get("reasons") or [] if r != "oracle_not_shipped"]
    return bool(reasons) and all(r == "infra" for r in reasons)


def drop_infra_only(
    entries: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], set[tuple[Any, Any]]]:
    """`entries` without the lines whose check failed only in the sandbox layer (they say
    nothing about their task), and the (dataset, task_id) of the tasks left with no line at
    all, which a resumed run therefore runs again; a task with another line keeps that one."""
    kept = [e for e in entries if not infra_only(e)]
    have = {(e.get("dataset"), e.get("task_id")) for e in kept}
    again = {(e.get("dataset"), e.get("task_id")) for e in entries if infra_only(e)} - have
    return kept, again


def load_error_entry(item: Item) -> dict[str, Any]:
    return {
        "dataset": item.dataset,
        "task_id": item.task_id,
        "load_error": item.load_error,
        "substitutions": item.substitutions,
        "oracle_reward": None,
        "noop_reward": None,
        "reasons": ["loader_error"],
        "outcome": Outcome(
            category="failing",
            reason="loader_error",
            action=f"the loader refused it: {item.load_error}",
        ).model_dump(),
    }


async def _wait_for_engine(limit_s: float = 120.0) -> None:
    """After an engine failure: pause, then poll `docker info` until it answers (or give up)."""
    await asyncio.sleep(INFRA_RETRY_WAIT_S)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        proc = await asyncio.create_subprocess_exec(
            "docker", "info", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        if await proc.wait() == 0:
            return
        await asyncio.sleep(2.0)


def _existing_ctx_tags() -> set[str]:
    out = subprocess.run(
        ["docker", "images", CTX_REPO, "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return set(out.stdout.split())


def _ctx_tag(task: TaskSpec, image_map: dict[str, str]) -> str | None:
    try:
        spec = sandbox_spec_for(task, image_map)
    except TaskError:
        return None
    if spec.build_context is None:
        return None
    digest = spec.build_key()
    return f"{CTX_REPO}:{digest[:16]}" if digest else None


def _stand_ins(bases: list[str], image_map: dict[str, str]) -> dict[str, Any]:
    """Which local image stands in for each public base image (id, and the suite it was
    bootstrapped from, where its labels say), or null where none is present: per line
    (`base_image_local`, when its task starts) and per document (`stand_in_images`)."""
    out: dict[str, Any] = {}
    for b in sorted(set(bases)):
        name = image_map.get(b, b)
        try:
            r = subprocess.run(
                ["docker", "image", "inspect", name, "--format", "{{.Id}} {{json .Config.Labels}}"],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:  # no docker CLI on this host: nothing to name
            out[b] = None
            continue
        if r.returncode != 0:
            out[b] = None
            continue
        iid, _, labels = r.stdout.strip().partition(" ")
        try:
            lab = json.loads(labels) or {}
        except json.JSONDecodeError:
            lab = {}
        out[b] = {
            "local_image": name,
            "id": iid[:19],
            "suite": lab.get("sandgym.suite"),
            "stands_in_for": lab.get("sandgym.stand-in-for"),
            "made_from": lab.get("sandgym.stand-in-from"),
        }
    return out


def dataset_doc(
    args: argparse.Namespace, index: int, items: list[Item], entries: list[dict[str, Any]]
) -> dict[str, Any]:
    name = dataset_name(args, index)
    latest: dict[str, dict[str, Any]] = {}  # a task run again (after an infra failure): last wins
    for e in entries:
        if e.get("dataset") == name:
            latest[e["task_id"]] = e
    # each line as its run classified it (never re-classified with newer rules)
    mine = [dict(e, classified_by=classified_by(e)) for e in latest.values()]
    selected = {i.task_id for i in items}
    mine = [e for e in mine if e["task_id"] in selected]
    bases: dict[str, int] = {}
    for e in mine:
        if not e.get("load_error"):
            b = e.get("base_image") or "?"
            bases[b] = bases.get(b, 0) + 1
    run_ids = {e["task_id"] for e in mine}
    return {
        "name": name,
        "source": {
            "repo": _nth(args.source_repo, index),
            "commit": _nth(args.source_commit, index),
            "path": _nth(args.source_path, index),
            "sample": _nth(args.source_note, index),
            "selection": _nth(args.source_sample, index) or "all",
            "tasks_dir": str(args.tasks_dir[index]),
        },
        "published_oracle": PUBLISHED_ORACLE.get(name, {"share": None, "note": "none found"}),
        "tasks_selected": len(items),
        "tasks_run": len(mine),
        "not_run": sorted(selected - run_ids),
        "base_images": bases,
        "summary": summarize(mine),
        "reasons": group_reasons(mine),
        "tasks": sorted(mine, key=lambda e: e["task_id"]),
    }


#: the oracle pass rate each set's own harness publishes, beside our absolute figure: none was
#: found (searched Harbor's docs, Terminal-Bench's docs and source with the search tool)
PUBLISHED_ORACLE: dict[str, dict[str, Any]] = {
    "terminal-bench-2.0": {
        "share": None,
        "note": "none found: Harbor's 'Running Terminal-Bench' page "
        "(harborframework.com/docs/running-tbench) says an install is correct when "
        "`harbor run -d terminal-bench@2.0 -a oracle` runs, and publishes no pass rate",
    },
    "terminal-bench-1": {
        "share": None,
        "note": "none found in Terminal-Bench's released docs or source",
    },
    "termigen": {"share": None, "note": "none: the set ships no solutions"},
}


def entries_by_commit(entries: list[dict[str, Any]]) -> dict[str, int]:
    """How many of the reported tasks each code commit checked (`code_commit` of the line; a
    line from before that field was written counts as "not recorded")."""
    out: dict[str, int] = {}
    for e in entries:
        key = e.get("code_commit") or "not recorded"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def stand_ins_of(
    args: argparse.Namespace, bases: list[str], image_map: dict[str, str]
) -> dict[str, Any]:
    """The stand-in images the lines ran on: with `--report-only`, those the document it
    rebuilds recorded (this engine's images may be gone or rebuilt since); on a run, this
    engine's, and the recorded one where this engine has none."""
    earlier: dict[str, Any] = dict(getattr(args, "earlier_stand_ins", None) or {})
    if args.report_only or args.backend != "docker":
        return {b: earlier.get(b) for b in sorted(set(bases))} if earlier else {}
    now = _stand_ins(bases, image_map)
    return {b: now[b] if now[b] is not None else earlier.get(b) for b in now}


def build_document(
    args: argparse.Namespace,
    plans: list[list[Item]],
    entries: list[dict[str, Any]],
    image_map: dict[str, str],
    wall_s: float | None,
    pruned: int = 0,
) -> dict[str, Any]:
    from lab.bench.substitutions import REACHABLE_HOSTS, SUBSTITUTIONS

    datasets = [dataset_doc(args, i, items, entries) for i, items in enumerate(plans)]
    all_entries = [e for d in datasets for e in d["tasks"]]
    selected = sum(d["tasks_selected"] for d in datasets)
    bases = [b for d in datasets for b in d["base_images"] if b != "?"]
    return {
        "bench": "harbor_compat",
        "complete": len(all_entries) == selected,
        "tasks_selected": selected,
        "tasks_run": len(all_entries),
        "backend": args.backend,
        "image_map": image_map,
        "stand_in_images": stand_ins_of(args, bases, image_map),
        "substitute": bool(args.substitute),
        "substitution_table": SUBSTITUTIONS if args.substitute else {},
        "reachable_hosts": list(REACHABLE_HOSTS),
        "concurrency": args.concurrency,
        "task_timeout_s": args.task_timeout_s,
        "wall_s": round(wall_s, 1) if wall_s is not None else None,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "summary": summarize(all_entries),
        "reasons": group_reasons(all_entries),
        "reason_meanings": REASONS,
        "category_meanings": CATEGORIES,
        "pruned_images": pruned,
        "entries_by_commit": entries_by_commit(all_entries),
        "earlier_provenance": list(getattr(args, "earlier_provenance", None) or []),
        "datasets": datasets,
        "datasets_unavailable": [
            {"name": n, "why": w}
            for n, _, w in (x.partition("=") for x in args.unavailable_dataset)
        ],
    }


def _prepare(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[list[Item]]]:
    """The entries a resumed run already has, and the selected tasks of every dataset."""

    jsonl: Path | None = args.jsonl
    earlier = read_jsonl(jsonl) if (args.resume or args.report_only) else []
    if args.resume:
        # a task whose check failed only in the sandbox layer (engine restarted, bridge gone)
        # says nothing about the task: run it again
        earlier, again = drop_infra_only(earlier)
        if again:
            log.info(
                "resuming: %d task(s) whose every line failed only in the engine run again",
                len(again),
            )
        rerun = set(args.rerun)
        if rerun:
            earlier = [
                e
                for e in earlier
                if e.get("task_id") not in rerun
                and f"{e.get('dataset')}/{e.get('task_id')}" not in rerun
            ]
    # the document a resumed run continues: its provenance (and that of the runs before it)
    # is carried into the new one, so every run that wrote a task's line stays named
    args.earlier_provenance = []
    if (args.resume or args.report_only) and args.out is not None and Path(args.out).exists():
        try:
            prev = json.loads(Path(args.out).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            prev = {}
        args.earlier_stand_ins = prev.get("stand_in_images") or {}
        chain = list(prev.get("earlier_provenance") or [])
        if prev.get("provenance") and prev["provenance"] not in chain:
            chain.append(prev["provenance"])
        args.earlier_provenance = chain
    if jsonl is not None and not (args.resume or args.report_only) and jsonl.exists():
        jsonl.unlink()  # a fresh run starts a fresh file
    plans = [plan_dataset(args, i, load=not args.report_only) for i in range(len(args.tasks_dir))]
    return earlier, plans


class StandInsNotBuiltError(RuntimeError):
    """Tasks to run are based on public images whose local stand-in is not in the engine: run
    now, each would be recorded as needing the image's registry, which it does not."""


def missing_stand_ins(bases: list[str | None], present: Callable[[str], bool]) -> list[str]:
    """The base images among `bases` that `sandgym images` makes a stand-in for (an alias of a
    stand-in) and that the engine lacks (`present(name)` is False), sorted."""
    from lab.images import standin_for

    wanted = sorted({b for b in bases if b and standin_for(b) is not None})
    return [b for b in wanted if not present(b)]


def _engine_has(name: str) -> bool:
    r = subprocess.run(["docker", "image", "inspect", name], capture_output=True, check=False)
    return r.returncode == 0


async def run_compat(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected task of every dataset, interleaved, on one backend; streamed to --jsonl,
    resumable; one document over all of them with a part per dataset."""

    image_map = parse_image_map(args.image_map)
    jsonl: Path | None = args.jsonl
    earlier, plans = await asyncio.to_thread(_prepare, args)
    if args.report_only:
        return build_document(args, plans, earlier, image_map, None)

    done = {(e.get("dataset"), e.get("task_id")) for e in earlier}
    todo = [it for it in interleave(plans) if (it.dataset, it.task_id) not in done]
    again = set(args.rerun)
    if again:  # the tasks named again (after a fix) run before those not yet run
        todo.sort(key=lambda it: not ({it.task_id, f"{it.dataset}/{it.task_id}"} & again))
    if done:
        log.info("resuming: %d task(s) already in %s; %d to run", len(done), jsonl, len(todo))
    if args.backend == "docker":
        bases = [
            image_map.get(b or "", b) for b in (_base_image(it.task) for it in todo if it.task)
        ]
        missing = await asyncio.to_thread(missing_stand_ins, bases, _engine_has)
        if missing:
            raise StandInsNotBuiltError(
                f"the stand-ins of {missing} are not in the engine (expected after `sandgym "
                "images build`; found absent): run that first, or every task on them would "
                "be recorded as needing their registry"
            )
    before = await asyncio.to_thread(_existing_ctx_tags) if args.prune_images else set()
    backend = get_backend(args.backend)
    dns: DnsLog | None = None
    if args.dns_log:
        backend, dns = await _start_dns_log(args, backend)
    sink = JsonlSink(None, jsonl) if jsonl is not None else None
    finished: list[dict[str, Any]] = list(earlier)
    pruned = 0
    start = time.perf_counter()
    sem = asyncio.Semaphore(max(1, args.concurrency))
    gate = BuildGate() if args.prune_images else None
    engine_root = await asyncio.to_thread(_engine_root, args.backend)
    from lab.bench.report import provenance

    prov = provenance()
    run_commit = (prov["git_commit"] or "unknown") + ("-dirty" if prov["git_dirty"] else "")

    def record(entry: dict[str, Any]) -> None:
        finished.append(entry)
        if sink is not None:
            sink.write(entry)
        if args.out is not None:  # a partial document after every task
            doc = build_document(args, plans, finished, image_map, time.perf_counter() - start)
            save_json(doc, args.out, indent=1)

    async def one(it: Item) -> None:
        nonlocal pruned
        if it.task is None:  # the loader's verdict, by this code: its commit on the line too
            e = load_error_entry(it)
            e["code_commit"] = run_commit
            e["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            record(e)
            return
        async with sem:
            limit = task_limit_s(it.task, args.task_timeout_s)
            more: dict[str, Any] = {"dns": dns} if dns is not None else {}
            if gate is not None:
                more["gate"] = gate
            if engine_root is not None:
                more["engine_root"] = engine_root
            e = await _check_one(it.task, backend, image_map, limit, args.infra_retries, it, **more)
            if gate is not None:
                tag = _ctx_tag(it.task, image_map)
                if tag and tag not in before:
                    async with gate.removal():  # never under a build that may share its steps
                        rc = await asyncio.to_thread(
                            subprocess.run,
                            ["docker", "image", "rm", "-f", tag],
                            capture_output=True,
                            check=False,
                        )
                    pruned += rc.returncode == 0
        log.info(
            "[%d/%d] %s/%s: build=%s oracle=%s noop=%s reasons=%s subst=%s (%.0f s)",
            len(finished) + 1 - len(earlier),
            len(todo),
            it.dataset,
            it.task_id,
            e["env_builds"],
            e["oracle_reward"],
            e["noop_reward"],
            e["reasons"],
            [s["name"] for s in e.get("substitutions") or []],
            e["duration_s"],
        )
        e["code_commit"] = run_commit
        e["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # a --rerun may use another limit or load than the run it continues
        e["task_timeout_s"], e["concurrency"] = limit, args.concurrency
        record(e)

    try:
        await asyncio.gather(*(one(it) for it in todo))
    finally:
        if sink is not None:
            sink.close()
        if dns is not None:
            await dns.__aexit__(None, None, None)
        await backend.aclose()
    return build_document(
        args, plans, finished, image_map, time.perf_counter() - start, pruned=pruned
    )


class DnsLogUnsupportedError(ValueError):
    """--dns-log asked for where its lookups could not be told apart by phase (more than one
    task at once) or given to the sandboxes (a backend other than docker)."""


def _engine_root(backend: str) -> Path | None:
    """The docker engine's data root (`docker info`'s DockerRootDir); None for another backend
    or where the engine does not say or does not answer."""
    if backend != "docker":
        return None
    # lazy: the docker backend package (29 modules): +0.05 s CPU at every `sandgym` start (measured)
    from sandgym.sandboxes.docker.engine_info import local_engine_info

    try:
        return local_engine_info(timeout_s=60).root
    except Exception:  # no engine or no SDK: the line records no engine disk
        return None


async def _start_dns_log(args: argparse.Namespace, backend: Any) -> tuple[Any, DnsLog]:
    """The logging DNS forwarder on the engine's bridge gateway, and the backend that hands it
    to every sandbox (lab/bench/dns_log.py)."""
    from lab.bench.dns_log import DnsLoggedBackend, bridge_gateway, host_resolver
    from lab.bench.dns_sniff import BridgeSniffer

    if args.backend != "docker" or args.concurrency != 1:
        await backend.aclose()
        raise DnsLogUnsupportedError(
            "--dns-log: expected --backend docker and --concurrency 1 (the lookups are told "
            f"apart by phase), found --backend {args.backend} --concurrency {args.concurrency}"
        )
    gateway = await asyncio.to_thread(bridge_gateway)
    dns = await DnsLog(gateway, host_resolver()).__aenter__()
    sniffer = BridgeSniffer(dns).__enter__()  # the builds' and compose services' lookups
    dns.sources.append(sniffer)
    return DnsLoggedBackend(backend, gateway), dns


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for d in args.tasks_dir:
        if not d.is_dir():
            print(f"sandgym bench harbor_compat: no directory at {d}", file=sys.stderr)
            return 2
    if (args.resume or args.report_only) and args.jsonl is None:
        print("sandgym bench harbor_compat: --resume/--report-only need --jsonl", file=sys.stderr)
        return 2
    try:
        doc = asyncio.run(run_compat(args))
    except (ValueError, StandInsNotBuiltError) as exc:  # a malformed --image-map, ...
        print(f"sandgym bench harbor_compat: {exc}", file=sys.stderr)
        return 2
    text = save_json(doc, args.out, indent=1)
    if args.json:
        print(text)
    else:
        for d in doc["datasets"]:
            s = d["summary"]
            a, r = s["absolute_clean"], s["reachable"]["clean"]
            pub = d["published_oracle"]["share"]
            print(
                f"{d['name']}: {d['tasks_run']} of {d['tasks_selected']} run; clean "
                f"{a['count']}/{a['of']} (published oracle pass rate: "
                f"{'none found' if pub is None else pub}); clean of reachable "
                f"{r['count']}/{r['of']}; " + ", ".join(f"{k} {v}" for k, v in s["table"].items())
            )
            for row in s["shortfalls"]:
                print(f"  {row['task_id']}: {row['category']}: {row['action']}")
        for reason, g in doc["reasons"].items():
            print(f"  {reason}: {g['count']}")
    return 0
