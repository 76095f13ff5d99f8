"""The docker backend's private verifier (`DockerSandbox.exec_private`) against the real engine:
a sibling container from a snapshot of the sandbox, sharing its network and process namespaces
but out of reach of the agent's processes, and removed with its snapshot image whatever happens
(done, timed out, cancelled, server killed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandgym.sandboxes.common.users import as_user_argv
from sandgym.sandboxes.docker import LABEL_VERIFIER_OF, DockerBackend, DockerSandbox
from sandgym.sandboxes.private_exec import OWN_CONTAINER_ENV
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks import private_verify
from tests.reliability.conftest import IMAGE, docker_ready
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(not docker_ready(), reason=f"no Docker engine or no {IMAGE}"),
]

REPO = Path(__file__).resolve().parents[2]
SPEC = SandboxSpec(image=IMAGE, workdir="/app", cpus=1, memory_mb=256, pids_limit=128)


@pytest.fixture
async def sandbox() -> AsyncIterator[DockerSandbox]:
    b = DockerBackend(owner_id="test-pv-" + os.urandom(4).hex())
    sb = await b.create(SPEC)
    try:
        yield sb
    finally:
        await sb.close()
        await b.reap(only_expired=False)
        await b.aclose()


def leftovers(sandbox_id: str) -> tuple[list[str], list[str]]:
    """(containers, images) a verifier of `sandbox_id` left, by its label."""

    def ids(*args: str) -> list[str]:
        cmd = ["docker", *args, "-q", "--filter", f"label={LABEL_VERIFIER_OF}={sandbox_id}"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()

    return ids("ps", "-a"), ids("images")


def _payload(tmp_path: Path, test_sh: str) -> tuple[str, bytes]:
    """(nonce, stdin) for the private verifier: /tests/test.sh and the secret `s` = hush."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(test_sh)
    nonce = private_verify.new_nonce()
    return nonce, private_verify.build_payload(nonce, tests, {"secret/s": (b"hush", 0o600)})


TEST_SH = """#!/bin/bash
echo "file: $(cat /app/changed.txt)"
echo "service: $(python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8123/changed.txt", timeout=5).read().decode().strip())')"
echo "agent sleeper visible: $(ps -eo args | grep -c '^sleep 4242')"
echo "stdin file left: $(ls -d /.sandgym-verifier-stdin-* 2>/dev/null | wc -l)"
echo "secret: $(cat /tests/secret/s)"
echo "uid: $(id -u)"
echo 0.5 > /logs/verifier/reward.txt
"""


