"""Immutable descriptions of a sandbox (`SandboxSpec`) and of command results.

`SandboxSpec.fingerprint()` is the key the warm pool groups ready sandboxes by: two specs with
the same fingerprint produce interchangeable fresh sandboxes.
"""

from __future__ import annotations

import hashlib
import json
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The build-context hash lives in sandgym.sandboxes.common.hashing (services use it too); re-exported.
from sandgym.sandboxes.common.hashing import hash_directory as hash_directory

# The output cap lives with the capped buffer (sandgym.sandboxes.common.output); re-exported here.
from sandgym.sandboxes.common.output import DEFAULT_MAX_OUTPUT_BYTES as DEFAULT_MAX_OUTPUT_BYTES
from sandgym.sandboxes.common.output import TRUNCATION_MARKER as TRUNCATION_MARKER
from sandgym.sandboxes.common.output import CappedBuffer
from sandgym.sandboxes.common.output import truncate_output as truncate_output
from sandgym.sandboxes.main_process import main_argv
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.services import HealthcheckSpec, ServiceSpec, check_addresses, start_order

#: how long a spec remembers its fingerprint (see `SandboxSpec.fingerprint`)
FINGERPRINT_TTL_S = 2.0


class SandboxSpec(BaseModel):
    """What a sandbox must look like. Frozen; hashable through `fingerprint()`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = Field(None, description="image name (docker/e2b); None = backend default")
    build_context: Path | None = Field(
        None, description="directory holding a Dockerfile to build the image from"
    )
    dockerfile: str = Field("Dockerfile", description="Dockerfile name inside build_context")
    workdir: str = Field("/app", description="working directory of commands and the shell")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")
    own_env: dict[str, str] | None = Field(
        None,
        description="the variables the spec sets itself, apart from what was read from a "
        "Dockerfile (which `env` holds under them, for backends that build no image): a backend "
        "that runs a built or named image lays only these over the image's own environment, "
        "which is the truth there. None: all of `env` is the spec's own",
    )
    own_workdir: bool = Field(
        True,
        description="False: `workdir` was read from a Dockerfile or is the default, and a "
        "backend that runs a built or named image uses the image's own working directory, "
        "`workdir` only where the image names none",
    )
    cpus: float | None = Field(1.0, description="CPU share (docker: nano_cpus)")
    memory_mb: int | None = Field(2048, description="memory limit in MiB")
    pids_limit: int | None = Field(512, description="maximum number of processes")
    storage_mb: int | None = Field(None, description="disk limit in MiB where supported")
    network: NetworkPolicy = Field(
        NetworkPolicy(mode="no-network"),
        description="the network the sandbox starts with (True/False: public/no-network)",
    )
    network_later: tuple[NetworkPolicy, ...] = Field(
        (), description="other policies it may be switched to later (`Sandbox.set_network`)"
    )
    user: str | None = Field(None, description="user commands run as by default (None = root)")
    make_dirs: tuple[str, ...] = Field(
        (),
        description="e2b: absolute directories made (mode 0777) before the first command, for "
        "templates that lack them; docker and local leave them to the image",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels")
    allow_run: bool = Field(
        False, description="local/e2b: execute Dockerfile RUN lines on the host-side rootfs"
    )
    snapshot: str | None = Field(
        None,
        description="start from this snapshot (`Sandbox.snapshot`) instead of the image: a "
        "copy of a prepared sandbox's files",
    )
    services: tuple[ServiceSpec, ...] = Field(
        (), description="containers beside this one on a private network (docker only)"
    )
    service_name: str = Field("main", description="the name the others reach this one by")
    healthcheck: HealthcheckSpec | None = Field(
        None, description="must pass inside the sandbox before it is handed out"
    )
    tmpfs: tuple[tuple[str, str], ...] = Field(
        (),
        description="docker only: tmpfs mounts of the sandbox's container, (target, options "
        "such as 'size=100M,mode=755'), as compose `tmpfs` makes them",
    )
    dns: tuple[str, ...] = Field(
        (), description="docker only: the container's DNS servers (compose `dns`)"
    )
    extra_hosts: tuple[tuple[str, str], ...] = Field(
        (),
        description="docker only: (host name, address) lines added to the container's "
        "/etc/hosts (compose `extra_hosts`)",
    )
    main_entrypoint: tuple[str, ...] | None = Field(
        None,
        description="docker only: the task compose file's `entrypoint` on the main service "
        "(an empty one clears the image's); None = not set (the image's ENTRYPOINT). "
        "`main_process.main_argv` says what pid 1 starts",
    )
    main_command: tuple[str, ...] | None = Field(
        None,
        description="docker only: the task compose file's `command` on the main service; None "
        "= not set (Harbor's `sh -c 'sleep infinity'`). A keep-alive alone starts nothing",
    )
    subnet: str | None = Field(
        None,
        description="docker groups only: the IPv4 subnet of the group's network (compose "
        "`ipam` config); None = the engine picks one. One group per subnet per engine at a time",
    )
    ipv4_address: str | None = Field(
        None,
        description="docker groups only: the sandbox's own fixed address on the group's "
        "network (compose `ipv4_address`), inside `subnet`",
    )

    @field_validator("network", mode="before")
    @classmethod
    def _legacy_bool(cls, value: object) -> object:
        return NetworkPolicy.from_bool(value) if isinstance(value, bool) else value

    @property
    def network_policies(self) -> tuple[NetworkPolicy, ...]:
        """Every policy this sandbox may run under, the starting one first."""
        return (self.network, *self.network_later)

    @property
    def needs_proxy(self) -> bool:
        """Whether some phase is an allowlist (served by `sandgym.sandboxes.egress`)."""
        return any(p.mode == "allowlist" for p in self.network_policies)

    @property
    def ever_public(self) -> bool:
        """Whether some phase has the engine's full network."""
        return any(p.mode == "public" for p in self.network_policies)

    @model_validator(mode="after")
    def _check(self) -> SandboxSpec:
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir must be absolute, got {self.workdir!r}")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError(f"memory_mb must be >= 16, got {self.memory_mb}")
        if self.services:
            start_order(self.services)  # names unique, dependencies known, no cycle
            if self.service_name in {s.name for s in self.services}:
                raise ValueError(f"service name {self.service_name!r} is the sandbox's own")
        for target, _opts in self.tmpfs:
            if not target.startswith("/"):
                raise ValueError(f"a tmpfs target must be absolute, got {target!r}")
        if (self.subnet is not None or self.ipv4_address is not None) and not self.services:
            raise ValueError(
                "a subnet or fixed address is a group's (services beside the sandbox), found "
                "no services"
            )
        check_addresses(
            self.subnet,
            [(f"service {self.service_name!r}", self.ipv4_address)]
            + [(f"service {s.name!r}", s.ipv4_address) for s in self.services],
        )
        return self

    @property
    def container_settings(self) -> list[str]:
        """The docker-only settings of the sandbox's container this spec asks for (tmpfs,
        dns, extra_hosts; the main service's entrypoint and command, unless what they run
        without an image only keeps the container up): names, for the refusal of backends that
        cannot honour them."""
        names = [k for k in ("tmpfs", "dns", "extra_hosts") if getattr(self, k)]
        if main_argv(self.main_entrypoint, self.main_command, {}):
            names += [
                k for k in ("main_entrypoint", "main_command") if getattr(self, k) is not None
            ]
        return names

    def __hash__(self) -> int:  # dict fields make pydantic's frozen hash fail; hash the JSON
        return hash(self.model_dump_json())

    def context_hash(self) -> str | None:
        """Content hash of the build context (file names, modes and bytes), or None."""
        if self.build_context is None:
            return None
        return hash_directory(self.build_context)

    def build_key(self) -> str | None:
        """What names the image built from the build context (`sandgym/ctx:<key[:16]>`): its
        content hash, and the Dockerfile's name where it is not `Dockerfile` (two services of
        one compose file may build one context with two Dockerfiles), or None."""
        digest = self.context_hash()
        if digest is None or self.dockerfile == "Dockerfile":
            return digest
        return hashlib.sha256(f"{digest}\0{self.dockerfile}".encode()).hexdigest()

    def fingerprint(self, backend: str = "") -> str:
        """Stable key for 'interchangeable fresh sandboxes' (excludes per-sandbox labels).

        Remembered on this spec for FINGERPRINT_TTL_S: a server keeps one spec per task and
        asks on every reset; walking the build context each time was a fifth of a reset's CPU.
        An edited build context is still noticed, within that time."""
        fp = self._remembered(backend)
        if fp is None:
            fp = self._fingerprint(backend)
            _memo_of(self)[backend] = (time.monotonic(), fp)
        return fp

    def needs_hashing(self, backend: str = "") -> bool:
        """Whether `fingerprint` would read the build context now (callers move it off the
        event loop then)."""
        contexts = self.build_context is not None or any(
            s.build_context is not None for s in self.services
        )
        return contexts and self._remembered(backend) is None

    def _remembered(self, backend: str) -> str | None:
        """The fingerprint remembered for `backend`, if younger than FINGERPRINT_TTL_S."""
        hit = _memo_of(self).get(backend)
        if hit is not None and time.monotonic() - hit[0] < FINGERPRINT_TTL_S:
            return hit[1]
        return None

    def _fingerprint(self, backend: str) -> str:
        group = {"services", "service_name", "healthcheck"}
        exclude = {"labels", "build_context", *group}
        if not self.make_dirs:  # (unchanged keys without them)
            exclude.add("make_dirs")
        if self.own_env is None:
            exclude.add("own_env")
        if self.own_workdir:
            exclude.add("own_workdir")
        exclude.update(
            k
            for k in ("tmpfs", "dns", "extra_hosts", "subnet", "ipv4_address")
            if not getattr(self, k)
        )
        exclude.update(  # (unchanged keys without them)
            k for k in ("main_entrypoint", "main_command") if getattr(self, k) is None
        )
        data = self.model_dump(mode="json", exclude=exclude)
        data["context"] = self.context_hash()
        if self.services or self.healthcheck is not None:  # (unchanged keys without them)
            data["services"] = [s.fingerprint_data() for s in self.services]
            data["service_name"] = self.service_name
            data["healthcheck"] = self.model_dump(mode="json", include={"healthcheck"})
        data["backend"] = backend
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


