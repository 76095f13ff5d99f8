"""Sandbox-level descriptions of a multi-container group and of healthchecks.

A sandbox may come with *services*: other containers (a database, a web server, a DNS server)
that run beside the sandbox's own container on a private network of their own, each reachable
by its service name (`ServiceSpec`). The sandbox's own container is the group's main service
(Harbor's `main`, Terminal-Bench's `client`); the agent's shell is there. Only the docker
backend runs groups (`sandgym.sandboxes.docker.group`); the others refuse a spec with services
(`SandboxGroupUnsupportedError`).

A healthcheck (`HealthcheckSpec`) is what must pass before a sandbox is handed to an episode:
Harbor's `[environment] healthcheck` runs inside the main container (`sandgym.sandboxes.health`); a
compose service's healthcheck is handed to Docker, whose own health status is waited for.

These models know nothing of task formats: `sandgym.tasks.loaders` turns compose files and task.toml
tables into them.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandgym.sandboxes.common.hashing import hash_directory

#: how a service waits for one it depends on (compose's `depends_on.<name>.condition`)
DependsCondition = Literal["service_started", "service_healthy", "service_completed_successfully"]
#: a service name: what compose allows, and what a container name and a DNS label accept
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")


class HealthcheckSpec(BaseModel):
    """A command that says whether the sandbox (or a service) is ready: exit 0 is healthy.

    The fields and defaults are Harbor's (`HealthcheckConfig`), which mirror Docker's
    HEALTHCHECK: during `start_period_s` failures do not count and the check repeats every
    `start_interval_s`; after it, `retries` consecutive failures (one every `interval_s`) mean
    the check failed. `command` as a string runs through a shell; as a list (Docker's `CMD`
    form) it is run as argv."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str | tuple[str, ...] = Field(description="shell command, or argv; exit 0 = healthy")
    interval_s: float = Field(5.0, ge=0, description="between attempts after the start period")
    timeout_s: float = Field(30.0, gt=0, description="limit of one attempt")
    start_period_s: float = Field(0.0, ge=0, description="grace period: failures do not count")
    start_interval_s: float = Field(5.0, ge=0, description="between attempts in the start period")
    retries: int = Field(3, ge=1, description="consecutive failures that mean failed")

    @field_validator("command")
    @classmethod
    def _nonempty(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        if not value or (isinstance(value, str) and not value.strip()):
            raise ValueError("a healthcheck needs a non-empty command")
        return value

    def shell_command(self) -> str:
        """The command as one shell line (argv quoted)."""
        if isinstance(self.command, str):
            return self.command
        import shlex

        return shlex.join(self.command)

    def docker_config(self) -> dict[str, Any]:
        """The container-config `Healthcheck` Docker runs itself (durations in nanoseconds)."""
        test = (
            ["CMD-SHELL", self.command] if isinstance(self.command, str) else ["CMD", *self.command]
        )

        def ns(seconds: float) -> int:
            # Docker takes 0 (its default) or at least 1 ms
            return 0 if seconds <= 0 else max(1_000_000, int(seconds * 1e9))

        return {
            "test": test,
            "interval": ns(self.interval_s),
            "timeout": ns(self.timeout_s),
            "retries": self.retries,
            "start_period": ns(self.start_period_s),
        }


def ipv4_address(value: str, what: str) -> ipaddress.IPv4Address:
    """`value` as an IPv4 address; ValueError naming `what` and the value otherwise."""
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what}: expected an IPv4 address, found {value!r}") from None


def check_addresses(
    subnet: str | None, addresses: list[tuple[str, str | None]]
) -> ipaddress.IPv4Network | None:
    """A group's fixed addressing (compose `ipam` subnet, services' `ipv4_address`): the subnet
    as a network; ValueError when an address is given without a subnet, lies outside it, is its
    network, broadcast or first address (the engine's gateway), or is given twice. `addresses`:
    (what, address or None) for the main container and each service."""
    given = [(what, a) for what, a in addresses if a is not None]
    if subnet is None:
        if given:
            raise ValueError(
                f"{given[0][0]}: a fixed address ({given[0][1]}) needs the network's subnet "
                "(compose `ipam: config: [subnet: ...]`), found none"
            )
        return None
    try:
        net = ipaddress.IPv4Network(subnet)
    except ValueError:
        raise ValueError(
            f"subnet: expected an IPv4 network such as 172.20.0.0/16, found {subnet!r}"
        ) from None
    seen: dict[ipaddress.IPv4Address, str] = {}
    for what, a in given:
        addr = ipv4_address(a, what)
        if addr not in net or addr in (net.network_address, net.broadcast_address):
            raise ValueError(f"{what}: address {a} is not a host address of subnet {subnet}")
        if net.num_addresses > 2 and addr == net.network_address + 1:
            raise ValueError(f"{what}: address {a} is the subnet's gateway (the engine's)")
        if addr in seen:
            raise ValueError(f"{what}: address {a} is also {seen[addr]}'s")
        seen[addr] = what
    return net


