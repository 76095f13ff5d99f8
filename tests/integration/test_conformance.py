"""Backend conformance: the same checks against every real sandbox backend.

In the spirit of Gymnasium's `check_env`: `local` always runs; `docker` runs whenever an engine
answers (CI always starts one, and marks it with `docker`). Each check states one promise of the
`Sandbox` protocol.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandgym.sandboxes import (
    SandboxClosedError,
    SandboxFileNotFoundError,
    SandboxPathError,
    SandboxSpec,
    UserUnsupportedError,
    get_backend,
)
from tests.netprobe import Banner, default_gateway

DOCKER_IMAGE = os.environ.get("SANDGYM_TEST_IMAGE", "sandgym/terminal:latest")


def _docker_ready() -> str | None:
    if shutil.which("docker") is None:
        return "docker CLI not installed"
    try:
        subprocess.run(["docker", "info"], check=True, capture_output=True, timeout=10)
    except Exception:
        return "no Docker engine answers"
    probe = subprocess.run(["docker", "image", "inspect", DOCKER_IMAGE], capture_output=True)
    if probe.returncode != 0:
        return f"image {DOCKER_IMAGE} missing: run images/bootstrap-base.sh"
    return None


BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("docker", id="docker", marks=pytest.mark.docker),
]


@pytest.fixture
async def sandbox_factory(request):
    name = request.param
    if name == "docker":
        reason = _docker_ready()
        if reason:
            pytest.skip(reason)
    backend = get_backend(name)
    made = []

    async def make(**kw):
        if name == "docker":
            kw.setdefault("image", DOCKER_IMAGE)
        kw.setdefault("memory_mb", 512)
        kw.setdefault("pids_limit", 256)
        sb = await backend.create(SandboxSpec(**kw))
        made.append(sb)
        return sb

    make.backend_name = name  # type: ignore[attr-defined]
    yield make
    for sb in made:
        await sb.close()
    await backend.reap(only_expired=False)
    await backend.aclose()


pytestmark = pytest.mark.parametrize("sandbox_factory", BACKENDS, indirect=True)


async def test_exec_output_exit_code_and_stderr(sandbox_factory):
    sb = await sandbox_factory()
    res = await sb.exec("echo out; echo err >&2; exit 7")
    assert res.exit_code == 7
    assert res.stdout == "out\n"
    assert res.stderr == "err\n"
    assert not res.timed_out


async def test_exec_env_cwd_and_workdir(sandbox_factory):
    sb = await sandbox_factory(env={"SPEC_VAR": "from-spec"}, workdir="/app")
    res = await sb.exec("pwd; echo $SPEC_VAR $CALL_VAR", env={"CALL_VAR": "from-call"})
    assert res.stdout == "/app\nfrom-spec from-call\n"
    await sb.exec("mkdir -p /tmp/sub")
    assert (await sb.exec("pwd", cwd="/tmp/sub")).stdout == "/tmp/sub\n"


async def test_exec_timeout_kills_the_tree(sandbox_factory):
    sb = await sandbox_factory()
    res = await sb.exec("(sleep 300 &) ; sleep 301", timeout_s=1)
    assert res.timed_out and res.exit_code is None
    left = await sb.exec("ps -eo args | grep -c '^sleep 30[01]' || true")
    assert left.stdout.strip() == "0"


async def test_shell_keeps_state_between_commands(sandbox_factory):
    sb = await sandbox_factory()
    r1 = await sb.run("cd /tmp && export SG_X=42 && f() { echo fn$1; }")
    assert r1.exit_code == 0
    r2 = await sb.run("pwd; echo $SG_X; f 1; false")
    assert r2.output == "/tmp\n42\nfn1\n"
    assert r2.exit_code == 1


async def test_shell_timeout_kills_tree_and_shell_survives(sandbox_factory):
    sb = await sandbox_factory()
    await sb.run("export KEEP=yes")
    res = await sb.run("sleep 200 & sleep 201", timeout_s=1)
    assert res.timed_out and res.exit_code is None
    after = await sb.run("echo $KEEP; ps -eo args | grep -c '^sleep 20[01]' || true")
    assert after.output.split() == ["yes", "0"]


async def test_shell_keys_and_screen(sandbox_factory):
    sb = await sandbox_factory()
    await sb.run("true")
    await sb.send_keys("printf 'SCREEN-%s\\n' OK<Enter>")
    screen = await sb.screen()
    assert "SCREEN-OK" in screen
    assert (await sb.run("echo back")).output == "back\n"


async def test_large_output_is_truncated_with_marker(sandbox_factory):
    sb = await sandbox_factory()
    res = await sb.exec("head -c 10000000 /dev/zero | tr '\\0' a")
    assert res.truncated and "output truncated" in res.stdout
    assert len(res.stdout) < 2_000_000
    sh = await sb.run("head -c 10000000 /dev/zero | tr '\\0' b")
    assert sh.truncated and "output truncated" in sh.output and sh.exit_code == 0


async def test_binary_file_round_trip(sandbox_factory, tmp_path: Path):
    sb = await sandbox_factory()
    blob = bytes(range(256)) * 64
    await sb.write_file("/app/data/blob.bin", blob)
    assert await sb.read_file("/app/data/blob.bin") == blob
    digest = await sb.exec("sha256sum /app/data/blob.bin | cut -d' ' -f1")
    import hashlib

    assert digest.stdout.strip() == hashlib.sha256(blob).hexdigest()
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello")
    await sb.upload(src, "/app/tree")
    assert (await sb.exec("cat /app/tree/sub/f.txt")).stdout == "hello"
    await sb.download("/app/tree", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "hello"
    with pytest.raises(SandboxFileNotFoundError):
        await sb.read_file("/app/missing.txt")


async def test_upload_checks_before_sending(sandbox_factory, tmp_path: Path):
    sb = await sandbox_factory()
    with pytest.raises(FileNotFoundError, match="does not exist on the host"):
        await sb.upload(tmp_path / "missing", "/app/x")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(SandboxPathError, match="below /"):
        await sb.upload(tmp_path / "f.txt", "/")
    with pytest.raises(SandboxPathError, match="below /"):
        await sb.upload(tmp_path / "f.txt", "/app/..")


async def test_path_traversal_refused(sandbox_factory):
    sb = await sandbox_factory()
    with pytest.raises(SandboxPathError):
        await sb.write_file("../../../../etc/evil", "x")
    with pytest.raises(SandboxPathError):
        await sb.read_file("/app/../../..")
    # A symlink to / must resolve to the *sandbox's* root: either the write is refused, or it
    # lands inside the sandbox; never on the host.
    await sb.exec("ln -s / /app/rootlink")
    marker = f"sg-evil-{sb.id}"
    try:
        await sb.write_file(f"/app/rootlink/tmp/{marker}", "x")
    except SandboxPathError:
        pass
    else:
        assert (await sb.exec(f"cat /tmp/{marker}")).stdout == "x"
    assert not await asyncio.to_thread(os.path.exists, f"/tmp/{marker}")


def _cgroup_dir(sb: object, controller: str) -> Path:
    """Host path of the sandbox's own cgroup for `controller` (v1) or its unified group (v2)."""
    if not hasattr(sb, "container_id"):  # local: the backend's CgroupSet
        cg = getattr(sb, "cg", None)
        assert cg is not None, "local backend without cgroups (not root?): no limit to show"
        return cg.dirs["unified" if cg.v2 else controller]
    container_id = sb.container_id  # type: ignore[attr-defined]
    pid = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Pid}}", container_id],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return Path("/sys/fs/cgroup", controller, path.lstrip("/"))
        if controllers == "":  # v2 (listed last, after any v1 hierarchy)
            return Path("/sys/fs/cgroup", path.lstrip("/"))
    raise AssertionError(f"no {controller} cgroup for container {container_id}")


