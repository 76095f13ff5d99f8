"""Issue 58 item 1, the image's ENTRYPOINT on docker: a sandbox whose image declares one runs it
as Harbor does (`ENTRYPOINT + ["sh", "-c", "sleep infinity"]`), started once by the container's
pid 1 (sandgym's deadline keeper, `exec_kill.HELPER_SCRIPT`), which stays pid 1.

One task (tests/fixtures/image-entrypoint-task), whose image's entrypoint writes a marker and its
arguments, starts a background service (a `sleep 1001` whose pid it writes) and `exec "$@"`s.
After creation the marker is there, with the image's environment and working directory, the
service runs as pid 1's descendant, and at the deadline the container ends with the service gone
too (its host pid no longer runs it). An entrypoint that exits at once makes creation fail by
name (Harbor's container would have exited). A snapshot's sandbox runs it again under one keeper;
an image without bash runs it under its `sh` pid 1. Through `sandgym tasks check` the task's
oracle scores 1 (its verifier pays only when the entrypoint's service runs) and a no-op 0, and
so does the compose task below (its verifier pays only when its main command ran).

A task whose compose file sets the main service's `command:` (tests/fixtures/compose-command-task,
an image without ENTRYPOINT) has that command started once by pid 1, as its child: its marker is
there after creation, and pid 1 is still sandgym's keeper; one that exits at once fails creation
by name; a compose `entrypoint:` replaces the image's and gets Harbor's command.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandgym.sandboxes import SandboxSpec
from sandgym.sandboxes.docker.service_life import STATIC_BASH_IN, usable_static_bash
from sandgym.sandboxes.errors import SandboxCreateError
from sandgym.sandboxes.lifetime import set_first_lifetime
from sandgym.tasks import load_task_dir
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from tests.e2e.conftest import docker_image_available
from tests.waiting import wait_until, wait_until_in_thread

IMAGE = "sandgym/terminal:latest"

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_image_available(), reason=f"image {IMAGE} not built"),
]

#: seconds from creation to the deadline (room to create and look), and the bound past it
LIFE_S = 10.0
BOUND_S = 10.0

#: a Harbor task whose image's ENTRYPOINT (environment/entrypoint.sh) writes a marker and its
#: arguments, starts a service (`sleep 1001`, its pid in /tmp/service.pid) and `exec "$@"`s; it
#: fails its set-up when the sandbox's environment sets BREAK_ENTRYPOINT (one image for all)
TASK = Path(__file__).parents[1] / "fixtures" / "image-entrypoint-task"
ENTRYPOINT_SH = (TASK / "environment" / "entrypoint.sh").read_text()

#: a Harbor task whose environment/docker-compose.yaml sets the main service's `command` (a marker,
#: then `exec sleep infinity`); its image has no ENTRYPOINT, so the command alone is what runs;
#: its verifier pays only when the marker is there
COMPOSE_TASK = Path(__file__).parents[1] / "fixtures" / "compose-command-task"


@pytest.fixture
async def backend() -> AsyncIterator[object]:
    from sandgym.sandboxes.docker import DockerBackend

    b = DockerBackend(owner_id="test-entry-" + uuid.uuid4().hex[:6])
    try:
        yield b
    finally:
        set_first_lifetime(None)
        await b.reap(only_expired=False)
        await b.aclose()


@pytest.fixture(scope="module")
def context() -> Path:
    return TASK / "environment"


def _running(cid: str) -> bool:
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", cid],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return out.returncode == 0 and out.stdout.strip() == "true"


def _host_pid_of(cid: str, args: str) -> int:
    top = subprocess.run(
        ["docker", "top", cid, "-eo", "pid,args"], capture_output=True, text=True, timeout=30
    ).stdout.splitlines()
    pids = [int(line.split()[0]) for line in top[1:] if line.split(None, 1)[1].strip() == args]
    assert len(pids) == 1, top
    return pids[0]


def _host_runs(pid: int, args: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.replace(b"\0", b" ").strip() == args.encode()


async def test_image_entrypoint_runs_under_pid1_and_ends_by_the_deadline(
    backend: object, context: Path
) -> None:
    spec = SandboxSpec(build_context=context, own_workdir=False, pids_limit=64)
    set_first_lifetime(LIFE_S)
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    set_first_lifetime(None)
    assert sb.deadline is not None

    # set-up ran, with the image's environment and working directory, given Harbor's command
    ran = await sb.exec("cat /tmp/entrypoint-ran /tmp/entrypoint-argv")
    assert ran.exit_code == 0, ran
    assert ran.stdout.splitlines() == ["/srv/work from-image", "sh -c sleep infinity"]

    # pid 1 is still sandgym's keeper; the service is its descendant, through the entrypoint
    # (exec'd into Harbor's `sh -c 'sleep infinity'`, its signals at their defaults: none ignored)
    tree = await sb.exec(
        "s=$(cat /tmp/service.pid); e=$(awk '/^PPid/ {print $2}' /proc/$s/status); "
        "tr '\\0' ' ' < /proc/$s/cmdline; echo; tr '\\0' ' ' < /proc/$e/cmdline; echo; "
        "awk '/^PPid/ {print $2}' /proc/$e/status; awk '/^SigIgn/ {print $2}' /proc/$e/status; "
        "tr '\\0' '\\n' < /proc/1/cmdline | head -1"
    )
    assert tree.exit_code == 0, tree
    assert tree.stdout.splitlines() == [
        "sleep 1001 ",
        "sh -c sleep infinity ",
        "1",
        "0000000000000000",
        "bash",
    ], tree.stdout

    # at the deadline the container ends, and the entrypoint's service with it
    service = _host_pid_of(sb.container_id, "sleep 1001")
    assert _host_runs(service, "sleep 1001")
    await wait_until_in_thread(
        lambda: not _running(sb.container_id),
        LIFE_S + BOUND_S,
        0.25,
        "the sandbox gone by its deadline",
    )
    assert not _host_runs(service, "sleep 1001")
    await sb.close()


async def test_an_entrypoint_that_exits_at_once_fails_creation_by_name(
    backend: object, context: Path
) -> None:
    spec = SandboxSpec(build_context=context, env={"BREAK_ENTRYPOINT": "1"})
    with pytest.raises(
        SandboxCreateError, match=r"ENTRYPOINT.*exited with status 3.*missing config"
    ):
        await backend.create(spec)  # type: ignore[attr-defined]


#: how many processes run sandgym's keeper (pid 1's `$0`, `sandgym-keeper`; the pattern is spelt so
#: that this command's own text does not match it), and how many the service
KEEPERS_AND_SERVICES = (
    "k=0; s=0; for c in /proc/[0-9]*/cmdline; do a=$(tr '\\0' ' ' < $c 2>/dev/null); "
    'case "$a" in *sandgym-kee[p]er*) k=$((k+1)) ;; "sleep 1001 ") s=$((s+1)) ;; esac; done; '
    'echo "$k $s"'
)


async def test_a_snapshot_of_such_a_sandbox_runs_the_entrypoint_again_under_one_keeper(
    backend: object, context: Path
) -> None:
    spec = SandboxSpec(build_context=context, own_workdir=False)
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    first = await sb.exec(KEEPERS_AND_SERVICES)
    assert first.stdout.split() == ["1", "1"], first
    snapshot = await sb.snapshot()
    await sb.close()
    # the snapshot's image config carries sandgym's own entrypoint; the image's is found in it
    again = await backend.create(spec.model_copy(update={"snapshot": snapshot}))  # type: ignore[attr-defined]
    counted = await again.exec(KEEPERS_AND_SERVICES)
    assert counted.stdout.split() == ["1", "1"], counted
    await again.close()
    await backend.remove_snapshot(snapshot)  # type: ignore[attr-defined]


async def test_an_image_without_bash_runs_its_entrypoint_under_the_sh_pid1(
    backend: object, tmp_path: Path
) -> None:
    """No bash and no deadline (so no static bash copied in): pid 1 is the image's sh running
    MAIN_BOOT, which starts the entrypoint first, as its background child; with a deadline and a
    static bash on the host, pid 1 is that bash running the keeper. The image (fixed
    content, so one per engine) is left for the next run's cache."""
    (tmp_path / "entrypoint.sh").write_text(ENTRYPOINT_SH)
    (tmp_path / "entrypoint.sh").chmod(0o755)
    (tmp_path / "Dockerfile").write_text(
        "FROM sandgym/base:bookworm\nRUN rm -f /bin/bash /usr/bin/bash\n"
        "COPY entrypoint.sh /usr/local/bin/entrypoint.sh\n"
        'ENTRYPOINT ["/bin/sh", "/usr/local/bin/entrypoint.sh"]\n'
    )
    spec = SandboxSpec(build_context=tmp_path, workdir="/")
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    try:
        look = await sb.exec(
            ["sh", "-c", "cat /tmp/entrypoint-argv; s=$(cat /tmp/service.pid); "
             "tr '\\0' ' ' < /proc/$s/cmdline; echo; tr '\\0' '\\n' < /proc/1/cmdline | head -1"]
        )  # fmt: skip
        assert look.stdout.splitlines() == ["sh -c sleep infinity", "sleep 1001 ", "/bin/sh"], look
    finally:
        await sb.close()
    # with a deadline, on a host with a static bash, pid 1 is that bash (copied in) running the
    # keeper, given the entrypoint too; on a host without one, the sh again
    static = usable_static_bash()
    set_first_lifetime(120.0)
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    set_first_lifetime(None)
    try:
        look = await sb.exec(
            ["sh", "-c", "cat /tmp/entrypoint-argv; s=$(cat /tmp/service.pid); "
             "tr '\\0' ' ' < /proc/$s/cmdline; echo; tr '\\0' '\\n' < /proc/1/cmdline | head -1"]
        )  # fmt: skip
        pid1 = STATIC_BASH_IN if static is not None else "/bin/sh"
        assert look.stdout.splitlines() == ["sh -c sleep infinity", "sleep 1001 ", pid1], look
    finally:
        await sb.close()


