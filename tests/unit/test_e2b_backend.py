"""Unit tests of the `e2b` backend against the in-process fake of the E2B SDK.

The fake (`tests/fakes/e2b_fake.py`) runs every command for real inside a local bubblewrap sandbox,
so these tests exercise the backend's own logic: metadata tagging, template choice, the marker
tree kill, the sentinel shell over a pty, files, error mapping, reaping. The same checks run
against the real service in `tests/integration/test_e2b_live.py` when E2B_API_KEY is set. The
cross-backend conformance suite is run here too (minus the resource-limit checks, which on E2B
are properties of a template, not of a create call).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import shutil
from pathlib import Path

import pytest

from sandgym.sandboxes import (
    BackendUnavailableError,
    SandboxClosedError,
    SandboxCreateError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxPathError,
    SandboxSpec,
    get_backend,
)
from sandgym.sandboxes.e2b import LABEL_SANDBOX_ID, E2BBackend, template_for_image
from sandgym.sandboxes.labels import (
    LABEL_FINGERPRINT,
    LABEL_LEASE_EXPIRY,
    LABEL_MANAGED,
    LABEL_OWNER,
    LABEL_OWNER_HOST,
    LABEL_OWNER_PID,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("nsenter") is None,
    reason="the fake E2B cloud runs its sandboxes with bubblewrap + nsenter, not installed",
)


@pytest.fixture
async def cloud(tmp_path: Path):
    from tests.fakes.e2b_fake import FakeE2BCloud

    c = FakeE2BCloud(root=tmp_path / "cloud")
    yield c
    await c.aclose()


@pytest.fixture
async def backend(cloud):
    b = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, request_timeout_s=10)
    yield b
    await b.aclose()


@pytest.fixture
async def sandbox(backend):
    sb = await backend.create(SandboxSpec())
    yield sb
    await sb.close()


def _creates(cloud) -> list[dict]:
    return [kw for name, kw in cloud.calls if name == "create"]


# -- availability and create -------------------------------------------------------------------
async def test_missing_api_key_is_backend_unavailable(cloud, monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    b = E2BBackend(sdk=cloud.sdk)
    with pytest.raises(BackendUnavailableError, match="E2B_API_KEY"):
        await b.create(SandboxSpec())
    with pytest.raises(BackendUnavailableError, match="E2B_API_KEY"):
        await b.reap()
    assert _creates(cloud) == []  # refused before any call to E2B


async def test_api_key_from_environment(cloud, monkeypatch):
    monkeypatch.setenv("E2B_API_KEY", cloud.api_key)
    b = E2BBackend(sdk=cloud.sdk)
    sb = await b.create(SandboxSpec())
    try:
        assert (await sb.exec("echo ok")).stdout == "ok\n"
    finally:
        await sb.close()


async def test_refused_api_key_is_backend_unavailable(cloud):
    b = E2BBackend(api_key="e2b_wrong", sdk=cloud.sdk)
    with pytest.raises(BackendUnavailableError, match="refused"):
        await b.create(SandboxSpec())


async def test_unreachable_e2b_is_backend_unavailable(cloud, backend):
    cloud.offline = True
    with pytest.raises(BackendUnavailableError, match="cannot be reached"):
        await backend.create(SandboxSpec())
    with pytest.raises(BackendUnavailableError, match="cannot be reached"):
        await backend.reap()


async def test_create_tags_metadata_template_env_and_network(cloud, backend):
    spec = SandboxSpec(
        image="sandgym/terminal:latest",
        env={"SPEC_VAR": "v"},
        network=False,
        labels={"sandgym.task": "builtin/x"},
        make_dirs=("/logs/verifier", "/logs/agent"),
    )
    sb = await backend.create(spec)
    try:
        (kw,) = _creates(cloud)
        assert kw["template"] == "sandgym-terminal"
        md = kw["metadata"]
        assert md[LABEL_MANAGED] == "1"
        assert md[LABEL_OWNER] == backend.owner_id
        assert md[LABEL_OWNER_PID] == str(os.getpid())
        assert md[LABEL_OWNER_HOST]
        assert md[LABEL_FINGERPRINT] == spec.fingerprint("e2b")
        assert md[LABEL_SANDBOX_ID] == sb.id
        assert md["sandgym.task"] == "builtin/x"
        assert float(md[LABEL_LEASE_EXPIRY]) > 0
        assert kw["timeout"] == int(backend.lease_s)  # E2B itself ends it with the lease
        assert kw["envs"] == {"SPEC_VAR": "v"}
        assert kw["allow_internet_access"] is False
        assert kw["api_key"] == cloud.api_key
        # The workdir and the spec's make_dirs exist (writable by all) before the first command.
        res = await sb.exec("pwd; echo $SPEC_VAR; stat -c %a /logs/verifier /logs/agent")
        assert res.stdout == "/app\nv\n777\n777\n"
        assert sb.backend_name == "e2b" and sb.e2b_id in cloud.running_ids()
    finally:
        await sb.close()


async def test_unknown_template_is_a_create_error(backend):
    with pytest.raises(SandboxCreateError, match="'python-3-11-slim' was not found"):
        await backend.create(SandboxSpec(image="python:3.11-slim"))


async def test_template_map_and_default_template(cloud):
    b = E2BBackend(
        api_key=cloud.api_key,
        sdk=cloud.sdk,
        default_template="base",
        template_map={"python:3.11-slim": "base"},
    )
    for spec in (SandboxSpec(image="python:3.11-slim"), SandboxSpec()):
        sb = await b.create(spec)
        await sb.close()
    assert [kw["template"] for kw in _creates(cloud)] == ["base", "base"]


def test_template_for_image():
    assert template_for_image("sandgym/terminal:latest") == "sandgym-terminal"
    assert template_for_image("ghcr.io/acme/py:3.11") == "acme-py-3-11"
    assert template_for_image("localhost:5000/tool") == "tool"
    assert template_for_image("Ubuntu:22.04") == "ubuntu-22-04"
    with pytest.raises(SandboxCreateError):
        template_for_image(":::")


async def test_failed_preparation_kills_the_vm(cloud, backend):
    # The workdir cannot be created under /proc: create fails, and no VM is left running.
    with pytest.raises(SandboxCreateError, match="could not be prepared"):
        await backend.create(SandboxSpec(workdir="/proc/sg-no"))
    assert cloud.running_ids() == []


async def test_create_timeout_and_cancel_leave_no_vm(cloud):
    cloud.create_latency_s = 2.0  # the VM exists before the API answers
    b = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, create_timeout_s=0.5)
    with pytest.raises(SandboxCreateError, match="took longer than"):
        await b.create(SandboxSpec())
    assert cloud.running_ids() == []
    b.create_timeout_s = 30
    task = asyncio.create_task(b.create(SandboxSpec()))

    def second_vm_made() -> bool:  # the VM exists; then the caller gives up
        assert not task.done(), "the create ended before its VM was seen"
        return len(cloud.records) >= 2

    await wait_until(second_vm_made, 30.0, 0.01, "the second VM")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(cloud.records) == 2 and cloud.running_ids() == []


def test_registry_builds_the_e2b_backend(cloud):
    b = get_backend("e2b", api_key=cloud.api_key, sdk=cloud.sdk)
    assert isinstance(b, E2BBackend) and b.name == "e2b"


# -- exec --------------------------------------------------------------------------------------
async def test_exec_output_exit_code_env_cwd_and_root(cloud, sandbox):
    res = await sandbox.exec("echo out; echo err >&2; exit 7")
    assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (7, "out\n", "err\n", False)
    res = await sandbox.exec(["printf", "%s|", "a b", "$HOME"], cwd="/tmp", env={"K": "v"})
    assert res.stdout == "a b|$HOME|" and res.exit_code == 0
    assert (await sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await sandbox.exec("echo $K", env={"K": "v"})).stdout == "v\n"
    assert (await sandbox.exec("id -u")).stdout == "0\n"
    runs = [kw for name, kw in cloud.calls if name == "commands.run"]
    assert len(runs) >= 5, "fewer commands.run calls than the five execs"
    assert all(kw["user"] == "root" for kw in runs)


async def test_exec_timeout_kills_the_whole_tree(sandbox):
    res = await sandbox.exec("(sleep 311 &); (setsid sleep 312 &); sleep 313", timeout_s=1)
    assert res.timed_out and res.exit_code is None
    left = await sandbox.exec("ps -eo args | grep -c '^sleep 31[123]' || true")
    assert left.stdout.strip() == "0"
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_exec_background_child_does_not_hold_the_command(sandbox):
    res = await sandbox.exec("sleep 321 >/dev/null 2>&1 & echo started", timeout_s=10)
    assert (res.exit_code, res.stdout, res.timed_out) == (0, "started\n", False)
    left = await sandbox.exec("ps -eo args | grep -c '^sleep 321' || true")
    assert left.stdout.strip() == "1"  # still running: only a timeout kills the tree


async def test_exec_output_is_capped(cloud):
    b = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, max_output_bytes=1000)
    sb = await b.create(SandboxSpec())
    try:
        res = await sb.exec("head -c 50000 /dev/zero | tr '\\0' a; echo tail >&2")
        assert res.truncated and res.stdout.startswith("a" * 1000)
        assert "49000 bytes dropped" in res.stdout
        assert res.stderr == "tail\n" and res.exit_code == 0
    finally:
        await sb.close()


# -- the persistent shell ----------------------------------------------------------------------
async def test_shell_state_exit_codes_and_screen(cloud, sandbox):
    assert (await sandbox.run("cd /tmp && export SG_X=42 && f() { echo fn$1; }")).exit_code == 0
    res = await sandbox.run("pwd; echo $SG_X; f 1; false")
    assert (res.output, res.exit_code) == ("/tmp\n42\nfn1\n", 1)
    assert "__SG_" not in await sandbox.screen()
    assert "stty" not in await sandbox.screen()  # the pty's echo of the init line is gone
    await sandbox.send_keys("printf 'SCREEN-%s\\n' OK<Enter>")
    assert "SCREEN-OK" in await sandbox.screen()
    assert (await sandbox.run("echo back")).output == "back\n"
    (pty,) = [kw for name, kw in cloud.calls if name == "pty.create"]
    assert pty["user"] == "root" and pty["cwd"] == "/app"


async def test_shell_timeout_kills_tree_and_shell_survives(sandbox):
    await sandbox.run("export KEEP=yes")
    res = await sandbox.run("sleep 331 & sleep 332", timeout_s=1)
    assert res.timed_out and res.exit_code is None and "timed out" in res.output
    after = await sandbox.run("echo K=$KEEP; ps -eo args | grep -c '^sleep 33[12]' || true")
    # bash may print its "[1]+ Killed ..." job notice first: that is terminal output too.
    assert after.output.splitlines()[-2:] == ["K=yes", "0"]


async def test_shell_keys_drive_an_interactive_program(sandbox):
    await sandbox.send_keys("cat<Enter>")
    await sandbox.send_keys("hello-cat<Enter>")
    assert "hello-cat" in await sandbox.screen()
    busy = await sandbox.run("echo x")
    assert busy.exit_code is None and "still running" in busy.output
    await sandbox.send_keys("<C-d>")
    assert (await sandbox.run("echo free")).output == "free\n"


# -- files -------------------------------------------------------------------------------------
async def test_files_round_trip_mode_and_errors(cloud, sandbox):
    blob = bytes(range(256)) * 64
    await sandbox.write_file("data/blob.bin", blob)  # relative to the workdir
    assert await sandbox.read_file("/app/data/blob.bin") == blob
    assert await sandbox.read_file("/app/data/blob.bin", max_bytes=3) == b"\x00\x01\x02"
    await sandbox.write_file("/app/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert (await sandbox.exec("stat -c %a /app/run.sh; /app/run.sh")).stdout == "755\nran\n"
    with pytest.raises(SandboxFileNotFoundError, match="/app/missing"):
        await sandbox.read_file("/app/missing")
    with pytest.raises(SandboxPathError, match="directory"):
        await sandbox.read_file("/app/data")
    writes = [kw for name, kw in cloud.calls if name == "files.write"]
    assert writes and all(kw["user"] == "root" for kw in writes)


async def test_path_traversal_refused_before_any_call(cloud, sandbox):
    before = len(cloud.calls)
    with pytest.raises(SandboxPathError):
        await sandbox.write_file("../../../../etc/evil", "x")
    with pytest.raises(SandboxPathError):
        await sandbox.read_file("/app/../../..")
    with pytest.raises(SandboxPathError):
        await sandbox.write_file("/", "x")
    assert len(cloud.calls) == before
    # A symlink to / resolves inside the VM: the write lands in the sandbox, never on the host.
    await sandbox.exec("ln -s / /app/rootlink")
    await sandbox.write_file(f"/app/rootlink/tmp/sg-evil-{sandbox.id}", "x")
    assert (await sandbox.exec(f"cat /tmp/sg-evil-{sandbox.id}")).stdout == "x"
    assert not await asyncio.to_thread(Path(f"/tmp/sg-evil-{sandbox.id}").exists)


async def test_upload_and_download_trees(sandbox, tmp_path: Path):
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "f.txt").write_text("hello")
    (src / "top.sh").write_text("#!/bin/sh\n")
    (src / "top.sh").chmod(0o755)
    await sandbox.upload(src, "/app/tree")
    res = await sandbox.exec("cat /app/tree/sub/f.txt; stat -c %a /app/tree/top.sh")
    assert res.stdout == "hello755\n"
    await sandbox.upload(src / "sub" / "f.txt", "/app/single.txt")
    assert await sandbox.read_file("/app/single.txt") == b"hello"
    await sandbox.download("/app/tree", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "f.txt").read_text() == "hello"
    await sandbox.download("/app/single.txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == "hello"
    with pytest.raises(SandboxFileNotFoundError):
        await sandbox.download("/app/nothing", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        await sandbox.upload(tmp_path / "absent", "/app/x")


# -- lost, closed ------------------------------------------------------------------------------
async def test_lost_sandbox_raises_sandbox_lost(cloud, sandbox):
    await sandbox.run("true")  # a live shell too
    await cloud.expire(sandbox.e2b_id)
    assert not await sandbox.is_alive()
    with pytest.raises(SandboxLostError, match=sandbox.e2b_id):
        await sandbox.exec("echo hi")
    with pytest.raises(SandboxLostError):
        await sandbox.run("echo hi")
    with pytest.raises(SandboxLostError):
        await sandbox.read_file("/app/x")
    with pytest.raises(SandboxLostError):
        await sandbox.write_file("/app/x", "x")
    await sandbox.close()  # closing a lost sandbox is quiet


async def test_close_is_idempotent_and_kills_the_vm(cloud, backend):
    sb = await backend.create(SandboxSpec())
    await sb.run("true")
    assert await sb.is_alive()
    await sb.close()
    await sb.close()
    assert not await sb.is_alive()
    assert sb.e2b_id not in cloud.running_ids()
    assert [kw["sandbox_id"] for name, kw in cloud.calls if name == "kill"] == [sb.e2b_id]
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")
    with pytest.raises(SandboxClosedError):
        await sb.run("true")
    with pytest.raises(SandboxClosedError):
        await sb.read_file("/app/x")


# -- reaping -----------------------------------------------------------------------------------
async def test_sandgym_reap_covers_e2b(cloud, backend, monkeypatch):
    from sandgym.sandboxes.reaper import ReapReport, default_backends, reap_backend

    expired_backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, lease_s=-10)
    expired = await expired_backend.create(SandboxSpec())
    live = await backend.create(SandboxSpec())
    try:
        report = ReapReport()
        await reap_backend(report, backend)
        assert report.removed == [{"backend": "e2b", "id": expired.id}]
        assert live.e2b_id in cloud.running_ids()
        # without a key: a named error entry, nothing touched
        monkeypatch.delenv("E2B_API_KEY", raising=False)
        report = ReapReport()
        await reap_backend(report, E2BBackend(sdk=cloud.sdk))
        assert report.removed == [] and "E2B_API_KEY" in report.errors[0]["error"]
        assert "e2b" not in default_backends()
        monkeypatch.setenv("E2B_API_KEY", "k")
        assert "e2b" in default_backends()
    finally:
        await live.close()
        await expired.close()


async def test_reap_kills_expired_and_ownerless_only(cloud, backend):
    cloud.page_size = 1  # the reaper must walk every page
    live = await backend.create(SandboxSpec())
    expired_backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, lease_s=-10)
    expired = await expired_backend.create(SandboxSpec())
    # A sandbox whose owner process on this host is dead (a crashed server).
    labels = backend.labels_for(SandboxSpec())
    labels[LABEL_OWNER] = "srv-crashed"
    labels[LABEL_OWNER_PID] = "999999999"
    orphan = await cloud.sdk.AsyncSandbox.create(metadata=labels, api_key=cloud.api_key)
    foreign = await cloud.sdk.AsyncSandbox.create(metadata={"x": "y"}, api_key=cloud.api_key)
    try:
        removed = await backend.reap()
        assert sorted(removed) == sorted([expired.id, orphan.sandbox_id])
        running = cloud.running_ids()
        assert live.e2b_id in running and foreign.sandbox_id in running
        assert expired.e2b_id not in running and orphan.sandbox_id not in running
        # A server shutting down removes everything it owns; still never the foreign one.
        assert await backend.reap(only_expired=False) == [live.id]
        assert cloud.running_ids() == [foreign.sandbox_id]
    finally:
        await live.close()
        await expired.close()


# -- the fake's fidelity -----------------------------------------------------------------------
def test_fake_mirrors_the_real_sdk_surface():
    """Every SDK name and parameter the backend uses exists in the installed `e2b` package
    with the same name, so the fake cannot drift into an API E2B does not have."""
    e2b = pytest.importorskip("e2b")
    from tests.fakes import e2b_fake

    fake = e2b_fake.FakeE2BCloud.__new__(e2b_fake.FakeE2BCloud)
    sdk = e2b_fake._make_sdk(fake)
    for name in vars(sdk):
        assert hasattr(e2b, name), name
    for sub, base in [
        ("FileNotFoundException", "NotFoundException"),
        ("SandboxNotFoundException", "NotFoundException"),
        ("SandboxNotRunningException", "TimeoutException"),
        ("CommandExitException", "SandboxException"),
    ]:
        assert issubclass(getattr(e2b, sub), getattr(e2b, base))
        assert issubclass(getattr(sdk, sub), getattr(sdk, base))
    from e2b.sandbox_async.commands.command import Commands
    from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle
    from e2b.sandbox_async.commands.pty import Pty
    from e2b.sandbox_async.filesystem.filesystem import Filesystem

    pairs = [
        (e2b.AsyncSandbox.create, e2b_fake.FakeAsyncSandbox.create),
        (e2b.AsyncSandbox.is_running, e2b_fake.FakeAsyncSandbox.is_running),
        (e2b.AsyncSandbox.list, e2b_fake.FakeAsyncSandbox.list),
        (e2b.AsyncSandbox._cls_kill, e2b_fake.FakeAsyncSandbox._cls_kill),
        (Commands.run, e2b_fake.FakeCommands.run),
        (Commands.kill, e2b_fake.FakeCommands.kill),
        (Pty.create, e2b_fake.FakePty.create),
        (Pty.send_stdin, e2b_fake.FakePty.send_stdin),
        (Pty.kill, e2b_fake.FakePty.kill),
        (Filesystem.read, e2b_fake.FakeFilesystem.read),
        (Filesystem.write, e2b_fake.FakeFilesystem.write),
        (AsyncCommandHandle.wait, e2b_fake.FakeCommandHandle.wait),
        (AsyncCommandHandle.kill, e2b_fake.FakeCommandHandle.kill),
        (AsyncCommandHandle.disconnect, e2b_fake.FakeCommandHandle.disconnect),
    ]
    checked: list[str] = []
    for real, double in pairs:
        real_params = inspect.signature(real).parameters
        for pname, p in inspect.signature(double).parameters.items():
            if p.kind is inspect.Parameter.VAR_KEYWORD or pname in ("self", "cls"):
                continue
            assert pname in real_params, f"{double.__qualname__}({pname}) is not in the SDK"
            checked.append(pname)
    assert checked, "no named parameter of the fake was compared with the SDK"
    assert {"api_key", "request_timeout"} <= set(e2b.ApiParams.__annotations__)


# -- the cross-backend conformance suite, against the fake -------------------------------------
_CONFORMANCE = Path(__file__).resolve().parents[1] / "integration" / "test_conformance.py"
#: Limits E2B sets per template, not per create call: not promises of this backend. Users: the
#: fake maps root alone (real E2B runs any user its template has; not run here: no key)
_NOT_FOR_E2B = {
    "test_memory_hog_is_killed",
    "test_fork_bomb_is_contained",
    "test_exec_as_another_user_takes_that_users_primary_group_or_is_refused",
}


def _conformance_checks() -> dict[str, object]:
    spec = importlib.util.spec_from_file_location("_sg_conformance", _CONFORMANCE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {
        name: fn
        for name, fn in vars(mod).items()
        if name.startswith("test_") and inspect.iscoroutinefunction(fn) and name not in _NOT_FOR_E2B
    }


_CHECKS = _conformance_checks() if _CONFORMANCE.is_file() else {}


@pytest.mark.parametrize("check", sorted(_CHECKS))
async def test_conformance_suite_on_the_fake(check, backend, tmp_path: Path):
    made = []

    async def make(**kw):
        sb = await backend.create(SandboxSpec(**kw))
        made.append(sb)
        return sb

    # the fake cloud's sandboxes are bubblewrap sandboxes on this host: a public one shares the
    # host's network, as a local one does (the conformance suite's network probe needs to know)
    make.backend_name = "local"  # type: ignore[attr-defined]
    fn = _CHECKS[check]
    try:
        if "tmp_path" in inspect.signature(fn).parameters:  # type: ignore[arg-type]
            await fn(make, tmp_path)  # type: ignore[operator]
        else:
            await fn(make)  # type: ignore[operator]
    finally:
        for sb in made:
            await sb.close()