def _read(d: Path, *names: str) -> str:
    """The first of `names` (v1 / v2 spellings) that exists in `d`."""
    for name in names:
        if (d / name).exists():
            return (d / name).read_text().strip()
    raise AssertionError(f"none of {names} in {d}")


async def test_memory_hog_is_killed(sandbox_factory):
    sb = await sandbox_factory(memory_mb=128)
    mem = _cgroup_dir(sb, "memory")
    limit = 128 * 2**20
    assert int(_read(mem, "memory.limit_in_bytes", "memory.max")) == limit
    res = await sb.exec(
        "python3 -c 'b = bytearray(1024 * 1024 * 1024); print(len(b))'; echo rc=$?",
        timeout_s=60,
    )
    # Killed by the memory limit: SIGKILL (the OOM killer; 128 + 9), not a timeout, not a
    # MemoryError, and not a success.
    assert not res.timed_out, res
    assert res.stdout.strip().splitlines()[-1] == "rc=137", res
    # ...after the sandbox's memory use reached the limit (and never went past it).
    peak = int(_read(mem, "memory.max_usage_in_bytes", "memory.peak"))
    assert 0.9 * limit <= peak <= limit, (peak, limit)
    assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_fork_bomb_is_contained(sandbox_factory):
    sb = await sandbox_factory(pids_limit=64)
    pids = _cgroup_dir(sb, "pids")
    assert _read(pids, "pids.max") == "64"
    bomb = asyncio.create_task(sb.exec("bomb() { bomb | bomb & }; bomb; sleep 60", timeout_s=10))
    peak = 0
    while not bomb.done() and peak < 64:  # the bomb is ended by its timeout (bounded)
        peak = max(peak, int(_read(pids, "pids.current")))
        await asyncio.sleep(0.02)
    res = await bomb
    # The process count reached the pids limit, and the kernel refused forks past it (bash
    # says so and retries); the bomb was not merely slow until its timeout.
    assert peak >= 64, peak
    assert "fork: retry: Resource temporarily unavailable" in res.stderr, res.stderr[-500:]
    ok = await sb.exec("echo alive", timeout_s=30)
    assert ok.stdout == "alive\n"


