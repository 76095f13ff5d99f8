"""Unit tests of `lab/bench/harbor_compat.py`: failure classification, verdicts, the summary, and a
whole run on the null backend over the Harbor fixtures (no Docker)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from lab.bench import harbor_compat as hc
from sandgym.sandboxes.errors import SandboxCreateError
from sandgym.tasks.check import CheckError
from sandgym.tasks.errors import TaskUnsupportedError, VerifierError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def legacy(text: str) -> str:
    """The reason of one error of a line written before `phase_errors` existed (its joined
    `error` text only): the legacy path."""
    [err] = hc.phase_errors_of({"error": text})
    assert err.cause is None
    return hc.classify_phase_error(err)


def test_build_errors_are_grouped_by_cause() -> None:
    assert (
        hc.classify_build_error("pull access denied for foo/bar, repository does not exist")
        == "base_image_unavailable"
    )
    assert (
        hc.classify_build_error("E: Unable to locate package libfoo-dev")
        == "build_apt_package_missing"
    )
    assert (
        hc.classify_build_error("ERROR: No matching distribution found for scipy==9.9")
        == "build_pip_unresolvable"
    )
    # pip that never reached the index is a network failure, not an unresolvable pin
    assert (
        hc.classify_build_error(
            "Failed to establish a new connection ... No matching distribution found for x"
        )
        == "build_network"
    )
    assert hc.classify_build_error("wget: unable to resolve host address 'github.com'") == (
        "build_network"
    )
    quiet = (
        "The command '/bin/sh -c wget -q https://github.com/a/b/archive/v2.tar.gz -O /tmp/x' "
        "returned a non-zero code: 4"
    )
    assert hc.classify_build_error(quiet) == "build_network"
    assert (
        legacy(
            "noop: VerifierError: the verifier wrote no reward\ncause: Because the current "
            "Python version (3.11.2) does not satisfy Python>=3.12"
        )
        == "verifier_tool_missing"
    )
    assert hc.classify_build_error("returned a non-zero code: 2 (make: *** Error 1)") == (
        "build_other"
    )
    # a FROM image neither in the engine nor stood in for, and no registry to pull it from
    no_registry = (
        'building Dockerfile failed: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
        "registry-1.docker.io on 10.255.255.53:53: no such host\n--- build log tail ---\n"
        "Step 1/8 : FROM python:3.10-slim-bookworm"
    )
    assert hc.classify_build_error(no_registry) == "base_image_unavailable"
    # a pinned apt version the stand-in's release does not have
    pinned = (
        "Package texlive-latex-base is not available, but is referred to by another package.\n"
        "\x1b[91mE: Version '2023.20240207-1' for 'texlive-latex-base' was not found\n"
    )
    assert hc.classify_build_error(pinned) == "build_apt_package_missing"


def test_legacy_lines_split_and_classify_by_their_text() -> None:
    """LEGACY: a line from before `phase_errors` (only the joined `error`) is split back and
    read by its messages, as the code of its day read it."""
    err = (
        "oracle: TaskUnsupportedError: task x ships no oracle solution; "
        "noop: VerifierError: the verifier wrote no reward: expected ...\n"
        "--- verifier output ---\nbash: pytest: command not found"
    )
    parts = hc.split_phase_errors(err)
    assert [p.split(":")[0] for p in parts] == ["oracle", "noop"]
    assert [hc.classify_phase_error(e) for e in hc.phase_errors_of({"error": err})] == [
        "oracle_not_shipped",
        "verifier_tool_missing",
    ]
    assert legacy("noop: VerifierError: the verifier wrote no reward: expected x") == (
        "verifier_no_reward"
    )
    assert legacy("noop: VerifierError: task t: the verifier did not finish within 5 s") == (
        "verifier_timeout"
    )
    assert (
        legacy(
            "noop: VerifierError: the verifier wrote no reward\ncurl: (6) Could not resolve host"
        )
        == "verifier_network"
    )
    assert legacy("noop: ConnectionError: ('Connection aborted.')") == "infra"
    # typed `phase_errors` without a cause (written before it existed) read the same way
    [typed] = hc.phase_errors_of(
        {
            "phase_errors": [
                {
                    "phase": "noop",
                    "error_type": "VerifierError",
                    "message": "[timeout] task t: the verifier did not finish within 5 s",
                }
            ]
        }
    )
    assert typed.cause is None and hc.classify_phase_error(typed) == "verifier_timeout"


def test_typed_errors_classify_by_their_cause_not_their_message() -> None:
    """The cause an error carries, set where it was raised, decides; message text is read only
    for what an outside tool printed (the verifier's output, docker build's)."""

    def of(exc: BaseException, phase: str = "noop") -> str:
        err = CheckError.of(phase, exc)
        assert err.error_type == type(exc).__name__ and err.message == str(exc)
        return hc.classify_phase_error(err)

    # a raise site's cause: the message says nothing the old text rules knew
    assert of(VerifierError("no clock left", cause="timeout")) == "verifier_timeout"
    assert of(VerifierError("the test script exited 2", cause="no_reward")) == (
        "verifier_no_reward"
    )
    # ... and a message that would have fooled them does not
    assert of(VerifierError("did not finish within; wrote no reward", cause="bad_reward")) == (
        "verifier_other"
    )
    assert of(TaskUnsupportedError("x", cause="no_oracle"), "oracle") == "oracle_not_shipped"
    assert of(TaskUnsupportedError("ships no oracle solution"), "oracle") == "task_unsupported"
    assert of(SandboxCreateError("E: Unable to locate package x", cause="build")) == (
        "build_apt_package_missing"
    )
    assert of(SandboxCreateError("building nothing: the engine refused")) == "infra"
    # the verifier's own output (outside text) still says what the cause cannot
    out = VerifierError("no reward", "curl: (6) Could not resolve host: x.org", cause="no_reward")
    assert of(out) == "verifier_network"
    assert of(VerifierError("no reward", "bash: uvx: command not found", cause="no_reward")) == (
        "verifier_tool_missing"
    )


def test_verdict_and_summary() -> None:
    clean = {
        "task_id": "a",
        "oracle_shipped": True,
        "env_builds": True,
        "oracle_reward": 1.0,
        "noop_reward": 0.0,
        "error": None,
    }
    no_oracle = {
        "task_id": "b",
        "oracle_shipped": False,
        "env_builds": True,
        "oracle_reward": None,
        "noop_reward": 1.0,
        "error": "oracle: TaskUnsupportedError: task b ships no oracle solution",
    }
    broken = {
        "task_id": "c",
        "oracle_shipped": False,
        "env_builds": False,
        "build_error": "E: Unable to locate package x",
        "build_reason": "build_apt_package_missing",
    }
    entries = [clean, no_oracle, broken, {"task_id": "d", "load_error": "TaskLoadError: x"}]
    for e in entries:
        e["reasons"] = hc.verdict(e)
    assert clean["reasons"] == []
    assert no_oracle["reasons"] == ["oracle_not_shipped", "noop_nonzero"]
    assert broken["reasons"] == ["build_apt_package_missing"]
    s = hc.summarize(entries)
    assert s["loaded"]["count"] == 3 and s["env_builds"]["count"] == 2
    assert s["verifier_rewards"]["count"] == 2
    assert s["noop_zero"]["count"] == 1
    assert s["oracle_one"] == {"count": 1, "of": 1, "share": 1.0}
    groups = hc.group_reasons(entries)
    assert groups["loader_error"]["tasks"] == ["d"]
    assert set(groups) == {
        "oracle_not_shipped",
        "noop_nonzero",
        "build_apt_package_missing",
        "loader_error",
    }


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    return parser.parse_args([*argv, "--backend", "null", "--infra-retries", "0"])


async def test_whole_run_on_null_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDGYM_FIXTURE_API_KEY", raising=False)
    root = tmp_path / "ds"
    root.mkdir()
    shutil.copytree(FIXTURES / "harbor-legacy", root / "harbor-legacy")
    (root / "not-a-task").mkdir()
    (root / "not-a-task" / "README").write_text("x")
    other = tmp_path / "ds2"
    shutil.copytree(FIXTURES / "harbor-compat", other)
    args = _args(
        "--tasks-dir",
        str(root),
        "--source-repo",
        "o/r",
        "--source-commit",
        "abc",
        "--tasks-dir",
        str(other),
        "--source-repo",
        "o/r2",
    )
    doc = await hc.run_compat(args)
    first, second = doc["datasets"]
    assert first["source"]["repo"] == "o/r" and first["source"]["commit"] == "abc"
    assert second["source"]["repo"] == "o/r2" and second["source"]["commit"] is None
    by_id = {e["task_id"]: e for e in first["tasks"]}
    assert by_id["not-a-task"]["reasons"] == ["loader_error"]
    # a loader's verdict is this code's too: the line names the commit that made it
    assert by_id["not-a-task"]["code_commit"] == by_id["harbor-legacy"]["code_commit"] != ""
    t = by_id["harbor-legacy"]
    assert t["oracle_shipped"] is True and t["env_builds"] is True
    assert t["reasons"] == hc.verdict(t)
    assert first["summary"]["tasks"] == 2 and first["summary"]["loaded"]["count"] == 1
    # the multi-step fixture is a loader error; the env-template one needs its host variable
    by_id2 = {e["task_id"]: e for e in second["tasks"]}
    multi = by_id2["harbor-multistep"]  # a loader error where multi-step tasks do not load
    assert multi["reasons"] == hc.verdict(multi)
    if multi.get("load_error"):
        assert "multi-step" in multi["load_error"]
    assert by_id2["harbor-env-template"]["reasons"] == ["task_unsupported"]
    assert doc["summary"]["tasks"] == 2 + len(list(other.iterdir()))
    assert doc["reasons"]["loader_error"]["count"] == 1 + bool(multi.get("load_error"))


def test_a_run_refuses_to_start_while_a_stand_in_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an engine whose stand-ins are gone (a fresh engine before `sandgym images build`),
    every Terminal-Bench task would build against ghcr.io and be recorded as needing it: the
    run stops before any task, naming the images, and writes no line."""
    assert hc.missing_stand_ins(
        ["ghcr.io/laude-institute/t-bench/python-3-13:20250620", "debian:bookworm", None, "x:1"],
        lambda name: name == "debian:bookworm",
    ) == ["ghcr.io/laude-institute/t-bench/python-3-13:20250620"]  # x:1 has no stand-in
    # Terminal-Bench 2.0's qemu tasks build FROM debian:bullseye-slim, which has one (Debian 11)
    assert hc.missing_stand_ins(["debian:bullseye-slim"], lambda name: False) == [
        "debian:bullseye-slim"
    ]
    root = tmp_path / "ds"
    (root / "t1").mkdir(parents=True)
    (root / "t1" / "Dockerfile").write_text(
        "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\n"
    )
    (root / "t1" / "task.yaml").write_text("instruction: do it\n")
    (root / "t1" / "run-tests.sh").write_text("#!/bin/bash\n")
    monkeypatch.setattr(hc, "_engine_has", lambda name: False)
    jsonl = tmp_path / "out.jsonl"
    parser = argparse.ArgumentParser()
    hc.add_arguments(parser)
    args = parser.parse_args(["--tasks-dir", str(root), "--jsonl", str(jsonl)])
    assert hc.run(args) == 2
    assert not jsonl.exists() or jsonl.read_text() == ""
    monkeypatch.setattr(hc, "_engine_has", lambda name: True)  # built: the check passes
    assert hc.missing_stand_ins([hc._base_image(hc._load(root / "t1")[0])], hc._engine_has) == []


