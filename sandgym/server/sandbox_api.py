"""The sandbox API's server side (protocol 1.2): plain sandboxes over HTTP, beside the episodes.

`SandboxApi` leases sandboxes from the server's one warm pool (`EnvService.pool`), so they carry
the same labels and leases and the same reaper removes what a crashed server left;
`sandbox_router` serves the routes of `sandgym.wire.sandbox_protocol`. A created environment is
keyed by its content: the caller's `environment/` tar is unpacked once per content into the
cache (`<cache>/sandbox-envs/`), turned into a `SandboxSpec` by the task layer's own code (the
Harbor loader's compose handling, `sandbox_spec_for`'s image map, Dockerfile rewrites and
network clamp), and acquired from the pool; equal environments share one pool key, so repeated
trials start from a ready sandbox.

A sandbox whose caller stops asking (a killed Harbor job) is closed after its idle timeout
(`CreateSandboxRequest.idle_timeout_s`, default `ServerSettings.idle_timeout_s`); sandboxes
and episodes together stay under `max_sessions` (one limit shared by both APIs), and below the
host's memory floor the pool refuses a new one (`HostMemoryError`, answered `capacity`).
`to_sandbox_error` is the ONE place an exception becomes a sandbox API error code; its retryable
flag is the code's row of `sandgym.wire.codes`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gzip
import hashlib
import io
import logging
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from sandgym.sandboxes import Sandbox, SandboxSpec
from sandgym.sandboxes import errors as sbx
from sandgym.sandboxes.network import NetworkPolicy, clamp
from sandgym.sandboxes.pool import PoolClosedError, PoolTimeoutError
from sandgym.tasks.cache import cached_tree
from sandgym.tasks.errors import TaskError
from sandgym.tasks.loaders.compose import harbor_environment
from sandgym.tasks.models import AnswerSpec, EnvironmentSpec, TaskSpec, VerifierSpec
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from sandgym.wire.codes import retryable_for
from sandgym.wire.sandbox_protocol import (
    SANDBOX_API_PREFIX,
    SANDBOX_ERROR_STATUS,
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

if TYPE_CHECKING:
    from sandgym.server.sessions import EnvService

log = logging.getLogger(__name__)

#: the label marking a sandbox of this API (beside the labels every sandbox carries)
LABEL_API = "sandgym.api"
#: the longest a command may run when the request names no timeout
MAX_EXEC_S = 6 * 3600.0
#: the largest environment tar accepted, unpacked
MAX_ENVIRONMENT_BYTES = 512 * 1024 * 1024


# -- errors ------------------------------------------------------------------------------------
class SandboxApiError(Exception):
    """Base of the errors this module raises itself."""


class UnknownSandboxError(SandboxApiError, LookupError):
    """No sandbox of that id is held."""


class EnvironmentInvalidError(SandboxApiError, ValueError):
    """The environment definition cannot be used."""


class SandboxCapacityError(SandboxApiError, RuntimeError):
    """The server holds as many sandboxes and episodes as it may."""


class ApiError(NamedTuple):
    code: SandboxErrorCode
    message: str
    retryable: bool


def _api_error(code: SandboxErrorCode, message: str, condition: str | None = None) -> ApiError:
    """The error `code` with its retryable flag from the one table (sandgym.wire.codes)."""
    return ApiError(code, message, retryable_for("sandbox", code, condition))


def to_sandbox_error(exc: BaseException) -> ApiError:
    """Map any exception to the one sandbox API error code that describes it."""

    msg = str(exc) or type(exc).__name__
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        return _api_error("invalid_request", f"{where}: {first['msg']}")
    if isinstance(exc, UnknownSandboxError):
        return _api_error("unknown_sandbox", msg)
    if isinstance(exc, SandboxCapacityError):
        return _api_error("capacity", msg)
    if isinstance(exc, PoolTimeoutError):
        return _api_error("capacity", f"no sandbox available: {msg}")
    if isinstance(exc, PoolClosedError):
        return _api_error("internal", f"server shutting down: {msg}", "pool_closed")
    if isinstance(
        exc,
        EnvironmentInvalidError
        | TaskError
        | sbx.SandboxGroupUnsupportedError
        | sbx.UserUnsupportedError,
    ):
        return _api_error("environment_invalid", msg)
    if isinstance(exc, sbx.NetworkPolicyUnsupportedError):
        return _api_error("network_unsupported", msg)
    if isinstance(exc, sbx.SandboxCreateError):
        return _api_error("build_failed", msg)
    if isinstance(exc, sbx.CommandTimeoutError):
        return _api_error("exec_timeout", msg)
    if isinstance(exc, sbx.SandboxLostError | sbx.SandboxClosedError):
        return _api_error("sandbox_lost", msg)
    if isinstance(exc, sbx.SandboxFileNotFoundError):
        return _api_error("file_not_found", msg)
    if isinstance(exc, sbx.SandboxPathError):
        return _api_error("invalid_request", msg)
    log.exception("sandbox API: internal error", exc_info=exc)
    return _api_error("internal", f"internal error: {type(exc).__name__}: {msg}")


# -- environments ------------------------------------------------------------------------------
def _policy(net: SandboxNetwork) -> NetworkPolicy:
    try:
        return NetworkPolicy(mode=net.mode, allowed_hosts=tuple(net.allowed_hosts))
    except ValidationError as exc:
        raise sbx.NetworkPolicyUnsupportedError(
            f"network {net.mode} {net.allowed_hosts}: {exc.errors()[0]['msg']}"
        ) from None


def _wire(policy: NetworkPolicy) -> SandboxNetwork:
    return SandboxNetwork(mode=policy.mode, allowed_hosts=list(policy.allowed_hosts))


def _unpack_environment(data: str) -> Path:
    """The caller's environment tar, unpacked once per content: `<cache>/sandbox-envs/env-<sha>`
    holding `environment/` (a Harbor task directory's layout, as the task loader reads it)."""

    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EnvironmentInvalidError(f"environment_tar: expected base64, found {exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise EnvironmentInvalidError(f"environment_tar: bad gzip data: {exc}") from None
    if len(raw) > MAX_ENVIRONMENT_BYTES:
        raise EnvironmentInvalidError(
            f"environment_tar: expected at most {MAX_ENVIRONMENT_BYTES} bytes, found {len(raw)}"
        )
    digest = hashlib.sha256(raw).hexdigest()[:24]

    def fill(tmp: Path) -> None:
        env_dir = tmp / "environment"
        env_dir.mkdir(parents=True)
        try:
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
                tar.extractall(env_dir, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise EnvironmentInvalidError(f"environment_tar: not a usable tar: {exc}") from None

    return cached_tree("sandbox-envs", "env", digest, fill)


def _spec_of(
    req: CreateSandboxRequest, image_map: dict[str, str], ceiling: NetworkPolicy | None
) -> tuple[SandboxSpec, bool]:
    """The `SandboxSpec` of a create request and whether the ceiling clamped a policy. Blocking
    (reads and hashes files): run in a thread."""

    env = req.environment
    if env.gpus:
        raise EnvironmentInvalidError(
            f"environment.gpus: expected 0 (no sandbox backend here allocates GPUs), "
            f"found {env.gpus}"
        )
    root: Path | None = None
    build_context = None
    if req.environment_tar is not None:
        root = _unpack_environment(req.environment_tar)
        env_dir = root / "environment"
        if (env_dir / "Dockerfile").is_file():
            build_context = env_dir
        elif not (env_dir / "docker-compose.yaml").is_file() and env.docker_image is None:
            raise EnvironmentInvalidError(
                "environment_tar: expected a Dockerfile or docker-compose.yaml at its top "
                "level (or environment.docker_image), found neither"
            )
    asked = [_policy(req.network), *(_policy(n) for n in req.network_later)]
    environment = EnvironmentSpec(
        image=None if build_context is not None else env.docker_image,
        build_context=build_context,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network=asked[0],
        env=dict(env.env),
        workdir=env.workdir,
    )
    if root is not None:  # environment/docker-compose.yaml: services, main's build and env
        environment = harbor_environment(root, {}, environment, root / "environment")
    task = TaskSpec(
        id="sandbox/" + (root.name if root is not None else "image"),
        instruction="(sandbox API)",
        environment=environment,
        # never run: the sandbox API scores nothing (a TaskSpec needs some verifier)
        verifier=VerifierSpec(kind="answer", answer=AnswerSpec(ground_truth="")),
        source_format="harbor",
        source_dir=root,
    )
    spec = sandbox_spec_for(task, image_map)
    policies = [clamp(p, ceiling) for p in asked]
    spec = spec.model_copy(
        update={
            "network": policies[0],
            "network_later": tuple(dict.fromkeys(p for p in policies[1:] if p != policies[0])),
            "user": req.user,
            "cpus": env.cpus,
            "memory_mb": env.memory_mb,
            "storage_mb": env.storage_mb,
            "labels": {LABEL_API: "sandbox"},
        }
    )
    return SandboxSpec.model_validate(spec.model_dump()), policies != asked


# -- leases ------------------------------------------------------------------------------------
@dataclass(eq=False)
class Lease:
    """One sandbox the API handed out, until closed or idle past its timeout."""

    sandbox: Sandbox
    spec: SandboxSpec
    name: str | None
    idle_timeout_s: float
    acquire_s: float
    clamped: bool
    fingerprint: str
    started: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    busy: int = 0

    def info(self, now: float, alive: bool = True) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=self.sandbox.id,
            name=self.name,
            backend=self.sandbox.backend_name,
            fingerprint=self.fingerprint,
            alive=alive,
            from_pool=self.sandbox.from_pool,
            acquire_s=round(self.acquire_s, 4),
            workdir=self.spec.workdir,
            user=self.spec.user,
            network=_wire(self.sandbox.network),
            networks=[_wire(p) for p in self.spec.network_policies],
            network_clamped=self.clamped,
            age_s=round(now - self.started, 3),
            idle_s=round(0.0 if self.busy else now - self.last_active, 3),
            idle_timeout_s=self.idle_timeout_s,
        )


class SandboxApi:
    """The sandboxes of the API, leased from `service.pool`."""

    def __init__(self, service: EnvService) -> None:
        self.service = service
        self.leases: dict[str, Lease] = {}
        self._creating = 0
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="sandgym-sandbox-api-sweep")

    async def stop(self) -> None:
        """Close every sandbox; survives cancellation."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        leases = list(self.leases.values())
        self.leases.clear()
        await asyncio.shield(asyncio.gather(*(self._release(x) for x in leases)))

    async def _release(self, lease: Lease) -> None:
        pool = self.service.pool
        try:
            if pool is not None:
                # no one-for-one refill: the warm target is the operator's, not the count held
                await pool.release(lease.sandbox, replace=False)
            else:
                await lease.sandbox.close()
        except Exception:
            log.exception("sandbox API: releasing %s failed", lease.sandbox.id)

    async def _sweep_loop(self) -> None:
        interval = min(5.0, self.service.settings.sweep_interval_s)
        while True:
            await asyncio.sleep(interval)
            await self.sweep()

    async def sweep(self) -> list[str]:
        """Close the sandboxes idle past their timeout (no request for that long); their ids."""
        now = time.monotonic()
        idle = [
            x for x in self.leases.values() if not x.busy and now - x.last_active > x.idle_timeout_s
        ]
        for lease in idle:
            log.info(
                "sandbox API: closing %s (%s), idle %.0fs past its timeout of %.0fs",
                lease.sandbox.id,
                lease.name,
                now - lease.last_active,
                lease.idle_timeout_s,
            )
            self.leases.pop(lease.sandbox.id, None)
            await self._release(lease)
        return [x.sandbox.id for x in idle]

    def _lease(self, sandbox_id: str) -> Lease:
        lease = self.leases.get(sandbox_id)
        if lease is None:
            raise UnknownSandboxError(
                f"no sandbox {sandbox_id!r} on this server (closed, idle past its timeout, "
                "or never made)"
            )
        return lease

    @contextlib.asynccontextmanager
    async def _using(self, sandbox_id: str) -> Any:
        lease = self._lease(sandbox_id)
        lease.busy += 1
        try:
            yield lease
        finally:
            lease.busy -= 1
            lease.last_active = time.monotonic()

    # -- requests ----------------------------------------------------------------------------
    async def create(self, req: CreateSandboxRequest) -> SandboxInfo:
        svc = self.service
        assert svc.pool is not None and svc.backend is not None
        held = len(svc.sessions) + svc.resetting + len(self.leases) + self._creating
        if held >= svc.settings.max_sessions:
            raise SandboxCapacityError(
                f"server is at capacity: expected fewer than max_sessions="
                f"{svc.settings.max_sessions} (one limit shared by sandboxes and episodes), found "
                f"{len(self.leases) + self._creating} sandboxes and "
                f"{len(svc.sessions) + svc.resetting} episodes held or starting"
            )
        self._creating += 1
        try:
            spec, clamped = await asyncio.to_thread(
                _spec_of, req, dict(svc.settings.image_map), svc.settings.network_ceiling_policy()
            )
            svc.backend.check_network(spec)
            svc.backend.check_services(spec)
            fingerprint = await asyncio.to_thread(spec.fingerprint, svc.backend.name)
            t0 = time.perf_counter()
            sandbox = await svc.pool.acquire(spec, timeout_s=req.environment.build_timeout_s)
            acquire_s = time.perf_counter() - t0
        finally:
            self._creating -= 1
        lease = Lease(
            sandbox=sandbox,
            spec=spec,
            name=req.name,
            idle_timeout_s=req.idle_timeout_s or svc.settings.idle_timeout_s,
            acquire_s=acquire_s,
            clamped=clamped,
            fingerprint=fingerprint,
        )
        self.leases[sandbox.id] = lease
        return lease.info(time.monotonic())

    async def info(self, sandbox_id: str) -> SandboxInfo:
        async with self._using(sandbox_id) as lease:
            alive = not lease.sandbox.closed and await lease.sandbox.is_alive()
            return lease.info(time.monotonic(), alive=alive)

    def list(self) -> SandboxList:
        now = time.monotonic()
        infos = [x.info(now) for x in self.leases.values()]
        return SandboxList(count=len(infos), sandboxes=infos)

    async def close(self, sandbox_id: str) -> SandboxClosedReply:
        lease = self._lease(sandbox_id)
        self.leases.pop(sandbox_id, None)
        await self._release(lease)
        return SandboxClosedReply(sandbox_id=sandbox_id, closed=True)

    async def exec(self, sandbox_id: str, req: ExecRequest) -> ExecReply:
        async with self._using(sandbox_id) as lease:
            timeout_s = req.timeout_s or MAX_EXEC_S
            res = await lease.sandbox.exec(
                req.command, timeout_s=timeout_s, cwd=req.cwd, env=req.env, user=req.user
            )
            if res.timed_out or res.exit_code is None:
                raise sbx.CommandTimeoutError(
                    f"command timed out after {timeout_s:g} seconds and was killed "
                    f"(sandbox {sandbox_id})"
                )
            return ExecReply(
                exit_code=res.exit_code,
                stdout=res.stdout,
                stderr=res.stderr,
                duration_s=round(res.duration_s, 4),
                truncated=res.truncated,
            )

    async def set_network(self, sandbox_id: str, req: SetNetworkRequest) -> SandboxInfo:
        async with self._using(sandbox_id) as lease:
            policy = clamp(_policy(req.network), self.service.settings.network_ceiling_policy())
            await lease.sandbox.set_network(policy)
            return lease.info(time.monotonic())

    async def put_files(self, sandbox_id: str, directory: str, body: bytes) -> FilesReply:
        """Unpack the tar `body` into `directory` (made as root when missing); each top-level
        entry is uploaded on its own, so `directory`'s own mode and owner stay as they were."""
        if not directory.startswith("/"):
            raise sbx.SandboxPathError(f"path: expected an absolute path, found {directory!r}")
        async with self._using(sandbox_id) as lease:
            with tempfile.TemporaryDirectory(prefix="sandgym-put-") as tmp:
                names = await asyncio.to_thread(_extract, body, Path(tmp))
                if names:
                    made = await lease.sandbox.exec(["mkdir", "-p", directory], user="root")
                    if made.exit_code != 0:
                        raise sbx.SandboxPathError(
                            f"cannot make directory {directory!r} in sandbox {sandbox_id}: "
                            f"{(made.stderr or made.stdout).strip()}"
                        )
                for name in names:
                    await lease.sandbox.upload(Path(tmp) / name, posixpath.join(directory, name))
            return FilesReply(path=directory, entries=len(names))

    async def get_files(self, sandbox_id: str, path: str) -> bytes:
        """A tar whose one top-level entry is `path` (file or directory), under its base name."""
        if not path.startswith("/"):
            raise sbx.SandboxPathError(f"path: expected an absolute path, found {path!r}")
        name = posixpath.basename(path.rstrip("/")) or "root"
        async with self._using(sandbox_id) as lease:
            with tempfile.TemporaryDirectory(prefix="sandgym-get-") as tmp:
                await lease.sandbox.download(path, Path(tmp) / name)
                return await asyncio.to_thread(_pack, Path(tmp) / name, name)


def _extract(body: bytes, dest: Path) -> list[str]:
    """Unpack an upload's tar into `dest` (tarfile's data filter: nothing lands outside it);
    the top-level names it held."""
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise sbx.SandboxPathError(f"upload: expected a tar body, found {exc}") from None
    return sorted(p.name for p in dest.iterdir())


def _pack(source: Path, name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(source), arcname=name)
    return buf.getvalue()


# -- routes ------------------------------------------------------------------------------------
def _error_response(exc: BaseException) -> JSONResponse:
    err = to_sandbox_error(exc)
    body = SandboxErrorBody(code=err.code, message=err.message, retryable=err.retryable)
    return JSONResponse(body.model_dump(), status_code=SANDBOX_ERROR_STATUS[err.code])


def _json(reply: BaseModel) -> Response:
    return Response(reply.model_dump_json(), media_type="application/json")


def sandbox_router(
    api: SandboxApi, token_ok: Callable[[str | None, str | None], bool]
) -> APIRouter:
    """The routes of the sandbox API. `token_ok(header, query)` is the server's token check;
    a request without the token gets `unauthorized` (HTTP 401) in the API's own error body."""
    router = APIRouter(prefix=SANDBOX_API_PREFIX)

    async def guarded(request: Request, call: Callable[[], Any]) -> Response:
        if not token_ok(request.headers.get("authorization"), request.query_params.get("token")):
            body = SandboxErrorBody(
                code="unauthorized",
                message="unauthorized: expected header 'Authorization: Bearer <token>'",
                retryable=retryable_for("sandbox", "unauthorized"),
            )
            return JSONResponse(body.model_dump(), status_code=401)
        try:
            return await call()
        except Exception as exc:
            return _error_response(exc)

    @router.post("")
    async def create(request: Request) -> Response:
        async def call() -> Response:
            req = CreateSandboxRequest.model_validate_json(await request.body())
            return _json(await api.create(req))

        return await guarded(request, call)

    @router.get("")
    async def list_sandboxes(request: Request) -> Response:
        async def call() -> Response:
            return _json(api.list())

        return await guarded(request, call)

    @router.get("/{sandbox_id}")
    async def info(sandbox_id: str, request: Request) -> Response:
        async def call() -> Response:
            return _json(await api.info(sandbox_id))

        return await guarded(request, call)

    @router.delete("/{sandbox_id}")
    async def close(sandbox_id: str, request: Request) -> Response:
        async def call() -> Response:
            return _json(await api.close(sandbox_id))

        return await guarded(request, call)

    @router.post("/{sandbox_id}/exec")
    async def exec_(sandbox_id: str, request: Request) -> Response:
        async def call() -> Response:
            req = ExecRequest.model_validate_json(await request.body())
            return _json(await api.exec(sandbox_id, req))

        return await guarded(request, call)

    @router.post("/{sandbox_id}/network")
    async def network(sandbox_id: str, request: Request) -> Response:
        async def call() -> Response:
            req = SetNetworkRequest.model_validate_json(await request.body())
            return _json(await api.set_network(sandbox_id, req))

        return await guarded(request, call)

    @router.put("/{sandbox_id}/files")
    async def put_files(sandbox_id: str, path: str, request: Request) -> Response:
        async def call() -> Response:
            return _json(await api.put_files(sandbox_id, path, await request.body()))

        return await guarded(request, call)

    @router.get("/{sandbox_id}/files")
    async def get_files(sandbox_id: str, path: str, request: Request) -> Response:
        async def call() -> Response:
            data = await api.get_files(sandbox_id, path)
            return Response(data, media_type=TAR_CONTENT_TYPE)

        return await guarded(request, call)

    return router