async def test_no_network_when_off(sandbox_factory):
    # The same probe of a listener on this machine must succeed from a public sandbox (so an
    # offline host cannot make this pass) and fail from one with network=False.
    public = await sandbox_factory(network=True)
    if sandbox_factory.backend_name == "local":
        host = "127.0.0.1"  # a public local sandbox shares the host's network
    else:
        host = default_gateway((await public.exec("cat /proc/net/route")).stdout)
    banner = Banner(host)
    try:
        reached = await public.exec(banner.probe(), timeout_s=20)
        assert (reached.exit_code, reached.stdout.strip()) == (0, banner.token), reached
        assert banner.accepted == 1
        sb = await sandbox_factory(network=False)
        res = await sb.exec(banner.probe(), timeout_s=20)
        assert res.exit_code != 0 and banner.token not in res.stdout, res
        assert banner.accepted == 1
    finally:
        banner.close()


async def test_close_twice_and_exec_after_close(sandbox_factory):
    sb = await sandbox_factory()
    await sb.close()
    await sb.close()
    assert not await sb.is_alive()
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")
    with pytest.raises(SandboxClosedError):
        await sb.run("true")


async def test_exec_as_another_user_takes_that_users_primary_group_or_is_refused(
    sandbox_factory,
):
    """`exec(user=...)` runs as that user with the primary group its entry names, as `docker
    exec -u` does (nobody's group is nogroup on Debian). The local backend maps root alone in
    its user namespace: there it is refused by name, at exec and at create, never run as root."""
    sb = await sandbox_factory()
    for user in ("nobody", "65534"):
        if sandbox_factory.backend_name == "local":
            with pytest.raises(UserUnsupportedError, match="needs the docker backend"):
                await sb.exec("id -un", user=user)
            continue
        res = await sb.exec("id -un; id -gn; id -G", user=user)
        assert (res.exit_code, res.stdout) == (0, "nobody\nnogroup\n65534\n"), (user, res)
    assert (await sb.exec("id -un")).stdout == "root\n"
    assert sb.capabilities.other_users is (sandbox_factory.backend_name != "local")
    if sandbox_factory.backend_name == "local":
        with pytest.raises(UserUnsupportedError, match="'nobody'"):
            await sandbox_factory(user="nobody")