class ServiceSpec(BaseModel):
    """One container beside the sandbox's own, on the group's private network."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="service name: the host name the others reach it by")
    image: str | None = Field(None, description="image name (must be in the local engine)")
    build_context: Path | None = Field(None, description="directory its Dockerfile builds from")
    dockerfile: str = Field("Dockerfile", description="Dockerfile name inside build_context")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")
    command: tuple[str, ...] | None = Field(None, description="argv; None = the image's CMD")
    entrypoint: tuple[str, ...] | None = Field(
        None, description="argv; None = the image's ENTRYPOINT"
    )
    workdir: str | None = Field(None, description="working directory; None = the image's")
    user: str | None = Field(None, description="user it runs as; None = the image's")
    healthcheck: HealthcheckSpec | None = Field(
        None, description="run by Docker; None = the image's own HEALTHCHECK, if any"
    )
    healthcheck_disabled: bool = Field(False, description="ignore the image's HEALTHCHECK")
    aliases: tuple[str, ...] = Field((), description="further names it answers to")
    depends_on: dict[str, DependsCondition] = Field(
        default_factory=dict, description="services started (or healthy, or done) before it"
    )
    volumes: tuple[str, ...] = Field(
        (),
        description="container paths that get an anonymous volume of their own (compose "
        "`volumes: [/data]`): fresh with the container, removed with it",
    )
    ipv4_address: str | None = Field(
        None,
        description="its fixed address on the group's network (compose `ipv4_address`); the "
        "sandbox's `subnet` must hold it",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"a service name must be letters, digits, '.', '_' or '-' (at most 63, not "
                f"starting with a punctuation mark), found {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> ServiceSpec:
        if self.image is None and self.build_context is None:
            raise ValueError(f"service {self.name!r} needs an image or a build context")
        if self.name in self.depends_on:
            raise ValueError(f"service {self.name!r} depends on itself")
        for path in self.volumes:
            if not path.startswith("/"):
                raise ValueError(
                    f"service {self.name!r}: a volume path must be absolute, got {path!r}"
                )
        if self.ipv4_address is not None:
            ipv4_address(self.ipv4_address, f"service {self.name!r}")
        return self

    def __hash__(self) -> int:
        return hash(self.model_dump_json())

    def fingerprint_data(self) -> dict[str, Any]:
        """What makes two services interchangeable: everything, with the build context's
        content hash in place of its path."""

        exclude = {"build_context"} | ({"volumes"} if not self.volumes else set())
        if self.ipv4_address is None:
            exclude.add("ipv4_address")
        # (unchanged keys without volumes or an address)
        data = self.model_dump(mode="json", exclude=exclude)
        data["context"] = None if self.build_context is None else hash_directory(self.build_context)
        return data


def start_order(services: tuple[ServiceSpec, ...] | list[ServiceSpec]) -> list[ServiceSpec]:
    """The services in an order where each comes after those it depends on; ValueError naming
    the unknown service or the cycle otherwise."""
    by_name = {s.name: s for s in services}
    if len(by_name) != len(services):
        names = [s.name for s in services]
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"service names must be unique, found {dup} more than once")
    out: list[ServiceSpec] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = done

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise ValueError(f"services depend on each other in a cycle: {cycle}")
        state[name] = 1
        for dep in by_name[name].depends_on:
            if dep not in by_name:
                raise ValueError(
                    f"service {name!r} depends on {dep!r}, which is not a service of the group "
                    f"(expected one of {sorted(by_name)})"
                )
            visit(dep, (*path, name))
        state[name] = 2
        out.append(by_name[name])

    for s in services:
        visit(s.name, ())
    return out
