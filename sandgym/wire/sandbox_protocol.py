"""The sandbox API's wire models (protocol version 1.2): create, exec, files, network, close.

Beside the episode API (`sandgym.wire.protocol`, websocket `/v1/env`), the server offers plain
sandboxes over HTTP under `/v1/sandboxes`, from the same warm pool, with the same lease labels,
reaper and token. A caller (Harbor's environment provider `sandgym.integrations.harbor`, NeMo-Gym's)
sends an environment definition (a Harbor `environment/` directory as a gzip'd tar, or an image
name, plus the task's `[environment]` settings), then runs commands and moves files. The server
never scores anything here: what the caller does with the sandbox is its own business.

This module is part of the public contract (docs/sandbox-api.md). It imports nothing of
sandgym, so clients load it without server code; import its names from here (the episode
protocol module does not re-export them).

| request | method and path | body -> reply |
|---|---|---|
| create | `POST /v1/sandboxes` | `CreateSandboxRequest` -> `SandboxInfo` |
| list | `GET /v1/sandboxes` | -> `SandboxList` |
| is-alive | `GET /v1/sandboxes/{id}` | -> `SandboxInfo` (`alive`) |
| exec | `POST /v1/sandboxes/{id}/exec` | `ExecRequest` -> `ExecReply` |
| upload | `PUT /v1/sandboxes/{id}/files?path=DIR` | a tar, unpacked into DIR -> `FilesReply` |
| download | `GET /v1/sandboxes/{id}/files?path=PATH` | -> a tar holding one entry, PATH's base name |
| network | `POST /v1/sandboxes/{id}/network` | `SetNetworkRequest` -> `SandboxInfo` |
| close | `DELETE /v1/sandboxes/{id}` | -> `SandboxClosedReply` |

Every failure is HTTP 4xx/5xx with a `SandboxErrorBody` whose `code` is one of
`SANDBOX_ERROR_CODES` (`SANDBOX_ERROR_STATUS` gives its status). A non-zero exit code is data
(`ExecReply.exit_code`), not an error.

Example:
    >>> req = CreateSandboxRequest(environment=SandboxEnvironment(docker_image="debian:12"))
    >>> req.network.mode, req.user is None
    ('public', True)
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The version of the sandbox API this module describes (`SandboxInfo.api_version`).
SANDBOX_API_VERSION = "1.2"
#: Where the sandbox API lives on the server.
SANDBOX_API_PREFIX = "/v1/sandboxes"
#: Content type of the file transfer bodies (an uncompressed POSIX tar).
TAR_CONTENT_TYPE = "application/x-tar"

#: Every error code of the sandbox API.
SandboxErrorCode = Literal[
    "invalid_request",
    "unauthorized",
    "unknown_sandbox",
    "capacity",
    "environment_invalid",
    "build_failed",
    "network_unsupported",
    "sandbox_lost",
    "exec_timeout",
    "file_not_found",
    "internal",
]
SANDBOX_ERROR_CODES: tuple[SandboxErrorCode, ...] = get_args(SandboxErrorCode)

#: The HTTP status each error code is sent with (one table, read by server and client).
SANDBOX_ERROR_STATUS: dict[SandboxErrorCode, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "unknown_sandbox": 404,
    "capacity": 503,
    "environment_invalid": 422,
    "build_failed": 422,
    "network_unsupported": 409,
    "sandbox_lost": 410,
    "exec_timeout": 408,
    "file_not_found": 404,
    "internal": 500,
}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


NetworkModeName = Literal["public", "no-network", "allowlist"]


class SandboxNetwork(_Wire):
    """A network policy, as Harbor names it: `public`, `no-network`, or `allowlist` of hosts
    (host names or IPv4 addresses; the server refuses wildcards, CIDRs and IPv6 literals)."""

    mode: NetworkModeName = Field("public", description="public | no-network | allowlist")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="allowlist: the hosts the sandbox may reach"
    )

    @model_validator(mode="after")
    def _check(self) -> SandboxNetwork:
        if self.allowed_hosts and self.mode != "allowlist":
            raise ValueError(
                f"allowed_hosts is only valid with mode 'allowlist', found mode {self.mode!r}"
            )
        return self


class SandboxEnvironment(_Wire):
    """A Harbor task's `[environment]` settings the sandbox is made from. Resources left None
    are not limited (Harbor's docker environment applies none either); the server may still
    refuse what it cannot give (GPUs)."""

    docker_image: str | None = Field(
        None,
        description="prebuilt image; used when the environment tar holds no Dockerfile or "
        "docker-compose.yaml (Harbor's rule)",
    )
    workdir: str | None = Field(
        None, description="working directory of commands (None: the Dockerfile's WORKDIR)"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables of every command"
    )
    cpus: float | None = Field(None, gt=0, description="CPU limit in cores")
    memory_mb: int | None = Field(None, ge=16, description="memory limit in MiB")
    storage_mb: int | None = Field(None, gt=0, description="disk limit in MiB, where enforced")
    gpus: int = Field(0, ge=0, description="GPUs wanted (no backend here gives any)")
    build_timeout_s: float = Field(600.0, gt=0, description="limit of an image build")


class CreateSandboxRequest(_Wire):
    """Body of `POST /v1/sandboxes`. Sandboxes of equal environments (same tar content, same
    settings and network policies) come from one warm pool key, so repeated trials of a task
    start from a ready sandbox."""

    environment: SandboxEnvironment = Field(default_factory=SandboxEnvironment)
    environment_tar: str | None = Field(
        None,
        description="base64 of a (gzip'd) tar of the environment/ directory: Dockerfile or "
        "docker-compose.yaml and the files they use, at the tar's top level",
    )
    user: str | None = Field(
        None, description="user commands run as when an exec names none (None: root)"
    )
    network: SandboxNetwork = Field(
        default_factory=SandboxNetwork, description="the policy the sandbox starts with"
    )
    network_later: list[SandboxNetwork] = Field(
        default_factory=list,
        description="other policies it may be switched to later (each phase's, for Harbor)",
    )
    name: str | None = Field(
        None, max_length=200, description="the caller's handle (Harbor's session id), listed"
    )
    idle_timeout_s: float | None = Field(
        None,
        gt=0,
        description="the server closes the sandbox after this long without a request "
        "(None: the server's default); what frees a sandbox whose caller died",
    )
    force_build: bool = Field(
        False,
        description="accepted for Harbor's start(force_build): images are keyed by their "
        "build context's content, so an unchanged context is never stale",
    )

    @model_validator(mode="after")
    def _check(self) -> CreateSandboxRequest:
        if self.environment_tar is None and self.environment.docker_image is None:
            raise ValueError(
                "expected an environment: environment_tar (a Dockerfile or compose file) or "
                "environment.docker_image, found neither"
            )
        return self


class SandboxInfo(_Wire):
    """A sandbox of the API: the reply to create, is-alive and a network switch."""

    api_version: str = SANDBOX_API_VERSION
    sandbox_id: str
    name: str | None = None
    backend: str
    fingerprint: str = Field(description="the warm pool key of its environment")
    alive: bool = True
    from_pool: bool = Field(False, description="handed out ready by the warm pool (a hit)")
    acquire_s: float | None = Field(None, description="seconds create waited for the sandbox")
    workdir: str = Field(description="where commands run when an exec names no cwd")
    user: str | None = None
    network: SandboxNetwork
    networks: list[SandboxNetwork] = Field(
        default_factory=list, description="every policy it can be switched to (after the clamp)"
    )
    network_clamped: bool = Field(
        False, description="the server's network ceiling made some asked policy stricter"
    )
    age_s: float = 0.0
    idle_s: float = 0.0
    idle_timeout_s: float


class SandboxList(_Wire):
    """Reply to `GET /v1/sandboxes`: every sandbox the API holds now."""

    count: int
    sandboxes: list[SandboxInfo]


class ExecRequest(_Wire):
    """Body of `POST /v1/sandboxes/{id}/exec`: one command as a process of its own (not the
    episode API's persistent shell). A string runs under `bash -c`; a list is the argv."""

    command: str | list[str] = Field(description="a shell string, or an argv list")
    cwd: str | None = Field(None, description="working directory (None: the sandbox's workdir)")
    env: dict[str, str] = Field(default_factory=dict, description="added to the sandbox's env")
    user: str | None = Field(None, description="user name or uid (None: the sandbox's user)")
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="the process tree is killed after this long (None: no limit "
        "but the sandbox's lease)",
    )

    @model_validator(mode="after")
    def _check(self) -> ExecRequest:
        if isinstance(self.command, list) and not self.command:
            raise ValueError("command is an empty argv list")
        return self


class ExecReply(_Wire):
    """The result of one exec: stdout, stderr and the exit code apart (Harbor's ExecResult)."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    truncated: bool = Field(False, description="output was cut at the server's output limit")


class SetNetworkRequest(_Wire):
    """Body of `POST /v1/sandboxes/{id}/network`: switch to one of the policies the sandbox
    was created for (`network` or one of `network_later`)."""

    network: SandboxNetwork


class FilesReply(_Wire):
    """Reply to an upload: where the tar was unpacked and how many entries it held."""

    path: str
    entries: int


class SandboxClosedReply(_Wire):
    """Reply to `DELETE /v1/sandboxes/{id}`. Closing one already closed is no error."""

    sandbox_id: str
    closed: bool = Field(description="False when it was already closed or reaped")


class SandboxErrorBody(_Wire):
    """Body of every failed sandbox API request."""

    code: SandboxErrorCode
    message: str
    retryable: bool = False
