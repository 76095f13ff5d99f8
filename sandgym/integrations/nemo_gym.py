"""NeMo-Gym's door: `SandgymProvider`, a sandbox provider for NeMo-Gym's sandbox API
(`nemo_gym.sandbox.providers.base.SandboxProvider`, nemo-gym 0.7.0), published under the entry
point group `nemo_gym.sandbox_providers` as `sandgym` (pyproject.toml), on sandgym's sandbox
API (protocol 1.2, sandgym/client/sandbox_client.py).

    # a NeMo-Gym sandbox provider config (YAML):
    #   sandbox_provider:
    #     sandgym: {server_url: http://127.0.0.1:8765, default_image: sandgym/terminal}

`server_url` may be a fleet (`sandgym.client.fleet`): `http://a:8765,http://b:8765` or
`ray:auto`; sandboxes are placed over its servers and a command in a sandbox whose server is
lost comes back as NeMo-Gym's infrastructure result (125, "sandbox").

Mapping: `create(SandboxSpec)` -> `POST /v1/sandboxes` (image, workdir, env, cpu, memory_mib,
disk_gib, gpu; the provider's network policy), `exec` -> an exec request (stdout, stderr and
exit code apart; a timeout or a lost sandbox comes back as NeMo-Gym's providers report them:
return code 125 with `error_type` "timeout" or "sandbox"), `upload_file` / `download_file` ->
the files endpoints, `status` -> is-alive (RUNNING / STOPPED), `close` -> close, `aclose` ->
the HTTP client's. `ttl_s`, `ports` and `entrypoint` are not offered by the sandbox API: a spec
that asks for them is refused (`SandboxCreateError`), never silently ignored; idle sandboxes
are freed by the server's idle timeout (`idle_timeout_s`).

nemo-gym 0.5 to 0.7 require Python >= 3.13.14 (sandgym itself runs on 3.11 and up), so the
package is never imported at module load: its types are imported where they are used.
tests/e2e/test_integration_nemo_gym.py runs this provider through the released wheel's own
`providers/base.py` and `providers/registry.py` (entry-point discovery, `create_provider`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandgym.client.sandbox_client import (
    ExecTimeoutError,
    SandboxApiError,
    SandboxClient,
    SandboxLostError,
    UnknownSandboxError,
)
from sandgym.wire.sandbox_protocol import (
    CreateSandboxRequest,
    ExecRequest,
    SandboxEnvironment,
    SandboxNetwork,
)

PROVIDER_NAME = "sandgym"
#: what NeMo-Gym's own providers return as the return code of a command that did not exit
SANDBOX_RUNTIME_RETURN_CODE = 125


def _nemo() -> Any:
    from nemo_gym.sandbox.providers import base

    return base


class SandgymProvider:
    """NeMo-Gym sandboxes on a sandgym server (its pool, backends, network policies)."""

    name = PROVIDER_NAME

    def __init__(
        self,
        server_url: str | None = None,
        token: str | None = None,
        default_image: str | None = "sandgym/terminal",
        network_mode: str = "public",
        allowed_hosts: list[str] | None = None,
        idle_timeout_s: float | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self._client = SandboxClient(server_url, token, timeout_s=timeout_s)
        self._default_image = default_image
        self._network = SandboxNetwork(mode=network_mode, allowed_hosts=allowed_hosts or [])  # type: ignore[arg-type]
        self._idle_timeout_s = idle_timeout_s

    async def create(self, spec: Any) -> Any:
        base = _nemo()
        unsupported = [
            n
            for n, v in (
                ("ttl_s", spec.ttl_s),
                ("ports", spec.ports),
                ("entrypoint", spec.entrypoint),
            )
            if v
        ]
        if unsupported:
            raise base.SandboxCreateError(
                f"the sandgym provider cannot honour {', '.join(unsupported)} "
                "(sandgym's sandbox API has no lifetime, port or entrypoint setting)"
            )
        image = spec.image or self._default_image
        if image is None:
            raise base.SandboxCreateError("expected spec.image (or the provider's default_image)")
        res = spec.resources
        request = CreateSandboxRequest(
            environment=SandboxEnvironment(
                docker_image=image,
                workdir=spec.workdir,
                env=dict(spec.env),
                cpus=res.cpu,
                memory_mb=res.memory_mib,
                storage_mb=res.disk_gib * 1024 if res.disk_gib else None,
                gpus=res.gpu or 0,
            ),
            network=self._network,
            name=spec.metadata.get("name") if spec.metadata else None,
            idle_timeout_s=self._idle_timeout_s,
        )
        try:
            info = await self._client.create(request)
        except SandboxApiError as exc:
            raise base.SandboxCreateError(f"sandgym could not create the sandbox: {exc}") from exc
        return base.SandboxHandle(sandbox_id=info.sandbox_id, provider_name=self.name, raw=info)

    async def exec(
        self,
        handle: Any,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> Any:
        base = _nemo()
        request = ExecRequest(
            command=command,
            cwd=cwd,
            env=dict(env or {}),
            user=None if user is None else str(user),
            timeout_s=timeout_s,
        )
        try:
            reply = await self._client.exec(handle.sandbox_id, request)
        except ExecTimeoutError as exc:
            return base.SandboxExecResult(
                stdout=None,
                stderr=str(exc),
                return_code=SANDBOX_RUNTIME_RETURN_CODE,
                error_type="timeout",
            )
        except (SandboxLostError, UnknownSandboxError) as exc:
            return base.SandboxExecResult(
                stdout=None,
                stderr=str(exc),
                return_code=SANDBOX_RUNTIME_RETURN_CODE,
                error_type="sandbox",
            )
        return base.SandboxExecResult(
            stdout=reply.stdout, stderr=reply.stderr, return_code=reply.exit_code
        )

    async def upload_file(self, handle: Any, source_path: Path, target_path: str) -> None:
        await self._client.upload_file(handle.sandbox_id, source_path, target_path)

    async def download_file(self, handle: Any, source_path: str, target_path: Path) -> None:
        await self._client.download_file(handle.sandbox_id, source_path, target_path)

    async def status(self, handle: Any) -> Any:
        status = _nemo().SandboxStatus
        alive = await self._client.is_alive(handle.sandbox_id)
        return status.RUNNING if alive else status.STOPPED

    async def close(self, handle: Any) -> None:
        await self._client.close(handle.sandbox_id)

    async def aclose(self) -> None:
        await self._client.aclose()
