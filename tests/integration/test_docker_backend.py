"""Integration tests of the docker backend against the real engine on this machine.

Skipped only when no Docker engine answers. A missing `sandgym/terminal:latest` is built with
images/bootstrap-base.sh (idempotent; about 100 s the first time).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes.docker.exec_kill import HELPER_SCRIPT
from sandgym.sandboxes.errors import (
    BackendUnavailableError,
    SandboxClosedError,
    SandboxCreateError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
)
from sandgym.sandboxes.labels import LABEL_LEASE_EXPIRY, LABEL_OWNER, LABEL_OWNER_PID
from sandgym.sandboxes.spec import SandboxSpec
from tests.docker_engine import (
    bootstrap_terminal_image,
    engine_answers,
    owned_docker_backend,
    process_running,
)
from tests.waiting import wait_until, wait_until_in_thread

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


async def docker_cli(*args: str) -> None:
    """Run the docker CLI (acting on a container from outside, as an operator would)."""
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await proc.wait()


async def pids_reach(api: Any, container_id: str, at_least: int, timeout_s: float) -> int:
    """Wait until the container holds at least `at_least` processes (the engine's stats);
    return the count read."""
    counts: list[int] = []

    async def enough() -> bool:
        stats = await asyncio.to_thread(api.stats, container_id, stream=False)
        counts.append(int(stats["pids_stats"]["current"]))
        return counts[-1] >= at_least

    await wait_until(enough, timeout_s, 0.05, f"{at_least} processes in the container")
    return counts[-1]


async def dead_pid() -> int:
    """The pid of a process that has exited."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    return proc.pid


if not engine_answers():
    pytest.skip("no Docker engine answers", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def terminal_image() -> None:
    bootstrap_terminal_image()


@pytest.fixture
async def backend() -> AsyncIterator[object]:
    async for b in owned_docker_backend():
        yield b
    await b.aclose()


async def test_exec_env_cwd_user_and_exit_code(backend) -> None:
    sb = await backend.create(SandboxSpec(env={"FOO": "bar"}))
    try:
        r = await sb.exec("echo $FOO $BAZ; pwd; echo oops >&2; exit 7", env={"BAZ": "qux"})
        assert (r.exit_code, r.stdout, r.stderr) == (7, "bar qux\n/app\n", "oops\n")
        assert (await sb.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await sb.exec(["id", "-un"], user="nobody")).stdout == "nobody\n"
        assert (await sb.exec(["id", "-u"])).stdout == "0\n"
        # root keeps what it needs to work: chown, and apt's privilege drop to _apt.
        r = await sb.exec(
            "touch f && chown nobody f && stat -c %U f && setpriv --reuid=65534 id -u"
        )
        assert r.stdout == "nobody\n65534\n", r
        assert await sb.is_alive()
    finally:
        await sb.close()


async def test_timeout_kills_the_whole_tree(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        cmd = "sleep 301 & echo $! > /tmp/bg; setsid sleep 302 & sleep 303"
        r = await sb.exec(cmd, timeout_s=1.0)
        assert r.timed_out and r.exit_code is None
        ps = await sb.exec("ps -eo args")
        for leftover in ("sleep 301", "sleep 302", "sleep 303"):
            assert leftover not in ps.stdout, ps.stdout
        r = await sb.exec("kill -0 $(cat /tmp/bg)")
        assert r.exit_code != 0
        # The same as an unprivileged user.
        r = await sb.exec("sleep 304 & sleep 305", timeout_s=1.0, user="nobody")
        assert r.timed_out
        assert "sleep 30" not in (await sb.exec("ps -eo args")).stdout
    finally:
        await sb.close()


async def test_output_is_capped_while_streaming(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        r = await sb.exec("head -c 10000000 /dev/zero | tr '\\0' a; echo done >&2")
        assert r.exit_code == 0 and r.truncated
        assert len(r.stdout) < 1_100_000 and "9000000 bytes dropped" in r.stdout
        assert r.stderr == "done\n"
    finally:
        await sb.close()


async def test_memory_hog_is_killed(backend) -> None:
    sb = await backend.create(SandboxSpec(memory_mb=64))
    try:
        r = await sb.exec(["python3", "-c", "b = bytearray(400 * 1024 * 1024); print('survived')"])
        assert r.exit_code == 137 and "survived" not in r.stdout
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    finally:
        await sb.close()


async def test_fork_bomb_is_contained(backend) -> None:
    import docker

    sb = await backend.create(SandboxSpec(pids_limit=64))
    api = docker.from_env().api
    try:
        bomb = asyncio.create_task(sb.exec("bomb() { bomb | bomb & }; bomb", timeout_s=4.0))
        peak = 0
        while not bomb.done() and peak < 48:  # the bomb is ended by its timeout (bounded)
            stats = await asyncio.to_thread(api.stats, sb.container_id, stream=False)
            peak = max(peak, stats["pids_stats"]["current"])
        assert 48 <= peak <= 64, peak  # it spread, and no further than the limit
        r = await bomb
        assert r.timed_out or r.exit_code is not None
        # The tree kill got through, and the sandbox works again.
        for _ in range(50):
            probe = await sb.exec("echo ok", timeout_s=5.0)
            if probe.exit_code == 0:
                break
            await asyncio.sleep(0.1)
        assert probe.stdout == "ok\n"
    finally:
        api.close()
        await sb.close()


async def test_no_network_by_default(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        r = await sb.exec("ls /sys/class/net")
        assert r.stdout.split() == ["lo"]
        r = await sb.exec("curl -sS -m 3 http://deb.debian.org/ >/dev/null")
        assert r.exit_code != 0
    finally:
        await sb.close()
    sb = await backend.create(SandboxSpec(network=True))
    try:
        assert "eth0" in (await sb.exec("ls /sys/class/net")).stdout
    finally:
        await sb.close()


async def test_build_context_and_cache(backend, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello.txt").write_text("from the context " + os.urandom(4).hex())
    (ctx / "Dockerfile").write_text(
        "FROM sandgym/terminal:latest\nCOPY hello.txt /opt/hello.txt\nENV GREETING=hi\n"
        "WORKDIR /work\n"
    )
    spec = SandboxSpec(build_context=ctx, workdir="/work")
    try:
        first, second = await asyncio.gather(backend.create(spec), backend.create(spec))
        assert backend.builds == 1  # two concurrent creates, one build
        for sb in (first, second):
            r = await sb.exec("cat /opt/hello.txt; echo; echo $GREETING; pwd")
            assert r.stdout == (ctx / "hello.txt").read_text() + "\nhi\n/work\n"
        third = await backend.create(spec)
        assert backend.builds == 1
        await third.close()
        await first.close()
        await second.close()
    finally:
        digest = spec.context_hash()
        await docker_cli("rmi", "-f", f"sandgym/ctx:{digest[:16]}")


async def test_unused_context_images_are_pruned_used_ones_kept(backend, tmp_path: Path) -> None:
    specs = []
    for name in ("used", "unused"):
        ctx = tmp_path / name
        ctx.mkdir()
        (ctx / "f.txt").write_text(name + os.urandom(4).hex())
        (ctx / "Dockerfile").write_text("FROM sandgym/terminal:latest\nCOPY f.txt /opt/f.txt\n")
        specs.append(SandboxSpec(build_context=ctx))
    live = await backend.create(specs[0])
    gone = await backend.create(specs[1])
    await gone.close()
    tags = [f"sandgym/ctx:{s.context_hash()[:16]}" for s in specs]
    try:
        removed, errors = await backend.prune_context_images()
        assert tags[1] in removed and tags[0] not in removed and not errors
        assert await backend.images.exists(tags[0]) and not await backend.images.exists(tags[1])
        assert (await live.exec("cat /opt/f.txt")).exit_code == 0
    finally:
        await live.close()
        await docker_cli("rmi", "-f", *tags)


async def test_broken_build_and_missing_image_are_create_errors(backend, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM sandgym/terminal:latest\nRUN exit 3\n")
    with pytest.raises(SandboxCreateError, match="build") as built:
        await backend.create(SandboxSpec(build_context=tmp_path))
    assert built.value.cause == "build"  # what a report reads, never the message
    with pytest.raises(SandboxCreateError, match="not present") as missing:
        await backend.create(SandboxSpec(image="sandgym/no-such-image:nope"))
    assert missing.value.cause == "create"


def all_image_ids() -> set[str]:
    out = subprocess.run(
        ["docker", "image", "ls", "-a", "-q", "--no-trunc"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return set(out.split())


async def test_a_failed_build_leaves_no_step_image(backend, tmp_path: Path) -> None:
    # the step before the failing one is committed as an image; it must not stay behind
    ctx = tmp_path / "steps"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM sandgym/terminal:latest\nRUN echo {os.urandom(6).hex()} > /nonce\nRUN exit 3\n"
    )
    before = all_image_ids()
    with pytest.raises(SandboxCreateError, match="build"):
        await backend.images.image_for(SandboxSpec(build_context=ctx))
    assert len(backend.images.leftovers_removed) == 1  # the `RUN echo` step's image
    assert all_image_ids() - before == set()
    # failing at the first step after FROM: the base image is named, so it is kept
    first = tmp_path / "first"
    first.mkdir()
    (first / "Dockerfile").write_text("FROM sandgym/terminal:latest\nRUN exit 3\n")
    with pytest.raises(SandboxCreateError, match="build"):
        await backend.images.image_for(SandboxSpec(build_context=first))
    assert await backend.images.exists("sandgym/terminal:latest")
    assert len(backend.images.leftovers_removed) == 1


@contextlib.contextmanager
def held_url() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    """A URL on this host whose GET is answered only once `answer` is set (`asked` is set when
    it is asked): a build's `ADD <url>` (the engine fetches it) waits there, so a test orders
    events without sleeping."""
    asked, answer = threading.Event(), threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.set()
            answer.wait(120)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"fetched\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{os.urandom(6).hex()}", asked, answer
    finally:
        answer.set()
        server.shutdown()


def slow_and_failing(tmp_path: Path, url: str) -> tuple[SandboxSpec, SandboxSpec]:
    """A build that waits in `ADD url`, and one that fails after a committed step."""
    slow, failing = tmp_path / "slow", tmp_path / "failing"
    slow.mkdir()
    failing.mkdir()
    (slow / "Dockerfile").write_text(f"FROM sandgym/terminal:latest\nADD {url} /fetched\n")
    (failing / "Dockerfile").write_text(
        f"FROM sandgym/terminal:latest\nRUN echo {os.urandom(6).hex()} > /nonce\nRUN exit 3\n"
    )
    return SandboxSpec(build_context=slow), SandboxSpec(build_context=failing)


@pytest.mark.parametrize("cancel_the_wait", [False, True], ids=["awaited", "wait-cancelled"])
async def test_a_failed_builds_step_image_waits_for_the_running_build(
    backend, tmp_path: Path, cancel_the_wait: bool
) -> None:
    # A build still running may have taken the failed build's step image as its cache, so the
    # image goes only when no build of the store runs. A create that times out cancels its wait
    # for the build, not the engine's build, which goes on in its thread: it still counts.
    store = backend.images
    with held_url() as (url, asked, answer):
        slow_spec, failing_spec = slow_and_failing(tmp_path, url)
        before = all_image_ids()
        running = asyncio.create_task(store.image_for(slow_spec))
        try:
            assert await asyncio.to_thread(asked.wait, 120)  # the slow build is inside its ADD
            if cancel_the_wait:
                running.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await running
            with pytest.raises(SandboxCreateError, match="build"):
                await store.image_for(failing_spec)
            left = all_image_ids() - before
            assert len(left) == 1  # kept while the other build runs
            answer.set()
            if cancel_the_wait:
                assert await asyncio.to_thread(store.wait_idle, 120)
            else:
                assert (await running).startswith("sandgym/ctx:")
            assert list(store.leftovers_removed) == sorted(left)  # removed once that build ended
            assert left & all_image_ids() == set()
        finally:
            answer.set()
            await asyncio.gather(running, return_exceptions=True)
            await asyncio.to_thread(store.wait_idle, 120)
            await docker_cli("rmi", "-f", f"sandgym/ctx:{slow_spec.context_hash()[:16]}")


async def test_files_roundtrip_and_traversal(backend, tmp_path: Path) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        await sb.write_file("deep/new/dir/a.txt", "héllo", mode=0o600)
        assert await sb.read_file("/app/deep/new/dir/a.txt") == "héllo".encode()
        assert (await sb.exec("stat -c %a deep/new/dir/a.txt")).stdout == "600\n"
        blob = os.urandom(300_000)
        await sb.write_file("/tmp/blob.bin", blob)
        assert await sb.read_file("/tmp/blob.bin") == blob
        assert await sb.read_file("/tmp/blob.bin", max_bytes=10) == blob[:10]
        with pytest.raises(SandboxFileNotFoundError):
            await sb.read_file("/nope/missing.txt")
        with pytest.raises(SandboxPathError):
            await sb.read_file("../../../etc/passwd")
        with pytest.raises(SandboxPathError):
            await sb.write_file("/../x", "y")
        with pytest.raises(SandboxPathError):
            await sb.read_file("/app")  # a directory
        # A symlink resolves inside the container's root, never on the host.
        await sb.exec("ln -s /etc/hostname /app/link")
        assert (await sb.read_file("link")).decode().strip() == sb.id

        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "x.py").write_text("print(1)\n")
        (src / "top.txt").write_text("top")
        await sb.upload(src, "/srv/up")
        r = await sb.exec("cat /srv/up/top.txt /srv/up/sub/x.py; stat -c %U /srv/up/top.txt")
        assert r.stdout == "topprint(1)\nroot\n"
        out = tmp_path / "down"
        await sb.download("/srv/up", out)
        assert (out / "sub" / "x.py").read_text() == "print(1)\n"
        await sb.download("/app/deep/new/dir/a.txt", tmp_path / "a.txt")
        assert (tmp_path / "a.txt").read_text() == "héllo"
    finally:
        await sb.close()


async def test_labels_limits_and_isolation_settings(backend) -> None:
    import docker

    spec = SandboxSpec(cpus=0.5, memory_mb=256, pids_limit=100)
    sb = await backend.create(spec)
    api = docker.from_env().api
    try:
        info = api.inspect_container(sb.container_id)
        labels = info["Config"]["Labels"]
        assert labels["sandgym.managed"] == "1"
        assert labels[LABEL_OWNER] == backend.owner_id
        assert labels["sandgym.fingerprint"] == spec.fingerprint("docker")
        assert float(labels[LABEL_LEASE_EXPIRY]) > time.time()
        hc = info["HostConfig"]
        assert hc["CpuQuota"] / hc["CpuPeriod"] == 0.5 and hc["CpuPeriod"] == 10_000
        assert hc["Memory"] == hc["MemorySwap"] == 256 * 1024 * 1024
        assert hc["PidsLimit"] == 100
        assert hc["NetworkMode"] == "none"
        assert hc["CapDrop"] == ["ALL"] and "NET_RAW" not in hc["CapAdd"]
        assert "no-new-privileges" in hc["SecurityOpt"]
        # pid 1 is the sandbox's own init (the agent cannot kill it), not Docker's
        assert not hc["Init"]
        pid1 = await sb.exec(["cat", "/proc/1/cmdline"])
        # (MAIN_INIT execs bash with the helper, which keeps the deadline, when the image has it)
        assert pid1.stdout.split("\0")[:3] == ["bash", "-c", HELPER_SCRIPT], pid1.stdout[:200]
    finally:
        api.close()
        await sb.close()


async def test_close_twice_and_use_after_close(backend) -> None:
    sb = await backend.create(SandboxSpec())
    await sb.close()
    await sb.close()
    assert not await sb.is_alive()
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")
    with pytest.raises(SandboxClosedError):
        await sb.run("true")
    with pytest.raises(SandboxClosedError):
        await sb.read_file("/etc/hostname")


async def test_container_killed_externally_is_lost(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        assert (await sb.run("echo hi")).output == "hi\n"
        await docker_cli("kill", sb.container_id)
        assert not await sb.is_alive()
        with pytest.raises(SandboxLostError):
            await sb.exec("true")
        with pytest.raises(SandboxLostError):
            await sb.read_file("/etc/hostname")
        with pytest.raises(SandboxLostError):
            await sb.write_file("/tmp/x", "y")
        with pytest.raises(SandboxLostError):
            await sb.run("echo again")
        await docker_cli("rm", "-f", sb.container_id)
        with pytest.raises(SandboxLostError):
            await sb.exec("true")
    finally:
        await sb.close()  # removal of a vanished container is fine


async def test_persistent_shell_keeps_state_and_times_out(backend) -> None:
    sb = await backend.create(SandboxSpec(env={"FOO": "bar"}))
    try:
        r = await sb.run("cd /tmp && export A=1 && echo $FOO")
        assert (r.output, r.exit_code) == ("bar\n", 0)
        r = await sb.run("echo $A; pwd; false")
        assert (r.output, r.exit_code) == ("1\n/tmp\n", 1)
        r = await sb.run("sleep 306 & sleep 307", timeout_s=1.0)
        assert r.timed_out
        assert "sleep 30" not in (await sb.exec("ps -eo args")).stdout
        assert (await sb.run("echo $A")).output == "1\n"
    finally:
        await sb.close()


async def test_reap_removes_orphan_with_dead_owner_and_expired_lease(backend) -> None:
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.reaper import reap

    # A "crashed server": its own owner id, a pid that has exited, a lease in the past.
    crashed = DockerBackend(owner_id="crashed-" + os.urandom(4).hex(), lease_s=-60)
    orphan = await crashed.create(SandboxSpec())
    api = (await asyncio.to_thread(crashed.engine.client)).api
    labels = api.inspect_container(orphan.container_id)["Config"]["Labels"]
    assert float(labels[LABEL_LEASE_EXPIRY]) < time.time()
    live = await backend.create(SandboxSpec())
    try:
        assert labels[LABEL_OWNER_PID] == str(os.getpid())
        report = await reap(["docker"])
        removed = {r["id"] for r in report.removed}
        # Other processes on this engine may run a reaper too (a pool test, a server), so
        # the orphan may be gone already; it must be gone, and ours must survive.
        assert not await orphan.is_alive(), report
        assert live.id not in removed and await live.is_alive()
        assert report.errors == []
    finally:
        await orphan.close()
        await live.close()
        await crashed.aclose()


async def test_reap_by_dead_owner_pid(backend) -> None:
    """A container labelled with a dead owner pid on this host (lease still valid) is reaped."""
    import docker

    pid = await dead_pid()
    sb = await backend.create(SandboxSpec(labels={}))
    api = docker.from_env().api
    try:
        labels = dict(api.inspect_container(sb.container_id)["Config"]["Labels"])
        labels[LABEL_OWNER_PID] = str(pid)
        labels[LABEL_OWNER] = "crashed-" + os.urandom(4).hex()
        # Labels cannot change on a live container: start a twin carrying the dead pid.
        twin = api.create_container(
            "sandgym/terminal:latest",
            entrypoint=["sleep", "infinity"],
            labels=labels,
            host_config=api.create_host_config(network_mode="none", init=True),
        )
        api.start(twin["Id"])
        removed = await backend.reap()
        names = [
            c["Names"][0].lstrip("/") for c in api.containers(all=True, filters={"id": twin["Id"]})
        ]
        assert names == []
        assert sb.id not in removed and await sb.is_alive()
    finally:
        api.close()
        await sb.close()


async def test_unavailable_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandgym.sandboxes.docker import DockerBackend

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    b = DockerBackend()
    with pytest.raises(BackendUnavailableError, match="no Docker engine answers"):
        await b.create(SandboxSpec())
    await b.aclose()


async def test_storage_limit_is_applied_or_skipped_with_a_warning(backend, caplog) -> None:
    # A total quota (`--storage-opt size`) needs btrfs, or overlay2 on xfs with pquota; elsewhere
    # create must still work, with the per-file cap alone and a warning saying so.
    mb = 16
    with caplog.at_level(logging.INFO, logger="sandgym.sandboxes.docker"):
        sb = await backend.create(SandboxSpec(storage_mb=mb))
    try:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
        inspect = await asyncio.to_thread(
            subprocess.run,
            ["docker", "inspect", "-f", "{{json .HostConfig}}", sb.container_id],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        host = json.loads(inspect.stdout)
        # The per-file cap is always in force, and it holds.
        assert {"Name": "fsize", "Soft": mb * 2**20, "Hard": mb * 2**20} in host["Ulimits"]
        r = await sb.exec(f"head -c {mb + 1}M /dev/zero > /app/big; echo rc=$?; wc -c < /app/big")
        rc, size = r.stdout.split()
        assert rc != "rc=0" and int(size) <= mb * 2**20, r
        if backend.quota.supported:
            assert int(host["StorageOpt"]["size"].rstrip("M")) >= mb, host["StorageOpt"]
            assert "a total quota per sandbox" in caplog.text
        else:
            assert backend.quota.supported is False  # decided by this create, never left open
            assert not host.get("StorageOpt"), host["StorageOpt"]
            assert "refuses a total quota" in caplog.text
        if (
            os.environ.get("SANDGYM_DOCKER_STORAGE") == "btrfs-quota"
            or backend.quota.driver() == "btrfs"
        ):
            assert backend.quota.supported is True  # the engine CI makes has a total quota
    finally:
        await sb.close()


async def test_sandbox_recovers_when_a_finished_exec_left_a_fork_bomb(backend) -> None:
    import docker

    sb = await backend.create(SandboxSpec(pids_limit=48))
    try:
        r = await sb.exec("(bomb() { bomb | bomb & }; bomb) >/dev/null 2>&1 </dev/null; exit 0")
        assert r.exit_code == 0 and not r.timed_out
        await pids_reach(docker.from_env().api, sb.container_id, 36, 60)  # the bomb spread
        probe = await sb.exec("echo alive", timeout_s=30)
        assert probe.stdout == "alive\n", probe
    finally:
        await sb.close()


async def test_container_killed_during_exec_is_lost(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        pending = asyncio.create_task(sb.exec("sleep 60", timeout_s=30))
        await wait_until_in_thread(
            lambda: process_running(sb.container_id, "sleep 60"), 60.0, 0.05, "sleep 60 running"
        )
        await docker_cli("kill", sb.container_id)
        with pytest.raises(SandboxLostError):
            await pending
    finally:
        await sb.close()


#: renames and removes a small tree without pause, as an agent's daemon may while it is scored
CHURN = (
    "nohup setsid bash -c 'while :; do mkdir -p /w/a/b/c/d /w/e/f/g; "
    "touch /w/a/b/c/d/x /w/e/f/g/y; mv /w /w.x; rm -rf /w.x; done' >/dev/null 2>&1 &"
)


async def test_changed_paths_hold_while_a_process_churns_directories(backend) -> None:
    """The engine's diff walks the container's layer: a process renaming and removing
    directories under that walk failed it (a 500, `readdirent: no such file or directory`),
    and with it the scoring of the episode (the tamper report's listing). The diff runs with
    the container paused: every listing is read, and the container runs on afterwards."""
    import docker

    sb = await backend.create(SandboxSpec())
    api = docker.from_env().api
    try:
        await sb.exec(CHURN)
        await wait_until_in_thread(
            lambda: process_running(sb.container_id, "mkdir -p /w/a/b"), 60.0, 0.05, "the churn"
        )
        failures: list[str] = []
        for _ in range(150):
            try:
                await sb.changed_paths()
            except Exception as exc:  # the engine's error, as the scoring would meet it
                failures.append(str(exc)[:200])
        assert failures == []
        state = (await asyncio.to_thread(api.inspect_container, sb.container_id))["State"]
        assert (state["Running"], state["Paused"]) == (True, False)
        assert await asyncio.to_thread(process_running, sb.container_id, "mkdir -p /w/a/b")
    finally:
        api.close()
        await sb.close()


async def test_shell_comes_back_after_exit(backend) -> None:
    sb = await backend.create(SandboxSpec())
    try:
        assert (await sb.run("echo one")).output == "one\n"
        await sb.send_keys("exit<Enter>")
        # the old shell is gone before the next command
        await wait_until(lambda: not sb.shell_alive(), 30.0, 0.02, "the shell's exit")
        assert sb.shell_alive() is False
        r = await sb.run("echo two")
        assert (r.output, r.exit_code) == ("two\n", 0)
    finally:
        await sb.close()


async def test_image_without_bash_still_runs_and_kills_trees(backend, tmp_path: Path) -> None:
    # No bash: the main process falls back to a plain sh deadline loop and the killer to sh.
    (tmp_path / "Dockerfile").write_text(
        "FROM sandgym/base:bookworm\nRUN rm -f /bin/bash /usr/bin/bash\n"
    )
    spec = SandboxSpec(build_context=tmp_path, workdir="/")
    try:
        sb = await backend.create(spec)
        try:
            r = await sb.exec(["sh", "-c", "sleep 308 & sleep 309"], timeout_s=1.0)
            assert r.timed_out
            ps = await sb.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
            assert "sleep 30" not in ps.stdout and "while :; do read d < deadline" in ps.stdout
            r = await sb.exec("echo hi")  # strings go through bash
            assert r.exit_code == 127 and "bash" in r.stderr and r.stdout == ""
        finally:
            await sb.close()
    finally:
        await docker_cli("rmi", "-f", f"sandgym/ctx:{spec.context_hash()[:16]}")