async def test_verifier_sees_the_agents_files_services_and_processes(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    # What an agent may leave: a changed file, a service on localhost, a sleeper, and a daemon
    # that keeps writing a forged reward file and a forged test script.
    await sandbox.exec(
        "echo agent-was-here > /app/changed.txt && mkdir -p /logs/verifier /tests && "
        "(cd /app && nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &) && "
        "(nohup sleep 4242 >/dev/null 2>&1 &) && "
        "(nohup setsid bash -c 'while :; do echo 1 > /logs/verifier/reward.txt; "
        'echo "echo 1 > /logs/verifier/reward.txt" > /tests/test.sh; sleep 0.01; done\' '
        ">/dev/null 2>&1 &) && sleep 0.5"
    )
    nonce, payload = _payload(tmp_path, TEST_SH)
    res = await sandbox.exec_private(
        private_verify.wrapper_argv(["bash", "/tests/test.sh"]),
        payload,
        timeout_s=60,
        cwd="/app",
    )
    assert res.exit_code == 0 and not res.timed_out, res
    assert "file: agent-was-here" in res.stdout
    assert "service: agent-was-here" in res.stdout  # the shared network namespace
    assert "agent sleeper visible: 1" in res.stdout  # the shared process namespace
    assert "stdin file left: 0" in res.stdout
    assert "secret: hush" in res.stdout and "uid: 0" in res.stdout
    report = private_verify.parse_report(res.stderr, nonce, res.stdout)
    assert report.files == {"reward.txt": "0.5\n"}, report
    assert leftovers(sandbox.id) == ([], [])
    # The tests and the secret never entered the agent's container; it still works.
    check = await sandbox.exec("ls /tests; cat /tests/test.sh; ls -d /.sandgym-verifier-* || true")
    assert "hush" not in check.stdout and "secret" not in check.stdout
    assert ".sandgym-verifier" not in check.stdout
    assert (await sandbox.exec("pgrep -c -f '^sleep 4242'")).stdout.strip() == "1"


#: an agent's daemon that, for every process outside its own mount namespace (the verifier's:
#: their /proc/PID/ns/mnt is unreadable to it, or another), writes down that it saw one and its
#: cgroup (/app/seen), then tries to read the tests' secret through its /proc/PID/root, to write
#: a forged line on its stdout and stderr, and to read its memory map and environment; for
#: whatever it read it writes down whose it was (/app/read: pid, cgroup, command line, bytes),
#: beside the daemon's own cgroup (/app/own-cgroup: the sandbox container's)
PROC_PROBE = r"""
me=$(readlink /proc/self/ns/mnt)
own=$(tr '\n' ' ' < /proc/self/cgroup)
echo "$own" > /app/own-cgroup
while :; do
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$(readlink $d/ns/mnt 2>/dev/null)" = "$me" ] && continue
    [ -e $d ] || continue
    cg=$(tr '\n' ' ' < $d/cgroup 2>/dev/null)
    cmd=$(tr '\0\t\n' '   ' < $d/cmdline 2>/dev/null)
    printf '%s\t%s\n' "$p" "$cg" >> /app/seen
    cat $d/root/tests/secret/s >> /app/stolen 2>/dev/null
    echo FORGED > $d/fd/1 2>/dev/null; echo FORGED > $d/fd/2 2>/dev/null
    cat $d/maps $d/environ > /app/got 2>/dev/null
    if [ -s /app/got ]; then
      printf '%s\t%s\t%s\t%s\n' "$p" "$cg" "$cmd" "$(wc -c < /app/got)" >> /app/read
      cat /app/got >> /app/stolen
    fi
  done
  sleep 0.05
done
"""


async def test_agent_processes_see_the_verifier_but_cannot_reach_it(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    """The shared process namespace lets the agent's daemon find the verifier's processes;
    their files, descriptors and memory stay out of its reach (VERIFIER_EXTRA_CAP).

    What the daemon may read is a process of the sandbox's own: a `docker exec` of the sandbox
    while runc's init (`runc:[2:INIT]`, not dumpable: its ns/mnt unreadable, so taken for
    foreign) becomes the command (`bash -c ...`, dumpable again), seen under load with a
    diagnostic copy of this probe; a bash's maps without environment when that command ended
    between the two reads. So each read is checked by its owner's cgroup, not by its contents
    alone."""
    await sandbox.write_file("/app/probe.sh", PROC_PROBE.encode())
    await sandbox.exec(
        "touch /app/seen /app/read /app/stolen && "
        "(nohup setsid bash /app/probe.sh >/dev/null 2>&1 &)"
    )
    # runs until the daemon has seen it (so the probe had its chance), then a little more
    nonce, payload = _payload(
        tmp_path,
        "#!/bin/bash\nfor i in $(seq 200); do [ -s /proc/1/root/app/seen ] && break; "
        "sleep 0.05; done\nsleep 1\necho done-testing\n",
    )
    res = await sandbox.exec_private(
        private_verify.wrapper_argv(["bash", "/tests/test.sh"]), payload, timeout_s=60
    )
    assert res.exit_code == 0 and "done-testing" in res.stdout, res
    # read by copy, not by exec: no process of the sandbox starts meanwhile for the daemon to
    # read, nor a stdout for it to write FORGED on
    own = (await sandbox.read_file("/app/own-cgroup")).decode().strip()
    assert own, "the daemon did not write down its own cgroup"

    def records(text: str) -> list[list[str]]:
        return [line.split("\t") for line in text.splitlines() if line]

    seen = records((await sandbox.read_file("/app/seen")).decode(errors="replace"))
    assert any(r[1].strip() != own for r in seen if len(r) > 1), (
        f"the agent's daemon never saw a process outside its container (the verifier's): {seen}"
    )
    read = records((await sandbox.read_file("/app/read")).decode(errors="replace"))
    foreign = [r for r in read if len(r) != 4 or r[1].strip() != own]
    # (pid, cgroup's last line, command line, bytes read) of each: the verifier's, when its
    # capability is gone (the wrapper's sh, the tests' bash, their sleep)
    assert not foreign, (
        f"the daemon read processes outside the sandbox (its cgroup: {own.split()[-1]}): "
        + repr([(r[0], (r[1].split() or [""])[-1], *(x[:100] for x in r[2:])) for r in foreign])
    )
    stolen = (await sandbox.read_file("/app/stolen")).replace(b"\0", b"\n").decode(errors="replace")
    # nothing of the verifier's either by contents: its secret, its environment
    assert "hush" not in stolen and OWN_CONTAINER_ENV not in stolen, (read, stolen[:500])
    assert "FORGED" not in res.stdout + res.stderr
    assert private_verify.parse_report(res.stderr, nonce, res.stdout).exit_code == 0


async def test_a_verifier_that_may_not_see_processes_has_a_namespace_of_its_own(
    sandbox: DockerSandbox,
) -> None:
    """`see_processes=False` (tests that drop to another user): none of the agent's processes
    is visible, and the agent's see none of the verifier's."""
    await sandbox.exec("(nohup sleep 4243 >/dev/null 2>&1 &) && sleep 0.3")
    probe = "ps -eo args | grep -c '^sleep 424[3]'; ps -eo args | grep -c '^sleep 424[4]'"
    argv = ["sh", "-c", f"(sleep 4244 &); {probe}"]
    shared = await sandbox.exec_private(argv, b"", timeout_s=60)
    assert shared.stdout.split("\n")[:2] == ["1", "1"], shared
    own = await sandbox.exec_private(argv, b"", timeout_s=60, see_processes=False)
    assert own.stdout.split("\n")[:2] == ["0", "1"], own
    assert (await sandbox.exec("pgrep -c -f '^sleep 4244' || true")).stdout.strip() == "0"


async def test_a_timed_out_verifier_leaves_nothing(sandbox: DockerSandbox) -> None:
    res = await sandbox.exec_private(
        ["sh", "-c", "echo started; (sleep 300 &); sleep 300"], b"", timeout_s=1.5
    )
    assert res.timed_out and res.exit_code is None, res
    assert "started" in res.stdout
    assert leftovers(sandbox.id) == ([], [])
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"
    # none of its processes is left in the process namespace it shared with the sandbox
    assert (await sandbox.exec("pgrep -c -f '^sleep 300' || true")).stdout.strip() == "0"


async def test_a_cancelled_verifier_leaves_nothing(sandbox: DockerSandbox) -> None:
    task = asyncio.ensure_future(sandbox.exec_private(["sleep", "300"], b"", timeout_s=600))
    await wait_until(lambda: leftovers(sandbox.id)[0], 60, what="the verifier container")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert leftovers(sandbox.id) == ([], [])


async def test_a_failing_verifier_exit_code_and_output_come_back(sandbox: DockerSandbox) -> None:
    res = await sandbox.exec_private(
        ["sh", "-c", "cat; echo to-err >&2; exit 7"], b"from stdin\n", timeout_s=60
    )
    assert (res.exit_code, res.stdout, res.stderr) == (7, "from stdin\n", "to-err\n")
    assert leftovers(sandbox.id) == ([], [])


CHILD = """
import asyncio, sys
from sandgym.sandboxes.docker import DockerBackend
from sandgym.sandboxes.spec import SandboxSpec

async def main():
    b = DockerBackend(owner_id=sys.argv[1])
    sb = await b.create(SandboxSpec(image=sys.argv[2], workdir="/app"))
    print(sb.id, flush=True)
    await sb.exec_private(["sleep", "300"], b"", timeout_s=600)

asyncio.run(main())
"""


async def test_reap_removes_the_verifier_of_a_server_killed_mid_verify() -> None:
    owner = "test-pv-killed-" + os.urandom(4).hex()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        textwrap.dedent(CHILD),
        owner,
        IMAGE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        sandbox_id = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
        assert sandbox_id.startswith("sg-"), sandbox_id
        await wait_until(lambda: leftovers(sandbox_id)[0], 60, what="the verifier container")
        await wait_until(lambda: leftovers(sandbox_id)[1], 10, what="the snapshot image")
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    b = DockerBackend()
    try:
        removed = await b.reap(only_expired=True)  # its owner process is dead: orphans
    finally:
        await b.aclose()
    assert sandbox_id in removed
    assert any(name.startswith(sandbox_id + "-verifier-") for name in removed), removed
    assert leftovers(sandbox_id) == ([], [])


async def test_kill_agent_processes_leaves_the_sandbox_working(sandbox: DockerSandbox) -> None:
    """The docker opt-in of backends without a private exec, kept as a Sandbox method."""
    await sandbox.exec("(nohup setsid sleep 4343 >/dev/null 2>&1 &)")
    assert (await sandbox.exec("pgrep -c -f '^sleep 4343'")).stdout.strip() == "1"
    await sandbox.kill_agent_processes()
    assert (await sandbox.exec("pgrep -c -f '^sleep 4343'")).stdout.strip() == "0"
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_a_verifier_user_runs_with_that_users_primary_group(sandbox: DockerSandbox) -> None:
    """A task's non-root `verifier_user` (sandgym.tasks.verifier.run wraps the tests in `as_user_argv`):
    its uid and the primary group its entry names, no supplementary group, no capability."""
    probe = ["sh", "-c", "id -un; id -gn; id -G; grep CapEff /proc/self/status"]
    res = await sandbox.exec_private(as_user_argv("nobody", probe), b"", see_processes=False)
    assert res.exit_code == 0, res
    assert res.stdout.splitlines() == ["nobody", "nogroup", "65534", "CapEff:\t0000000000000000"]
