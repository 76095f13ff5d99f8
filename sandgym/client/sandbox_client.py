"""`SandboxClient`: the asyncio client of the sandbox API (protocol 1.2, `/v1/sandboxes`).

It imports only the wire models (`sandgym.wire.sandbox_protocol`) and httpx, never server code, so
an environment provider (Harbor's `sandgym.integrations.harbor`, NeMo-Gym's) loads it without the
server's dependencies. Every call sends one request model and returns one reply model; a failed
request raises the `SandboxApiError` subclass of its code (`error_for_code`), so callers decide
by type, never by message.

One address, one server or a fleet: `url` (or `SANDGYM_URL`) may be one server, a
comma-separated list, or `ray:auto` / `ray://HEAD:PORT` (`sandgym.client.fleet`). With a fleet,
`create` places the sandbox on a server (warm pool first, then most room; a server that refuses
for capacity or does not answer is skipped for the next) and every later call for that sandbox
goes to the server holding it. A call whose server does not answer (refused, reset, died) raises
`ServerLostError`, a `SandboxLostError`: the infrastructure's failure, never the command's; the
fleet holds that server down for a backoff and asks it again after, so one that comes back gets
work again.

Files travel as tar: `upload_file` / `upload_dir` pack a host file or directory,
`download_file` / `download_dir` unpack what the server sends (members that would land outside
the target, links out of it and device files are left out: `tarfile`'s `data` filter).

Example:
    >>> async def main(url, token):  # doctest: +SKIP
    ...     async with SandboxClient(url, token=token) as client:
    ...         info = await client.create(
    ...             CreateSandboxRequest(environment=SandboxEnvironment(docker_image="img"))
    ...         )
    ...         res = await client.exec(info.sandbox_id, ExecRequest(command="echo hi"))
    ...         await client.close(info.sandbox_id)
    ...         return res.stdout
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from sandgym.client.fleet import (
    Fleet,
    FleetUnavailableError,
    parse_fleet,
    request_key,
    shared_fleet,
)
from sandgym.wire.sandbox_protocol import (
    SANDBOX_API_PREFIX,
    TAR_CONTENT_TYPE,
    CreateSandboxRequest,
    ExecReply,
    ExecRequest,
    FilesReply,
    SandboxClosedReply,
    SandboxErrorBody,
    SandboxErrorCode,
    SandboxInfo,
    SandboxList,
    SandboxNetwork,
    SetNetworkRequest,
)

#: Environment variables a client reads when no URL or token is passed.
URL_ENV = "SANDGYM_URL"
TOKEN_ENV = "SANDGYM_TOKEN"


# -- errors: one class per code --------------------------------------------------------------
class SandboxApiError(Exception):
    """A sandbox API request failed; `code` is one of `SANDBOX_ERROR_CODES`."""

    code: SandboxErrorCode = "internal"

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status = status


class InvalidRequestError(SandboxApiError, ValueError):
    """The server refused the request's shape or values."""

    code = "invalid_request"


class UnauthorizedError(SandboxApiError, PermissionError):
    """The bearer token was missing or wrong."""

    code = "unauthorized"


class UnknownSandboxError(SandboxApiError, LookupError):
    """No sandbox of that id (never made, closed, or reaped after its idle timeout)."""

    code = "unknown_sandbox"


class CapacityError(SandboxApiError):
    """The server holds as many sandboxes as it may; retry later."""

    code = "capacity"


class EnvironmentInvalidError(SandboxApiError, ValueError):
    """The environment definition cannot be used (bad tar, compose file, settings)."""

    code = "environment_invalid"


class BuildFailedError(SandboxApiError):
    """The environment's image could not be built or its sandbox not started."""

    code = "build_failed"


class NetworkUnsupportedError(SandboxApiError, ValueError):
    """A network policy the server cannot enforce, or one the sandbox was not created for."""

    code = "network_unsupported"


class SandboxLostError(SandboxApiError, ConnectionError):
    """The sandbox died under the request."""

    code = "sandbox_lost"


class ServerLostError(SandboxLostError):
    """The server holding the sandbox (or asked to make one) did not answer: refused, reset,
    died mid-request. `server` is its HTTP base. Retryable on another sandbox."""

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message, retryable=True)
        self.server = server


class ExecTimeoutError(SandboxApiError, TimeoutError):
    """The command ran past its `timeout_s` and was killed."""

    code = "exec_timeout"


class RemoteFileNotFoundError(SandboxApiError, FileNotFoundError):
    """The path does not exist inside the sandbox."""

    code = "file_not_found"


class InternalError(SandboxApiError):
    """The server failed in a way it did not expect."""

    code = "internal"