#: id(spec) -> (weak reference, {backend: (when, fingerprint)}); kept outside the model so
#: that it takes no part in equality, removed when the spec is collected
_FP_MEMO: dict[int, tuple[weakref.ref[SandboxSpec], dict[str, tuple[float, str]]]] = {}


def _memo_of(spec: SandboxSpec) -> dict[str, tuple[float, str]]:
    key = id(spec)
    entry = _FP_MEMO.get(key)
    if entry is None or entry[0]() is not spec:

        def forget(_ref: weakref.ref[SandboxSpec], k: int = key) -> None:
            _FP_MEMO.pop(k, None)

        entry = (weakref.ref(spec, forget), {})
        _FP_MEMO[key] = entry
    return entry[1]


class ExecResult(BaseModel):
    """The result of one non-interactive command. A non-zero exit code is data, not an error."""

    exit_code: int | None = Field(description="exit status; None when killed by the timeout")
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    truncated: bool = Field(False, description="output was cut at the output limit")
    duration_s: float = 0.0

    @classmethod
    def from_buffers(
        cls,
        out: CappedBuffer,
        err: CappedBuffer,
        *,
        exit_code: int | None,
        timed_out: bool,
        started: float,
    ) -> ExecResult:
        """The result of a command whose streams went into `out` and `err` and which started at
        `started` (`time.perf_counter()`)."""
        stdout, t1 = out.text()
        stderr, t2 = err.text()
        return cls(
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=t1 or t2,
            duration_s=time.perf_counter() - started,
        )


