"""Network policies of a sandbox: `public`, `no-network`, or `allowlist` of named hosts.

The three modes are Harbor's (`network_mode`, `allowed_hosts`): `public` is the network the
engine gives (a Docker bridge, the host's network on `local`), `no-network` is loopback only,
and `allowlist` is loopback plus an HTTP(S) egress proxy (`sandgym.sandboxes.egress`) that lets through
only connections to the listed hosts. A sandbox is created with one policy and may be switched
to another between phases (`Sandbox.set_network`) when its spec says it will be
(`SandboxSpec.network_later`); a backend that cannot enforce a policy refuses it with
`NetworkPolicyUnsupportedError`, never runs it more open than asked.

`clamp` makes a policy at most as open as an operator's ceiling (never more open than it was).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NetworkMode = Literal["public", "no-network", "allowlist"]
#: where a sandbox with an `allowlist` phase finds its egress proxy (inside its own network
#: namespace; an unusual port so a task's own services on 3128/8080 are not in the way)
PROXY_HOST = "127.0.0.1"
PROXY_PORT = 39128


def normalize_host(host: str) -> str:
    """A host as Harbor normalises it: lower case, no trailing dot; a URL, a port, a path or a
    CIDR is refused (ValueError), since an allowlist names hosts."""
    value = str(host).strip().lower().rstrip(".")
    if not value:
        raise ValueError("an allowed host is empty")
    if "://" in value or "/" in value or ":" in value or any(c.isspace() for c in value):
        raise ValueError(
            f"allowed_hosts entries must be host names or IPv4 addresses, not URLs, ports, "
            f"paths or CIDRs: found {host!r}"
        )
    return value


class NetworkPolicy(BaseModel):
    """One phase's network: a mode, and for `allowlist` the hosts it may reach."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: NetworkMode = Field("public", description="public | no-network | allowlist")
    allowed_hosts: tuple[str, ...] = Field(
        (), description="allowlist: host names or IPv4 addresses reachable through the proxy"
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _normalize(cls, value: object) -> object:
        if isinstance(value, str):
            raise ValueError(f"allowed_hosts must be a list of hosts, found the string {value!r}")
        if isinstance(value, list | tuple):
            out: list[str] = []
            for h in value:
                n = normalize_host(h)
                if n not in out:
                    out.append(n)
            return tuple(out)
        return value

    @model_validator(mode="after")
    def _check(self) -> NetworkPolicy:
        if self.mode != "allowlist" and self.allowed_hosts:
            raise ValueError(
                f"allowed_hosts is only valid with mode 'allowlist', found mode {self.mode!r} "
                f"with hosts {list(self.allowed_hosts)}"
            )
        return self

    def allows(self, host: str) -> bool:
        """Whether a connection to `host` may go through (public: any; no-network: none)."""
        if self.mode == "public":
            return True
        if self.mode == "no-network":
            return False
        try:
            h = normalize_host(host.strip("[]"))
        except ValueError:
            return False
        return h in self.allowed_hosts

    def describe(self) -> dict[str, object]:
        """The JSON shape reported in `info.network`."""
        out: dict[str, object] = {"mode": self.mode}
        if self.mode == "allowlist":
            out["allowed_hosts"] = list(self.allowed_hosts)
        return out

    @classmethod
    def from_bool(cls, network: bool) -> NetworkPolicy:
        """The legacy on/off switch: True is `public`, False `no-network`."""
        return PUBLIC if network else NO_NETWORK


PUBLIC = NetworkPolicy(mode="public")
NO_NETWORK = NetworkPolicy(mode="no-network")


def clamp(policy: NetworkPolicy, ceiling: NetworkPolicy | None) -> NetworkPolicy:
    """`policy` made at most as open as `ceiling` (None: no ceiling). Never more open:
    public under an allowlist ceiling becomes that allowlist; an allowlist under an allowlist
    ceiling keeps only the hosts both list (none left: no-network)."""
    if ceiling is None or ceiling.mode == "public":
        return policy
    if ceiling.mode == "no-network" or policy.mode == "no-network":
        return NO_NETWORK
    if policy.mode == "public":
        return ceiling
    both = tuple(h for h in policy.allowed_hosts if h in ceiling.allowed_hosts)
    return NetworkPolicy(mode="allowlist", allowed_hosts=both) if both else NO_NETWORK


def parse_policy(text: str) -> NetworkPolicy:
    """`public`, `no-network`, or `allowlist:HOST[,HOST...]` (the command-line and environment
    spelling of a policy); ValueError saying what was expected otherwise."""
    mode, _, hosts = text.strip().partition(":")
    if mode == "allowlist":
        return NetworkPolicy(mode="allowlist", allowed_hosts=[h for h in hosts.split(",") if h])
    if mode in ("public", "no-network") and not hosts:
        return NetworkPolicy(mode=mode)  # type: ignore[arg-type]
    raise ValueError(
        f"expected a network policy 'public', 'no-network' or 'allowlist:HOST[,HOST...]', "
        f"found {text!r}"
    )
