"""A backend's own failure is never read as a plausible answer (issue 21, item 7).

- docker: when the engine fails to report an exec's exit status (`exec_inspect` raises), `exec`
  raises a named error; it used to return `exit_code=None`, which reads as a timeout's result.
- e2b: when asking E2B whether a sandbox still runs fails, the caller gets a named error; it used
  to take any such failure for "still running" and report a plain failure of the call instead.
  `is_alive` still answers False then, but the failure is logged and counted.

The docker case drives the real `DockerSandbox.exec` against a stand-in for docker-py's low-level
API (a real socket carries the multiplexed output), so it needs no engine; the e2b case uses the
in-process E2B fake (tests/fakes/e2b_fake.py) with one SDK call made to fail.
"""

from __future__ import annotations

import shutil
import socket as pysocket
import struct
from pathlib import Path
from typing import Any

import pytest

from sandgym.sandboxes.common.tolerated import TOLERATED
from sandgym.sandboxes.errors import BackendUnavailableError, SandboxError, SandboxLostError
from sandgym.sandboxes.spec import SandboxSpec


class FakeDockerAPI:
    """The few low-level docker-py calls `DockerSandbox.exec` makes, for one running container.

    `exec_start` returns one end of a socketpair carrying Docker's multiplexed frames (stdout
    "hi\\n"), then closed; `exec_inspect` answers `inspect` (an exception is raised)."""

    def __init__(self, inspect: Any) -> None:
        self.inspect = inspect

    def exec_create(self, container: str, cmd: list[str], **kwargs: Any) -> dict[str, str]:
        return {"Id": "exec-1"}

    def exec_start(self, exec_id: str, tty: bool = False, socket: bool = False) -> Any:
        ours, theirs = pysocket.socketpair()
        payload = b"hi\n"
        ours.sendall(struct.pack(">BxxxL", 1, len(payload)) + payload)
        ours.close()
        return theirs

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        if isinstance(self.inspect, BaseException):
            raise self.inspect
        return dict(self.inspect)

    def inspect_container(self, container: str) -> dict[str, Any]:
        return {"State": {"Status": "running"}}

    def put_archive(self, *args: Any, **kwargs: Any) -> bool:
        return True


class _Client:
    def __init__(self, api: FakeDockerAPI) -> None:
        self.api = api


def _docker_sandbox(tmp_path: Path, api: FakeDockerAPI) -> Any:
    pytest.importorskip("docker")
    from sandgym.sandboxes.docker import DockerBackend, DockerSandbox

    backend = DockerBackend(owner_id="test", bridge_root=str(tmp_path / "bridge"))
    backend.engine._client = _Client(api)  # what `engine.client()` hands out once connected
    return DockerSandbox(
        SandboxSpec(),
        backend.engine,
        "c0ffee",
        "sg-000000000000",
        confine=backend.confine,
        labels=dict,
    )


async def test_docker_exec_reads_exit_status_from_the_engine(tmp_path: Path) -> None:
    sb = _docker_sandbox(tmp_path, FakeDockerAPI({"Running": False, "ExitCode": 3}))
    result = await sb.exec("true")
    assert (result.exit_code, result.stdout, result.timed_out) == (3, "hi\n", False)


async def test_docker_exec_engine_failure_is_an_error_not_a_timeouts_result(
    tmp_path: Path,
) -> None:
    import docker.errors

    api = FakeDockerAPI(docker.errors.APIError("500 Server Error: engine hiccup"))
    sb = _docker_sandbox(tmp_path, api)
    with pytest.raises(SandboxError, match="expected its exit status") as info:
        await sb.exec("true")
    assert not isinstance(info.value, SandboxLostError)  # the container still runs
    assert "engine hiccup" in str(info.value)


# -- e2b ---------------------------------------------------------------------------------------
@pytest.fixture
async def e2b_sandbox(tmp_path: Path) -> Any:
    if shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        pytest.skip("the E2B fake runs its VMs with bubblewrap + nsenter, not installed")
    from sandgym.sandboxes.e2b import E2BBackend
    from tests.fakes.e2b_fake import FakeE2BCloud

    cloud = FakeE2BCloud(root=tmp_path / "cloud")
    backend = E2BBackend(api_key=cloud.api_key, sdk=cloud.sdk, request_timeout_s=10)
    sb = await backend.create(SandboxSpec())
    try:
        yield sb
    finally:
        await sb.close()
        await backend.aclose()
        await cloud.aclose()


def _fail(exc: BaseException) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return call


async def test_e2b_unanswered_liveness_probe_is_a_named_error(
    e2b_sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    sb = e2b_sandbox
    monkeypatch.setattr(sb._sbx.files, "write", _fail(RuntimeError("write went wrong")))
    monkeypatch.setattr(sb._sbx, "is_running", _fail(httpx.ConnectError("dns error: e2b.app")))
    with pytest.raises(BackendUnavailableError, match="cannot be reached"):
        await sb.write_file("/app/x", "y")


async def test_e2b_failing_probe_says_so_and_never_guesses_running(
    e2b_sandbox: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = e2b_sandbox
    monkeypatch.setattr(sb._sbx.files, "write", _fail(RuntimeError("write went wrong")))
    monkeypatch.setattr(sb._sbx, "is_running", _fail(ValueError("bad answer")))
    with pytest.raises(SandboxError, match="expected E2B to say whether") as info:
        await sb.write_file("/app/x", "y")
    assert "bad answer" in str(info.value)
    before = TOLERATED["e2b.is_alive"]
    assert await sb.is_alive() is False
    assert TOLERATED["e2b.is_alive"] == before + 1
