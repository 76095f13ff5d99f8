"""`SandgymEnvironment`: Harbor's `BaseEnvironment` (harbor 0.26) on sandgym's sandbox API.

Harbor loads it with `harbor run --env sandgym.integrations.harbor:SandgymEnvironment`; it drives a
running `sandgym serve` (local or remote) through `sandgym.client.sandbox_client`, so trials get
sandgym's warm pool (repeated trials of a task start from a ready sandbox), its enforced
network policies (no-network, allowlist of hosts, switched per phase) and its labels and reaper
(a killed job's sandboxes are closed after their idle timeout, or by `sandgym reap`).

Configuration: `SANDGYM_URL` / `SANDGYM_TOKEN`, or `--ek url=... --ek token=...`
(`SandgymOptions`). The URL may be a fleet (`sandgym.client.fleet`): `http://a:8765,http://b:8765`
or `ray:auto` (the servers `sandgym cluster up` placed); every trial of the job shares one
picture of it, each trial's sandbox is placed there (warm pool first, then most room) and its
calls go to that server. A server lost under a trial raises `ServerLostError` (a
`SandboxLostError`, a `ConnectionError`): the trial ends with no reward (never scored 0), and
Harbor retries it when the job sets retries (Harbor 0.26's default `max_retries` is 0):
`--max-retries 2 --retry-include ServerLostError` (tests/e2e/test_harbor_fleet.py). Imports only Harbor, httpx and sandgym's client side (DESIGN.md's import
direction: `integrations` -> `sandgym.client.env_client`/`sandgym.wire.protocol`).

Harbor's semantics, and where this provider follows them (the server's own defaults differ):
- start(force_build): the `environment/` directory is sent when it holds a Dockerfile or a
  docker-compose.yaml, unless `docker_image` is set and `force_build` is not (Harbor's
  `should_use_prebuilt_docker_image`); a prebuilt image's loose files are uploaded after start
  (`_upload_environment_dir_after_start`). Images are keyed by their build context's content on
  the server, so force_build never meets a stale image. A failed build raises Harbor's
  `SandboxBuildFailedError`.
- stop(delete): the sandbox is destroyed either way (sandgym never reuses one, as E2B's).
- exec: a `bash -c` process of its own (not a persistent shell); user = the argument, else
  `default_user`, else the image's (root); cwd = the argument, else `[environment] workdir`,
  else the Dockerfile's WORKDIR; env = Harbor's merge (`_merge_env`); no timeout unless given,
  and a timeout raises RuntimeError("Command timed out after N seconds") as Harbor's docker
  environment does. The server caps each stream at 1 MB (Harbor's docker has no cap).
- Resources: cpus and memory_mb are hard limits (fractional CPUs allowed); unset = no limit.
- Network: no-network, allowlist of host names and IPv4 addresses (no wildcards, CIDRs or IPv6
  literals), public; the policies of every phase are declared at start and switched with
  `set_network_policy`. No GPUs, no Windows, no host mounts, no SSH stream, and no per-service
  operations on compose sidecars (the server runs a task's compose services beside the main
  container, but Harbor's sidecar artifact collection is refused here).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult, SandboxBuildFailedError
from harbor.environments.capabilities import (
    EnvironmentCapabilities,
    EnvironmentResourceCapabilities,
)
from harbor.environments.definition import (
    COMPOSE_FILE_NAME,
    DOCKERFILE_NAME,
    require_agent_environment_definition,
    should_use_prebuilt_docker_image,
)
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkPolicy, TaskOS
from pydantic import Field

from sandgym.client.sandbox_client import (
    URL_ENV,
    BuildFailedError,
    EnvironmentInvalidError,
    ExecTimeoutError,
    SandboxClient,
    pack_environment,
)
from sandgym.wire.sandbox_protocol import (
    CreateSandboxRequest,
    ExecRequest,
    SandboxEnvironment,
    SandboxInfo,
    SandboxNetwork,
)


class SandgymOptions(EnvironmentOptions):
    """`--ek` options of the sandgym environment."""

    url: str | None = Field(
        None,
        description="the sandgym server, http://HOST:PORT, or a fleet: a comma-separated "
        "list or ray:ADDRESS (default: $SANDGYM_URL)",
    )
    token: str | None = Field(None, description="its bearer token (default: $SANDGYM_TOKEN)")
    idle_timeout_sec: float | None = Field(
        None,
        gt=0,
        description="the server closes the sandbox after this long without a request "
        "(default: the server's idle_timeout_s)",
    )
    request_timeout_sec: float = Field(
        120.0, gt=0, description="HTTP timeout of one request (exec waits for its command)"
    )


def _wire_network(policy: NetworkPolicy) -> SandboxNetwork:
    return SandboxNetwork(
        mode=policy.network_mode.value,
        allowed_hosts=list(policy.allowed_hosts),
    )


class SandgymEnvironment(BaseEnvironment):
    """A Harbor environment whose sandbox is leased from a sandgym server's warm pool."""

    options_model = SandgymOptions
    options: SandgymOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._client: SandboxClient | None = None
        self._info: SandboxInfo | None = None
        #: seconds start() took, and whether the pool handed the sandbox out ready
        self.start_s: float | None = None
        super().__init__(*args, **kwargs)

    # -- identity and capabilities -------------------------------------------------------------
    @staticmethod
    def type() -> str:
        return "sandgym"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        super().preflight(kwargs)
        import os

        options = cls._parse_options_model(SandgymOptions, kwargs)
        if not (options.url or os.environ.get(URL_ENV)):
            raise SystemExit(
                f"sandgym environment: expected the server's URL in ${URL_ENV} or "
                "--ek url=http://HOST:PORT, found neither"
            )

    def _validate_definition(self) -> None:
        require_agent_environment_definition(
            self.environment_dir, docker_image=self.task_env_config.docker_image
        )

    @property
    def sandbox_info(self) -> SandboxInfo | None:
        """What the server said when it handed the sandbox out (None before start)."""
        return self._info

    # -- lifecycle -----------------------------------------------------------------------------
    def _sandbox_id(self) -> str:
        if self._info is None or self._client is None:
            raise RuntimeError("Sandbox not found. Please start the environment first.")
        return self._info.sandbox_id

    def _api(self) -> SandboxClient:
        self._sandbox_id()
        assert self._client is not None
        return self._client

    async def start(self, force_build: bool) -> None:
        if self.task_env_config.os == TaskOS.WINDOWS:
            raise RuntimeError("sandgym environment: Windows containers are not supported")
        t0 = time.perf_counter()
        env_dir = self.environment_dir
        prebuilt = should_use_prebuilt_docker_image(
            env_dir, docker_image=self.task_env_config.docker_image, force_build=force_build
        )
        has_definition = (env_dir / DOCKERFILE_NAME).exists() or (
            env_dir / COMPOSE_FILE_NAME
        ).exists()
        tar = None
        if has_definition and not prebuilt:
            tar = await asyncio.to_thread(pack_environment, env_dir)
        cfg = self.task_env_config
        request = CreateSandboxRequest(
            environment=SandboxEnvironment(
                docker_image=cfg.docker_image if tar is None else None,
                workdir=cfg.workdir,
                env=self._startup_env(),
                cpus=self._effective_cpus,
                memory_mb=self._effective_memory_mb,
                storage_mb=self._effective_storage_mb,
                gpus=self._effective_gpus,
                build_timeout_s=cfg.build_timeout_sec,
            ),
            environment_tar=tar,
            network=_wire_network(self._network_policy),
            network_later=[_wire_network(p) for p in self._phase_network_policies],
            name=self.session_id,
            idle_timeout_s=self.options.idle_timeout_sec,
            force_build=force_build,
        )
        client = SandboxClient(
            self.options.url, self.options.token, timeout_s=self.options.request_timeout_sec
        )
        try:
            info = await client.create(request)
        except (BuildFailedError, EnvironmentInvalidError) as exc:
            await client.aclose()
            raise SandboxBuildFailedError(
                f"sandgym could not make the environment of {self.environment_name}: {exc}"
            ) from exc
        except BaseException:
            await client.aclose()
            raise
        self._client, self._info = client, info
        self.logger.debug(
            f"sandgym sandbox {info.sandbox_id} (pool hit: {info.from_pool}, "
            f"acquired in {info.acquire_s}s)"
        )
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()
        self.start_s = time.perf_counter() - t0

    async def stop(self, delete: bool) -> None:
        """Destroy the sandbox (sandgym never keeps one: `delete=False` has no effect)."""
        client, info = self._client, self._info
        self._client = self._info = None
        if client is None or info is None:
            return
        try:
            await asyncio.shield(client.close(info.sandbox_id))
        except Exception as exc:
            self.logger.warning(
                f"sandgym: closing sandbox {info.sandbox_id} failed ({exc}); the server closes "
                "it after its idle timeout"
            )
        finally:
            await client.aclose()

    # -- commands ------------------------------------------------------------------------------
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        resolved = self._resolve_user(user)
        request = ExecRequest(
            command=command,
            cwd=cwd or self.task_env_config.workdir,
            env=self._merge_env(env) or {},
            user=None if resolved is None else str(resolved),
            timeout_s=timeout_sec or None,
        )
        try:
            reply = await self._api().exec(self._sandbox_id(), request)
        except ExecTimeoutError:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        callback = self._output_callback()
        if callback is not None:
            if reply.stdout:
                await callback(reply.stdout, "stdout")
            if reply.stderr:
                await callback(reply.stderr, "stderr")
        return ExecResult(
            stdout=reply.stdout or None, stderr=reply.stderr or None, return_code=reply.exit_code
        )

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        self._info = await self._api().set_network(
            self._sandbox_id(), _wire_network(network_policy)
        )

    # -- files ---------------------------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._api().upload_file(self._sandbox_id(), source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._api().upload_dir(self._sandbox_id(), source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._api().download_file(self._sandbox_id(), source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._api().download_dir(self._sandbox_id(), source_dir, target_dir)