class ShellResult(BaseModel):
    """The result of one command run in the persistent shell (stdout and stderr merged)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    #: the command ended the persistent shell (`exit`, `exec`, `kill $$`) but not the sandbox:
    #: the next command runs in a new shell
    shell_exited: bool = False


@dataclass(frozen=True)
class FileChanges:
    """What a sandbox's file system gained since it was made (`Sandbox.changes`): the added and
    modified entries as one tar (owners, modes and times kept; directories without their other
    contents) and the paths that were deleted, to apply to another sandbox of the same spec."""

    tar: bytes
    deleted: tuple[str, ...] = ()

    @property
    def size_bytes(self) -> int:
        return len(self.tar)


@dataclass(frozen=True)
class PathChanges:
    """Which paths of a sandbox's file system differ from what it was made from
    (`Sandbox.changed_paths`), read by the backend itself, never by a program inside the
    sandbox: created, modified (content, mode, owner or link target) and deleted, each sorted.
    A directory counts as modified only when its own mode or owner changed, not its entries."""

    created: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    def kinds(self) -> dict[str, str]:
        """path -> "created" | "modified" | "deleted"."""
        out = {p: "created" for p in self.created}
        out.update({p: "modified" for p in self.modified})
        out.update({p: "deleted" for p in self.deleted})
        return out