_BY_CODE: dict[str, type[SandboxApiError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        UnauthorizedError,
        UnknownSandboxError,
        CapacityError,
        EnvironmentInvalidError,
        BuildFailedError,
        NetworkUnsupportedError,
        SandboxLostError,
        ExecTimeoutError,
        RemoteFileNotFoundError,
        InternalError,
    )
}


def error_for_code(code: str) -> type[SandboxApiError]:
    """The exception class of a wire error code (`InternalError` for one this client does not
    know, so a newer server's code still raises a `SandboxApiError`)."""
    return _BY_CODE.get(code, InternalError)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = SandboxErrorBody.model_validate_json(response.content)
    except ValidationError:
        code = "unauthorized" if response.status_code == 401 else "internal"
        text = response.text[:500]
        raise error_for_code(code)(
            f"HTTP {response.status_code} from the sandbox API: {text}",
            status=response.status_code,
        ) from None
    raise error_for_code(body.code)(
        body.message, retryable=body.retryable, status=response.status_code
    )


# -- tar helpers -------------------------------------------------------------------------------
def pack_environment(directory: Path | str) -> str:
    """base64 of a gzip'd tar of `directory`'s contents (`CreateSandboxRequest.environment_tar`).
    Members are sorted and their owners and times cleared, so equal contents give equal bytes."""
    root = Path(directory)
    buf = io.BytesIO()

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if {".git", "__pycache__", ".DS_Store"} & set(rel.parts):
                continue
            tar.add(str(path), arcname=rel.as_posix(), recursive=False, filter=clean)
    # mtime=0: gzip's header would otherwise hold the time of packing
    return base64.b64encode(gzip.compress(buf.getvalue(), 6, mtime=0)).decode("ascii")