def test_a_copy_from_image_the_builder_could_not_pull_is_the_evidence_not_the_base() -> None:
    """Terminal-Bench 1's conda-env-conflict-resolution builds FROM a base that has a local
    stand-in, then `COPY --from=continuumio/miniconda3:25.1.1-2` (Docker Hub)."""
    from lab.bench.compat_outcome import base_image_evidence

    line = (
        "SandboxCreateError: building /t/client/Dockerfile failed: invalid from flag value "
        'continuumio/miniconda3:25.1.1-2: Get "https://registry-1.docker.io/v2/": dial tcp: '
        "lookup registry-1.docker.io on 10.255.255.53:53: no such host"
    )
    entry = {
        "base_image": "ghcr.io/laude-institute/t-bench/python-3-13:20250620",
        "build_error": line,
    }
    ev = base_image_evidence(entry, "base_image_unavailable")
    assert ev is not None and ev.needs.startswith(
        "registry-1.docker.io (the image continuumio/miniconda3:25.1.1-2 of a COPY --from"
    )
    # a FROM image the engine lacks is still named as the base image
    from_line = "pull access denied for python, repository does not exist"
    ev = base_image_evidence(
        {"base_image": "python:3.10-slim", "build_error": from_line}, "base_image_unavailable"
    )
    assert ev is not None and "the base image python:3.10-slim" in ev.needs


