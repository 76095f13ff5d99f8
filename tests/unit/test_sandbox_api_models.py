"""The sandbox API's wire models (protocol 1.2) and the client's named errors."""

from __future__ import annotations

import base64
import io
import tarfile

import httpx
import pytest
from pydantic import ValidationError

from sandgym.client import sandbox_client as sc
from sandgym.wire import protocol as p
from sandgym.wire import sandbox_protocol as sp


def test_the_episode_protocol_does_not_reexport_the_sandbox_models() -> None:
    """The facade went (issue 57): the sandbox API's models have one home, sandbox_protocol."""
    names = ("CreateSandboxRequest", "ExecRequest", "ExecReply", "SandboxInfo", "SandboxErrorBody")
    assert [n for n in names if not hasattr(sp, n)] == []
    assert [n for n in names if hasattr(p, n)] == [], "sandgym.wire.protocol re-exports them"
    assert sp.SANDBOX_API_VERSION == "1.2"


def test_create_needs_an_environment() -> None:
    with pytest.raises(ValidationError, match="environment_tar .* or environment.docker_image"):
        sp.CreateSandboxRequest()
    ok = sp.CreateSandboxRequest(environment_tar="AA==")
    assert ok.network == sp.SandboxNetwork(mode="public")
    assert ok.user is None and ok.environment.memory_mb is None  # Harbor: unset = no limit


def test_unknown_fields_and_bad_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        sp.ExecRequest.model_validate({"command": "ls", "tty": True})
    with pytest.raises(ValidationError, match="empty argv"):
        sp.ExecRequest(command=[])
    with pytest.raises(ValidationError):
        sp.ExecRequest(command="ls", timeout_s=0)
    with pytest.raises(ValidationError, match="only valid with mode 'allowlist'"):
        sp.SandboxNetwork(mode="public", allowed_hosts=["pypi.org"])
    with pytest.raises(ValidationError):
        sp.SandboxEnvironment(memory_mb=8)


def test_every_error_code_has_a_status_and_a_class() -> None:
    assert set(sp.SANDBOX_ERROR_STATUS) == set(sp.SANDBOX_ERROR_CODES)
    assert sp.SANDBOX_ERROR_CODES, "no sandbox error code to check"
    for code in sp.SANDBOX_ERROR_CODES:
        cls = sc.error_for_code(code)
        assert cls.code == code, (code, cls)
    assert issubclass(sc.ExecTimeoutError, TimeoutError)
    assert issubclass(sc.RemoteFileNotFoundError, FileNotFoundError)
    assert sc.error_for_code("from_a_newer_server") is sc.InternalError
    with pytest.raises(ValidationError):
        sp.SandboxErrorBody(code="busy", message="x")  # type: ignore[arg-type]


def _client(handler) -> sc.SandboxClient:
    return sc.SandboxClient("ws://srv:1/v1/env", token="t", transport=httpx.MockTransport(handler))


async def test_client_raises_the_class_of_the_code_and_sends_the_token() -> None:
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["auth"] = request.headers.get("authorization")
        seen["url"] = str(request.url)
        body = sp.SandboxErrorBody(code="exec_timeout", message="ran past 1s", retryable=False)
        return httpx.Response(408, content=body.model_dump_json())

    async with _client(handler) as client:
        with pytest.raises(sc.ExecTimeoutError, match="ran past 1s") as info:
            await client.exec("sbx-1", sp.ExecRequest(command="sleep 5", timeout_s=1))
    assert info.value.status == 408
    assert seen == {"auth": "Bearer t", "url": "http://srv:1/v1/sandboxes/sbx-1/exec"}


async def test_client_close_and_is_alive_treat_unknown_as_gone() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = sp.SandboxErrorBody(code="unknown_sandbox", message="no sandbox sbx-9")
        return httpx.Response(404, content=body.model_dump_json())

    async with _client(handler) as client:
        assert await client.close("sbx-9") is False
        assert await client.is_alive("sbx-9") is False
        with pytest.raises(sc.UnknownSandboxError):
            await client.info("sbx-9")


async def test_client_non_json_401_is_unauthorized() -> None:
    async with _client(lambda r: httpx.Response(401, text="nope")) as client:
        with pytest.raises(sc.UnauthorizedError):
            await client.list()


def test_pack_environment_is_deterministic_and_skips_git(tmp_path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("a")
    one = sc.pack_environment(tmp_path)
    (tmp_path / "files" / "a.txt").touch()  # a new mtime: same bytes
    assert sc.pack_environment(tmp_path) == one
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(one))) as tar:
        assert sorted(tar.getnames()) == ["Dockerfile", "files", "files/a.txt"]


def test_server_maps_each_failure_to_one_code() -> None:
    from sandgym.sandboxes import errors as sbx
    from sandgym.sandboxes.pool import PoolKeyFailingError, PoolTimeoutError
    from sandgym.server.sandbox_api import (
        EnvironmentInvalidError,
        SandboxCapacityError,
        UnknownSandboxError,
        to_sandbox_error,
    )
    from sandgym.tasks.errors import TaskLoadError

    cases = {
        UnknownSandboxError("x"): "unknown_sandbox",
        SandboxCapacityError("x"): "capacity",
        PoolTimeoutError("x"): "capacity",
        EnvironmentInvalidError("x"): "environment_invalid",
        TaskLoadError("bad compose"): "environment_invalid",
        sbx.SandboxGroupUnsupportedError("x"): "environment_invalid",
        sbx.NetworkPolicyUnsupportedError("x"): "network_unsupported",
        sbx.SandboxCreateError("build failed"): "build_failed",
        PoolKeyFailingError("x", "key", None): "build_failed",
        sbx.CommandTimeoutError("x"): "exec_timeout",
        sbx.SandboxLostError("x"): "sandbox_lost",
        sbx.SandboxClosedError("x"): "sandbox_lost",
        sbx.SandboxFileNotFoundError("x"): "file_not_found",
        sbx.SandboxPathError("x"): "invalid_request",
        RuntimeError("boom"): "internal",
    }
    for exc, code in cases.items():
        err = to_sandbox_error(exc)
        assert err.code == code, (exc, err)
        assert sc.error_for_code(err.code).code == code
    with pytest.raises(ValidationError) as info:
        sp.ExecRequest.model_validate_json('{"command": 3}')
    assert to_sandbox_error(info.value).code == "invalid_request"
    assert to_sandbox_error(PoolTimeoutError("x")).retryable is True