def _tar_of(source: Path, arcname: str | None) -> bytes:
    """A tar of `source`: a file as one member named `arcname`, a directory's contents at the
    top level (arcname None)."""
    if arcname is None and not source.is_dir():
        raise NotADirectoryError(f"expected a host directory to upload, found {source}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if arcname is not None:
            tar.add(str(source), arcname=arcname)
        else:
            for child in sorted(source.iterdir()):
                tar.add(str(child), arcname=child.name)
    return buf.getvalue()


def _data_or_skip(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    if member.isdev() or member.isfifo():
        return None
    return tarfile.data_filter(member, dest)


# -- the client --------------------------------------------------------------------------------
class SandboxClient:
    """One HTTP client of the sandbox API. `url` is the server's base (`http://HOST:PORT`; a
    `ws://` URL is taken as its HTTP twin), a comma-separated list of them, or `ray:ADDRESS`
    (a fleet: `sandgym.client.fleet`); `token` the servers' bearer token. Both default to
    `SANDGYM_URL` / `SANDGYM_TOKEN`. Clients of one address share the process's `Fleet`
    (`shared_fleet`); `fleet` passes another."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV)
        if fleet is None:
            url = url or os.environ.get(URL_ENV)
            if not url:
                raise ValueError(f"expected the server's URL (argument or ${URL_ENV}), found none")
            fleet = (
                Fleet(parse_fleet(url), token, transport=transport)
                if transport is not None
                else shared_fleet(url, token)
            )
        self.fleet = fleet
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._transport = transport
        self.base_url = next(iter(fleet.servers))
        self._timeout_s = timeout_s
        self._clients: dict[str, httpx.AsyncClient] = {}
        #: sandbox id -> the HTTP base of the server holding it
        self.placement: dict[str, str] = {}
        self._http = self._client(self.base_url)

    def _client(self, base: str) -> httpx.AsyncClient:
        c = self._clients.get(base)
        if c is None:
            c = self._clients[base] = httpx.AsyncClient(
                base_url=base,
                headers=self._headers,
                timeout=self._timeout_s,
                transport=self._transport,
            )
        return c

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for c in list(self._clients.values()):
            await c.aclose()

    async def _server_of(self, sandbox_id: str) -> str:
        """The server holding `sandbox_id`: the one that made it for this client, the only one,
        or (an id made by another client of the fleet) the first that knows it."""
        where = self.placement.get(sandbox_id)
        if where is not None:
            return where
        if self.fleet.single:
            return self.base_url
        for base in self.fleet.servers:
            try:
                r = await self._send(base, "GET", f"{SANDBOX_API_PREFIX}/{sandbox_id}")
            except ServerLostError:
                continue
            if r.status_code == 200:
                self.placement[sandbox_id] = base
                return base
        raise UnknownSandboxError(
            f"expected sandbox {sandbox_id!r} on a server of the fleet, found it on none "
            f"({', '.join(self.fleet.servers)})"
        )

    async def _send(self, base: str, method: str, path: str, **kw: Any) -> httpx.Response:
        """One HTTP request to `base`; a transport failure raises ServerLostError (and holds
        the server down in the fleet)."""
        try:
            return await self._client(base).request(method, path, **kw)
        except httpx.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, httpx.TimeoutException) or isinstance(exc, httpx.ConnectTimeout):
                self.fleet.mark_down(base, reason)
            raise ServerLostError(
                f"sandgym server {base} did not answer {method} {path} ({reason})", server=base
            ) from exc

    async def _request(
        self,
        method: str,
        path: str,
        *,
        timeout_s: float | None = None,
        sandbox_id: str | None = None,
        **kw: Any,
    ) -> httpx.Response:
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        base = self.base_url if sandbox_id is None else await self._server_of(sandbox_id)
        response = await self._send(base, method, SANDBOX_API_PREFIX + path, timeout=timeout, **kw)
        _raise_for(response)
        return response

    # -- lifecycle -----------------------------------------------------------------------------
    async def create(self, request: CreateSandboxRequest) -> SandboxInfo:
        """A sandbox of `request`'s environment (built first when needed: allow for its build
        timeout). With a fleet: on the best server (`Fleet.candidates`), the next one when a
        server refuses for capacity or does not answer; `CapacityError` when none has room."""
        key = request_key(request.environment.model_dump_json(), request.environment_tar)
        try:
            servers = await self.fleet.candidates(key)
        except FleetUnavailableError as exc:
            raise CapacityError(str(exc), retryable=True) from exc
        body = request.model_dump_json()
        last: SandboxApiError | None = None
        for base in servers:
            self.fleet.placed(base, key)  # before the request: concurrent creates see it
            try:
                r = await self._send(
                    base,
                    "POST",
                    SANDBOX_API_PREFIX,
                    content=body,
                    headers={"Content-Type": "application/json"},
                    timeout=request.environment.build_timeout_s + self._timeout_s,
                )
                _raise_for(r)
            except BaseException as exc:
                self.fleet.unplace(base, key)
                if self.fleet.single or not isinstance(exc, (ServerLostError, CapacityError)):
                    raise
                last = exc
                continue
            info = SandboxInfo.model_validate_json(r.content)
            self.placement[info.sandbox_id] = base
            self.fleet.learn(key, info.fingerprint)
            return info
        assert last is not None
        raise CapacityError(
            f"expected a server of the fleet to make the sandbox, found none could: {last}",
            retryable=True,
        ) from last

    async def info(self, sandbox_id: str) -> SandboxInfo:
        r = await self._request("GET", f"/{sandbox_id}", sandbox_id=sandbox_id)
        return SandboxInfo.model_validate_json(r.content)

    async def is_alive(self, sandbox_id: str) -> bool:
        """False when the sandbox died or is gone (unknown), True while it runs commands."""
        try:
            return (await self.info(sandbox_id)).alive
        except UnknownSandboxError:
            return False

    async def list(self) -> SandboxList:
        """Every sandbox the server holds (with a fleet: every server that answers)."""
        out: list[SandboxInfo] = []
        for base in self.fleet.servers:
            try:
                r = await self._send(base, "GET", SANDBOX_API_PREFIX)
            except ServerLostError:
                if self.fleet.single:
                    raise
                continue
            _raise_for(r)
            out += SandboxList.model_validate_json(r.content).sandboxes
        return SandboxList(count=len(out), sandboxes=out)

    async def pool_status(self) -> dict[str, Any]:
        """The server's `GET /v1/pool` document as sent (its warm pool per key: `keys`, with
        `ready` and `creating` counts, and its `totals`; docs/sandbox-api.md). With a fleet
        address, the first server's."""
        response = await self._http.get("/v1/pool")
        _raise_for(response)
        return dict(response.json())

    async def close(self, sandbox_id: str) -> bool:
        """Destroy the sandbox; False when it was already closed (or reaped)."""
        try:
            r = await self._request("DELETE", f"/{sandbox_id}", sandbox_id=sandbox_id)
        except UnknownSandboxError:
            self.placement.pop(sandbox_id, None)
            return False
        self.placement.pop(sandbox_id, None)
        return SandboxClosedReply.model_validate_json(r.content).closed

    async def set_network(self, sandbox_id: str, network: SandboxNetwork) -> SandboxInfo:
        r = await self._request(
            "POST",
            f"/{sandbox_id}/network",
            sandbox_id=sandbox_id,
            content=SetNetworkRequest(network=network).model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        return SandboxInfo.model_validate_json(r.content)

    # -- commands ------------------------------------------------------------------------------
    async def exec(self, sandbox_id: str, request: ExecRequest) -> ExecReply:
        """Run one command; a non-zero exit is `ExecReply.exit_code`, a timeout
        `ExecTimeoutError`. With no `timeout_s` the HTTP request waits as long as it takes."""
        wait = None if request.timeout_s is None else request.timeout_s + self._timeout_s
        r = await self._send(
            await self._server_of(sandbox_id),
            "POST",
            f"{SANDBOX_API_PREFIX}/{sandbox_id}/exec",
            content=request.model_dump_json(),
            headers={"Content-Type": "application/json"},
            timeout=httpx.Timeout(self._timeout_s, read=wait),
        )
        _raise_for(r)
        return ExecReply.model_validate_json(r.content)

    # -- files ---------------------------------------------------------------------------------
    async def put_tar(self, sandbox_id: str, directory: str, tar: bytes) -> FilesReply:
        """Unpack `tar` into `directory` inside the sandbox (made when missing)."""
        r = await self._request(
            "PUT",
            f"/{sandbox_id}/files",
            sandbox_id=sandbox_id,
            params={"path": directory},
            content=tar,
            headers={"Content-Type": TAR_CONTENT_TYPE},
            timeout_s=max(self._timeout_s, 600.0),
        )
        return FilesReply.model_validate_json(r.content)

    async def get_tar(self, sandbox_id: str, path: str) -> bytes:
        """A tar holding `path` (file or directory) as its one top-level entry."""
        r = await self._request(
            "GET",
            f"/{sandbox_id}/files",
            sandbox_id=sandbox_id,
            params={"path": path},
            timeout_s=max(self._timeout_s, 600.0),
        )
        return r.content

    async def upload_file(self, sandbox_id: str, source: Path | str, target: str) -> None:
        """Copy the host file `source` to the path `target` inside the sandbox."""
        name = posixpath.basename(target.rstrip("/"))
        if not name:
            raise ValueError(f"expected a file path as target, found {target!r}")
        data = await asyncio.to_thread(_tar_of, Path(source), name)
        await self.put_tar(sandbox_id, posixpath.dirname(target.rstrip("/")) or "/", data)

    async def upload_dir(self, sandbox_id: str, source: Path | str, target: str) -> None:
        """Copy the contents of the host directory `source` into `target` inside the sandbox."""
        data = await asyncio.to_thread(_tar_of, Path(source), None)
        await self.put_tar(sandbox_id, target, data)

    async def download_file(self, sandbox_id: str, source: str, target: Path | str) -> None:
        """Copy the sandbox file `source` to the host path `target` (parents made)."""
        data = await self.get_tar(sandbox_id, source)
        await asyncio.to_thread(_unpack, data, source, Path(target), False)

    async def download_dir(self, sandbox_id: str, source: str, target: Path | str) -> None:
        """Copy the sandbox directory `source`'s contents into the host directory `target`
        (made when missing; files there are overwritten)."""
        data = await self.get_tar(sandbox_id, source)
        await asyncio.to_thread(_unpack, data, source, Path(target), True)


def _unpack(data: bytes, source: str, dst: Path, is_dir: bool) -> None:
    """Unpack a download's tar (one top-level entry, `source`'s base name) to `dst`: a
    directory's contents merged into `dst`, a file moved to `dst`."""
    parent = dst if is_dir else dst.parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(tmp, filter=_data_or_skip)
        entries = list(Path(tmp).iterdir())
        found = "nothing" if not entries else ("a directory" if entries[0].is_dir() else "a file")
        if len(entries) != 1 or entries[0].is_dir() != is_dir:
            want = "a directory" if is_dir else "a file"
            raise (NotADirectoryError if is_dir else IsADirectoryError)(
                f"expected {source!r} to be {want} in the sandbox, found {found}"
            )
        if is_dir:
            shutil.copytree(entries[0], dst, dirs_exist_ok=True, symlinks=True)
        else:
            shutil.move(str(entries[0]), dst)


__all__ = [
    "BuildFailedError",
    "CapacityError",
    "EnvironmentInvalidError",
    "ExecTimeoutError",
    "InternalError",
    "InvalidRequestError",
    "NetworkUnsupportedError",
    "RemoteFileNotFoundError",
    "SandboxApiError",
    "SandboxClient",
    "SandboxLostError",
    "ServerLostError",
    "UnauthorizedError",
    "UnknownSandboxError",
    "error_for_code",
    "pack_environment",
]