def test_the_task_scores_oracle_1_noop_0_through_tasks_check(tmp_path: Path) -> None:
    """`sandgym tasks check --backend docker` (real processes, as a user runs it): the verifier
    pays only when the entrypoint ran in the agent's sandbox and its service still runs; the
    compose task's only when its main command ran."""
    env = {**os.environ, "SANDGYM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "tasks", "check", str(TASK), str(COMPOSE_TASK)]
        + ["--backend", "docker", "--concurrency", "2", "--json"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.stdout.strip(), f"expected one JSON document on stdout, found none: {proc.stderr}"
    rows = json.loads(proc.stdout)["tasks"]
    scores = sorted((r["task_id"], r["oracle_reward"], r["noop_reward"], r["error"]) for r in rows)
    assert scores == [
        ("compose-command-task", 1.0, 0.0, None),
        ("image-entrypoint-task", 1.0, 0.0, None),
    ], proc.stderr[-3000:]


async def test_an_entrypoint_that_ends_later_is_logged_and_the_sandbox_goes_on(
    backend: object, context: Path
) -> None:
    sb = await backend.create(SandboxSpec(build_context=context, own_workdir=False))  # type: ignore[attr-defined]
    try:
        # the root agent kills the entrypoint (now Harbor's `sh -c 'sleep infinity'`, pid 1's child)
        kill = await sb.exec(
            "for p in /proc/[0-9]*; do [ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sh -c sleep infinity ' ]"
            " && kill -KILL ${p#/proc/}; done; true"
        )
        assert kill.exit_code == 0, kill

        async def status() -> str:
            r = await sb.exec("cat /run/sandgym-helper/entrypoint-exit 2>/dev/null")
            return r.stdout.strip()

        await wait_until(status, 30.0, 0.2, "pid 1 records the entrypoint's end")
        assert await status() == "137"
        # the sandbox goes on: pid 1 still the keeper, execs still run, the end is in its log
        alive = await sb.exec("tr '\\0' '\\n' < /proc/1/cmdline | head -1")
        assert alive.stdout.strip() == "bash", alive
        logs = await asyncio.to_thread(
            subprocess.run,
            ["docker", "logs", sb.container_id], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "the image ENTRYPOINT exited with status 137" in logs.stderr, logs
    finally:
        await sb.close()


async def test_a_compose_files_main_command_runs_as_pid1s_child(backend: object) -> None:
    spec = sandbox_spec_for(load_task_dir(COMPOSE_TASK))
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    try:
        look = await sb.exec(
            "ls /tmp/compose-command-ran; for p in /proc/[0-9]*; do "
            "[ \"$(tr '\\0' ' ' < $p/cmdline)\" = 'sleep infinity ' ] && "
            "awk '/^PPid/ {print $2}' $p/status; done; tr '\\0' '\\n' < /proc/1/cmdline | head -1"
        )
        # the marker; the command (exec'd into `sleep infinity`) is pid 1's child; pid 1 the keeper
        assert look.stdout.splitlines() == ["/tmp/compose-command-ran", "1", "bash"], look
    finally:
        await sb.close()


async def test_a_compose_main_command_that_exits_at_once_fails_creation_by_name(
    backend: object,
) -> None:
    spec = sandbox_spec_for(load_task_dir(COMPOSE_TASK)).model_copy(
        update={"main_command": ("sh", "-c", "echo no-such-config >&2; exit 4")}
    )
    with pytest.raises(SandboxCreateError, match=r"exit 4.*exited with status 4.*no-such-config"):
        await backend.create(spec)  # type: ignore[attr-defined]


async def test_a_compose_main_entrypoint_replaces_the_images_and_gets_harbors_command(
    backend: object, context: Path
) -> None:
    """The image-entrypoint task's image (its ENTRYPOINT writes /tmp/entrypoint-ran) under a
    compose `entrypoint:` on main and no `command:`: the compose one runs instead, given Harbor's
    `sh -c "sleep infinity"` (its base file's command, merged under the task's)."""
    ep = ("/bin/sh", "-c", 'echo "$@" > /tmp/compose-entrypoint-argv; exec "$@"', "ep")
    spec = SandboxSpec(build_context=context, own_workdir=False, main_entrypoint=ep)
    sb = await backend.create(spec)  # type: ignore[attr-defined]
    try:
        look = await sb.exec(
            "cat /tmp/compose-entrypoint-argv; ls /tmp/entrypoint-ran 2>&1 | grep -c 'No such'"
        )
        assert look.stdout.splitlines() == ["sh -c sleep infinity", "1"], look
    finally:
        await sb.close()