#: the two space failures this machine's runs met: pip's in a build, uv's in a verifier
PIP_NO_SPACE = (
    "Installing collected packages: nvidia-cusparselt-cu13, mpmath, torch, torchvision\n"
    "\x1b[91mERROR: Could not install packages due to an OSError: [Errno 28] No space left on "
    "device\n\x1b[0m\nRemoving intermediate container 1867a44bd34e\n"
)
UV_NO_SPACE = (
    "  × Failed to download `nvidia-nccl-cu12==2.26.2`\n  ╰─▶ failed to write to file\n"
    "      `/root/.cache/uv/.tmphtFBhZ/nvidia/nccl/lib/libnccl.so.2`: No space left\n"
    "      on device (os error 28)\n"
)


def test_a_full_disk_is_its_own_reason_and_never_a_clean_verdict() -> None:
    from lab.bench.compat_outcome import build_error_line

    text = "SandboxCreateError: building ctx/Dockerfile failed: ...\n" + PIP_NO_SPACE
    assert hc.classify_build_error(text) == "disk_full"
    built = {
        "task_id": "b",
        "oracle_shipped": False,
        "env_builds": False,
        "build_error": text,
        "build_reason": hc.classify_build_error(text),
    }
    reasons, outcome = hc.judge(built)
    assert (outcome.category, outcome.reason) == ("failing", "disk_full")
    assert "No space left on device" in outcome.action and reasons == ["disk_full"]
    # another build failure names the error line, not the engine's last word
    other = {
        "build_error": "Step 3/3 : RUN make\nmake: *** [all] Error 2\nmake: Leaving directory "
        "'/src'\nRemoving intermediate container 1867a44bd34e\n"
    }
    assert build_error_line(other) == "make: *** [all] Error 2"
    # a no-op scored 0.0 by a test script that writes 0 when its runner fails for want of
    # space was never judged: not clean
    verifier = {
        "task_id": "v",
        "oracle_shipped": True,
        "env_builds": True,
        "oracle_reward": 1.0,
        "noop_reward": 0.0,
        "noop_verifier_output": UV_NO_SPACE,
        "error": None,
    }
    reasons, outcome = hc.judge(verifier)
    assert reasons == ["disk_full"] and outcome.category == "failing"
    assert hc.judge({**verifier, "noop_verifier_output": "1 failed"})[1].category == "clean"
