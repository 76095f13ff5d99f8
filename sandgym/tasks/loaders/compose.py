"""docker-compose files of tasks: the main service's settings and the services beside it.

Harbor's `environment/docker-compose.yaml` (main service `main`, merged over Harbor's own base
file) and Terminal-Bench 1's `docker-compose.yaml` (main service `client`) describe a group of
containers. `load_compose` reads one into a `ComposeEnvironment`: what the main service adds to
the sandbox (build override, environment, healthcheck, working directory) and every other
service as a `sandgym.sandboxes.services.ServiceSpec`, which the docker backend runs beside the sandbox
on a private network (`sandgym.sandboxes.docker.group`).

What is read: `image`, `build` (a context inside the task, `dockerfile`), `environment`,
`command`, `entrypoint`, `healthcheck`, `depends_on` (list or conditions), `working_dir`,
`user`, `networks` (aliases, and a fixed `ipv4_address` on the one network whose `ipam` config
fixes a `subnet`; every service shares the group's one network), `links`; on the
main service `tmpfs`, `dns` and `extra_hosts` (the docker backend sets them on the sandbox's
container) and `entrypoint`/`command` (`ComposeEnvironment.main_entrypoint`/`main_command`:
what the main service runs, started by the docker sandbox's pid 1 under Harbor's rule,
`sandgym.sandboxes.main_process.main_argv`; a keep-alive such as `sh -c "sleep infinity"`
starts nothing, and other backends refuse anything else); beside it, anonymous volumes
(`volumes: [/data]`: a fresh volume at that path).
What is ignored, since it changes nothing a task can observe through sandgym: `container_name`,
`hostname`, `restart`, `ports` and `expose` (nothing is published on the host; services reach
each other by name), resource keys (every container gets the sandbox's limits), `tty`,
`stdin_open`, `init`, `labels`, `pull_policy`, `platform`, logging and stop settings, `x-*`.
The harness's own mounts (volumes whose source is a `${T_BENCH_...}` variable) are ignored. A
bind mount of the task's own files (`./cached_models:/app/cached_models`, main service only) is
copied into the main image at its target: the container sees at start what the mount shows it
(its writes stay in the container, where the task's tests read them). Anything else (other volumes, `privileged`, `cap_add`, `network_mode`, `env_file`, build
`args`, `ipv6_address`, an `ipam` gateway or range, `tmpfs`/`dns`/`extra_hosts` beside the
main service, top-level `configs`/`secrets`, ...) is refused with `ComposeUnsupportedError`
naming the file, the service and the key: a task is never run differently from how it says.

Variables: `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `$NAME` and `$$`
as compose substitutes them, from `variables` (Harbor: `CONTEXT_DIR`); a variable with the
harness prefix (`T_BENCH_`) marks its value as the harness's own (the entry is dropped); any
other unset variable is empty, as compose makes it (with a warning).

Why over 500 lines: it is one format's reader; the key-by-key list of what is read, ignored and
refused, and compose's variable rules, are kept together so the list above can be checked
against one file.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sandgym.sandboxes.services import HealthcheckSpec, ServiceSpec, check_addresses, start_order
from sandgym.tasks.errors import ComposeUnsupportedError, TaskLoadError
from sandgym.tasks.loaders.common import read_yaml

log = logging.getLogger(__name__)

COMPOSE_NAMES = ("docker-compose.yaml", "docker-compose.yml")
#: the one name Harbor reads (`environment/docker-compose.yaml`): a `docker-compose.yml` beside a
#: Harbor task's Dockerfile is task data (a file its Dockerfile copies in), not its environment
HARBOR_COMPOSE_NAMES = ("docker-compose.yaml",)

_IGNORED_KEYS = {
    "container_name",
    "hostname",
    "restart",
    "ports",
    "expose",
    "tty",
    "stdin_open",
    "init",
    "labels",
    "pull_policy",
    "platform",
    "logging",
    "stop_signal",
    "stop_grace_period",
    "deploy",
    "cpus",
    "cpu_count",
    "cpu_shares",
    "cpu_quota",
    "cpu_period",
    "mem_limit",
    "mem_reservation",
    "memswap_limit",
    "pids_limit",
    "shm_size",
    "ulimits",
    "domainname",
    "annotations",
}
_READ_KEYS = {
    "image",
    "build",
    "environment",
    "command",
    "entrypoint",
    "healthcheck",
    "depends_on",
    "working_dir",
    "user",
    "networks",
    "links",
    "volumes",  # the task's own files, anonymous volumes, the harness's mounts (below)
    "tmpfs",  # main service only (below)
    "dns",
    "extra_hosts",
}
_MAIN_ONLY_KEYS = ("tmpfs", "dns", "extra_hosts")
_TOP_KEYS = {"services", "version", "name", "networks", "volumes"}
_BUILD_KEYS = {"context", "dockerfile", "labels", "cache_from", "network", "pull", "no_cache"}
_HEALTH_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval"}

_VAR = re.compile(
    r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")


@dataclass(frozen=True)
class ComposeEnvironment:
    """What one compose file says about a task's environment (see the module docstring)."""

    main: str
    build_context: Path | None = None  # the main service's own build, when the file sets one
    dockerfile: str | None = None
    image: str | None = None  # the main service's image, when literal
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    healthcheck: HealthcheckSpec | None = None
    services: tuple[ServiceSpec, ...] = ()
    #: the main service's bind mounts of folders/files of the task: (host path, target)
    bind_mounts: tuple[tuple[Path, str], ...] = ()
    #: the main service's tmpfs mounts (target, options), DNS servers, /etc/hosts lines
    tmpfs: tuple[tuple[str, str], ...] = ()
    dns: tuple[str, ...] = ()
    extra_hosts: tuple[tuple[str, str], ...] = ()
    #: the main service's `entrypoint` and `command` (None: not set; `main_process.main_argv`)
    main_entrypoint: tuple[str, ...] | None = None
    main_command: tuple[str, ...] | None = None
    #: the group network's fixed subnet (compose `ipam`) and the main service's fixed address
    subnet: str | None = None
    ipv4_address: str | None = None


class _Harness(Exception):
    """A value names the harness's own variable: the entry is the harness's, not the task's."""


def find_compose(directory: Path, names: tuple[str, ...] = COMPOSE_NAMES) -> Path | None:
    for name in names:
        if (directory / name).is_file():
            return directory / name
    return None


def _sub(text: str, variables: Mapping[str, str], harness_prefix: str | None, where: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        if harness_prefix and name.startswith(harness_prefix) and name not in variables:
            raise _Harness(name)
        value = variables.get(name)
        if op in (":-", "-"):
            return value if value is not None and (value or op == "-") else arg
        if op in (":?", "?"):
            if value is None or (op == ":?" and not value):
                raise ComposeUnsupportedError(
                    f"{where}: needs variable {name} ({arg or 'required'}), which is not set"
                )
            return value
        if value is None:
            log.warning("%s: variable %s is not set; substituting an empty string", where, name)
            return ""
        return value

    return _VAR.sub(one, text)


def _seconds(value: Any, where: str) -> float:
    """A compose duration ('1m30s', '500ms', '10s') or a number of seconds."""
    if isinstance(value, bool):
        raise ComposeUnsupportedError(f"{where}: expected a duration like '5s', found {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        raise ComposeUnsupportedError(f"{where}: expected a duration like '5s', found {value!r}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _argv(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise ComposeUnsupportedError(f"{where}: cannot split {value!r}: {exc}") from None
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise ComposeUnsupportedError(
        f"{where}: expected a string or a list of strings, found {value!r}"
    )


def parse_healthcheck(value: Any, where: str) -> HealthcheckSpec | None | bool:
    """A compose `healthcheck` mapping: a HealthcheckSpec, False when it disables the image's
    own (`disable: true`, `test: ["NONE"]`), None when it has no test (only timings: kept as
    Docker's defaults; not supported)."""
    if not isinstance(value, dict):
        raise ComposeUnsupportedError(f"{where}: expected a mapping, found {value!r}")
    if value.get("disable"):
        return False
    unknown = sorted(set(value) - _HEALTH_KEYS - {"disable"})
    if unknown:
        raise ComposeUnsupportedError(f"{where}: unsupported keys {unknown}")
    test = value.get("test")
    command: str | tuple[str, ...]
    if isinstance(test, str):
        command = test
    elif isinstance(test, list) and test and all(isinstance(t, str) for t in test):
        kind, rest = test[0], test[1:]
        if kind == "NONE":
            return False
        if kind == "CMD" and rest:
            command = tuple(rest)
        elif kind == "CMD-SHELL" and len(rest) == 1:
            command = rest[0]
        else:
            raise ComposeUnsupportedError(
                f'{where}: test must be a string, ["CMD", ...], ["CMD-SHELL", cmd] or '
                f'["NONE"], found {test!r}'
            )
    elif test is None:
        raise ComposeUnsupportedError(f"{where}: a healthcheck without `test` is not supported")
    else:
        raise ComposeUnsupportedError(f"{where}: expected test as a string or list, found {test!r}")
    # Docker's defaults, where Harbor's differ (these are Docker healthchecks)
    kw: dict[str, Any] = {"interval_s": 30.0, "timeout_s": 30.0, "start_interval_s": 5.0}
    for key, name in (
        ("interval", "interval_s"),
        ("timeout", "timeout_s"),
        ("start_period", "start_period_s"),
        ("start_interval", "start_interval_s"),
    ):
        if key in value:
            kw[name] = _seconds(value[key], f"{where}.{key}")
    if "retries" in value:
        kw["retries"] = value["retries"]
    try:
        return HealthcheckSpec(command=command, **kw)
    except ValidationError as exc:
        raise ComposeUnsupportedError(f"{where}: {exc.errors()[0]['msg']}") from None


def load_compose(
    path: Path,
    *,
    main: str,
    task_dir: Path,
    variables: Mapping[str, str] | None = None,
    harness_prefix: str | None = None,
) -> ComposeEnvironment:
    """Read compose file `path` whose main service is `main` (see the module docstring).
    Build contexts resolve relative to the file and must lie inside `task_dir`."""
    variables = dict(variables or {})
    data = read_yaml(path)
    unknown_top = sorted(k for k in set(data) - _TOP_KEYS if not str(k).startswith("x-"))
    if unknown_top:
        raise ComposeUnsupportedError(f"{path}: unsupported top-level keys {unknown_top}")
    services = data.get("services")
    if not isinstance(services, dict) or not services:
        raise TaskLoadError(f"{path}: expected a `services` mapping, found {services!r}")
    if main not in services:
        raise TaskLoadError(
            f"{path}: expected a {main!r} service (the one the agent works in), found "
            f"{sorted(services)}"
        )
    ctx = _Ctx(path, task_dir.resolve(), variables, harness_prefix)
    extra_aliases: dict[str, list[str]] = {}
    parsed: dict[str, dict[str, Any]] = {}
    for name, svc in services.items():
        if svc is None:
            svc = {}
        if not isinstance(svc, dict):
            raise TaskLoadError(f"{path}: service {name!r} must be a mapping, found {svc!r}")
        parsed[str(name)] = ctx.service(str(name), svc, is_main=str(name) == main)
        for target, alias in parsed[str(name)].pop("links", []):
            extra_aliases.setdefault(target, []).append(alias)
    m = parsed.pop(main)
    subnet = ctx.subnet(data.get("networks"))
    addresses: dict[str, str | None] = {}
    for name, p in [(main, m), *parsed.items()]:
        fixed = p.pop("fixed")
        if fixed is not None and (subnet is None or fixed[0] != subnet[0]):
            raise ComposeUnsupportedError(
                f"{path}: service {name!r}: ipv4_address {fixed[1]} on network {fixed[0]!r}, "
                "which fixes no subnet (compose needs `ipam: config: [{subnet: ...}]` for a "
                "fixed address)"
            )
        addresses[name] = fixed[1] if fixed is not None else None
    if subnet is not None and not parsed:
        raise ComposeUnsupportedError(
            f"{path}: networks {subnet[0]!r} fixes subnet {subnet[1]} for the main service "
            "alone: sandgym makes a network of its own only for a group (services beside it)"
        )
    try:
        check_addresses(
            subnet[1] if subnet is not None else None,
            [(f"service {n!r}", a) for n, a in addresses.items()],
        )
    except ValueError as exc:
        raise ComposeUnsupportedError(f"{path}: {exc}") from None
    for target in extra_aliases:
        if target != main and target not in parsed:
            raise TaskLoadError(f"{path}: a link names {target!r}, which is not a service")
    out: list[ServiceSpec] = []
    for name, p in parsed.items():
        deps = p.pop("depends_on")
        p.pop("bind_mounts")  # empty: refused beside the main service above
        for key in _MAIN_ONLY_KEYS:
            p.pop(key, None)  # absent: refused beside the main service above
        if main in deps:
            raise ComposeUnsupportedError(
                f"{path}: service {name!r} depends on the main service {main!r}: sandgym starts "
                "the main container after the services beside it"
            )
        aliases = [*p.pop("aliases"), *extra_aliases.get(name, [])]
        try:
            out.append(
                ServiceSpec(
                    name=name,
                    depends_on=deps,
                    aliases=tuple(dict.fromkeys(aliases)),
                    ipv4_address=addresses[name],
                    **p,
                )
            )
        except ValidationError as exc:
            raise TaskLoadError(f"{path}: service {name!r}: {exc.errors()[0]['msg']}") from None
    for dep in m["depends_on"]:
        if dep not in parsed:
            raise TaskLoadError(f"{path}: service {main!r} depends on {dep!r}, not a service")
    try:
        start_order(out)
    except ValueError as exc:
        raise TaskLoadError(f"{path}: {exc}") from None
    health = m.get("healthcheck")
    return ComposeEnvironment(
        main=main,
        build_context=m.get("build_context"),
        dockerfile=m.get("dockerfile") if m.get("build_context") is not None else None,
        image=m.get("image"),
        env=m.get("env", {}),
        workdir=m.get("workdir"),
        healthcheck=health if isinstance(health, HealthcheckSpec) else None,
        services=tuple(out),
        bind_mounts=tuple(m.get("bind_mounts", ())),
        tmpfs=tuple(m.get("tmpfs", ())),
        dns=tuple(m.get("dns", ())),
        extra_hosts=tuple(m.get("extra_hosts", ())),
        main_entrypoint=m.get("entrypoint"),
        main_command=m.get("command"),
        subnet=subnet[1] if subnet is not None else None,
        ipv4_address=addresses[main],
    )


class _Ctx:
    def __init__(
        self, path: Path, task_dir: Path, variables: dict[str, str], harness_prefix: str | None
    ) -> None:
        self.path = path
        self.task_dir = task_dir
        self.variables = variables
        self.harness_prefix = harness_prefix

    def sub(self, value: Any, where: str) -> str:
        return _sub(str(value), self.variables, self.harness_prefix, where)

    def service(self, name: str, svc: dict[str, Any], *, is_main: bool) -> dict[str, Any]:
        where = f"{self.path}: service {name!r}"
        keys = {k for k in svc if not str(k).startswith("x-")}
        unsupported = sorted(keys - _READ_KEYS - _IGNORED_KEYS)
        if unsupported:
            raise ComposeUnsupportedError(
                f"{where}: unsupported keys {unsupported} (sandgym runs image, build, "
                f"environment, command, entrypoint, healthcheck, depends_on, working_dir, user, "
                f"networks and links, and tmpfs, dns and extra_hosts on the main service; see "
                f"sandgym/tasks/loaders/compose.py)"
            )
        out: dict[str, Any] = {}
        mounts, anonymous = self._volumes(svc.get("volumes"), where)
        if mounts and not is_main:
            raise ComposeUnsupportedError(
                f"{where}: volumes {[str(s) for s, _ in mounts]}: sandgym copies a task's own "
                "folders into the main service only"
            )
        if anonymous and is_main:
            raise ComposeUnsupportedError(
                f"{where}: volumes {anonymous}: an anonymous volume on the main service is not "
                "supported (the verifier reads the main container's files from a snapshot, "
                "which holds no volume); beside it, a service may have one"
            )
        out["bind_mounts"] = mounts
        if not is_main:
            out["volumes"] = tuple(anonymous)
        main_only = [k for k in _MAIN_ONLY_KEYS if svc.get(k) is not None]
        if main_only and not is_main:
            raise ComposeUnsupportedError(
                f"{where}: {main_only}: sandgym sets tmpfs, dns and extra_hosts on the main "
                "service's container only"
            )
        if svc.get("tmpfs") is not None:
            out["tmpfs"] = self._tmpfs(svc["tmpfs"], f"{where}: tmpfs")
        if svc.get("dns") is not None:
            out["dns"] = self._dns(svc["dns"], f"{where}: dns")
        if svc.get("extra_hosts") is not None:
            out["extra_hosts"] = self._extra_hosts(svc["extra_hosts"], f"{where}: extra_hosts")
        build = svc.get("build")
        if build is not None:
            out["build_context"], out["dockerfile"] = self._build(build, f"{where}: build")
        image = svc.get("image")
        if image is not None:
            try:
                out["image"] = self.sub(image, f"{where}: image") or None
            except _Harness:
                out["image"] = None  # the harness's name for the image it builds
            if out["image"] is None and build is None and not is_main:
                raise ComposeUnsupportedError(f"{where}: image {image!r} names no image")
        out["env"] = self._environment(svc.get("environment"), where)
        for key, dest in (("command", "command"), ("entrypoint", "entrypoint")):
            if svc.get(key) is None:
                continue
            value = svc[key]
            try:
                if isinstance(value, str):
                    value = self.sub(value, f"{where}: {key}")
                elif isinstance(value, list):
                    value = [self.sub(v, f"{where}: {key}") for v in value]
            except _Harness as h:
                raise ComposeUnsupportedError(
                    f"{where}: {key} uses the harness variable {h.args[0]}"
                ) from None
            out[dest] = _argv(value, f"{where}: {key}")
        if svc.get("working_dir") is not None:
            out["workdir"] = self.sub(svc["working_dir"], f"{where}: working_dir")
        if svc.get("user") is not None and not is_main:
            out["user"] = self.sub(svc["user"], f"{where}: user")
        if svc.get("healthcheck") is not None:
            hc = parse_healthcheck(svc["healthcheck"], f"{where}: healthcheck")
            if hc is False:
                if not is_main:
                    out["healthcheck_disabled"] = True
            elif hc is not None:
                out["healthcheck"] = hc
        out["depends_on"] = self._depends_on(svc.get("depends_on"), where)
        out["links"] = self._links(svc.get("links"), where)
        for target, _alias in out["links"]:  # a link implies the dependency
            out["depends_on"].setdefault(target, "service_started")
        aliases, out["fixed"] = self._aliases(svc.get("networks"), where)
        if not is_main:
            out["aliases"] = aliases
        return out

    def _volumes(self, volumes: Any, where: str) -> tuple[list[tuple[Path, str]], list[str]]:
        """The bind mounts of the task's own files (`./x:/target`), each (host path, target),
        and the anonymous volumes (`/data`: a container path alone); the harness's mounts are
        dropped; anything else is refused."""
        if volumes is None:
            return [], []
        if not isinstance(volumes, list):
            raise ComposeUnsupportedError(f"{where}: volumes must be a list, found {volumes!r}")
        mounts: list[tuple[Path, str]] = []
        anonymous: list[str] = []
        for v in volumes:
            if isinstance(v, dict):
                source, target = v.get("source"), v.get("target")
                kind = v.get("type", "bind")
                if kind == "volume" and not source and str(target or "").startswith("/"):
                    anonymous.append(self.sub(target, f"{where}: volumes"))
                    continue
            else:
                text = str(v)
                if ":" not in text and "$" not in text and text.startswith("/"):
                    anonymous.append(text)  # short syntax, a container path alone
                    continue
                source, _, rest = text.partition(":")
                target, kind = rest.split(":", 1)[0], "bind"
            try:
                source = self.sub(source or "", f"{where}: volumes")
            except _Harness:
                continue  # the harness's log mounts: sandgym collects logs its own way
            if kind == "bind" and source.startswith(".") and str(target or "").startswith("/"):
                host = (self.path.parent / source).resolve()
                if host.is_relative_to(self.task_dir) and host.exists():
                    mounts.append((host, str(target)))
                    continue
            raise ComposeUnsupportedError(
                f"{where}: volumes: {v!r}: sandgym copies only a task's own files and folders "
                "(a relative bind mount such as ./data:/app/data) into its container, not other "
                "host paths or named volumes"
            )
        return mounts, anonymous

    def _tmpfs(self, value: Any, where: str) -> list[tuple[str, str]]:
        """Compose `tmpfs`: a path or a list of `path[:options]` (options as Docker's
        `--tmpfs`, e.g. `size=100M,mode=755`)."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ComposeUnsupportedError(
                f"{where}: expected a path or a list of 'path[:options]', found {value!r}"
            )
        out: list[tuple[str, str]] = []
        for item in items:
            target, _, opts = self.sub(item, where).partition(":")
            if not target.startswith("/"):
                raise ComposeUnsupportedError(
                    f"{where}: expected an absolute container path, found {item!r}"
                )
            out.append((target, opts))
        return out

    def _dns(self, value: Any, where: str) -> list[str]:
        """Compose `dns`: an address or a list of them."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ComposeUnsupportedError(
                f"{where}: expected an address or a list of addresses, found {value!r}"
            )
        return [self.sub(i, where) for i in items]

    def _extra_hosts(self, value: Any, where: str) -> list[tuple[str, str]]:
        """Compose `extra_hosts`: a list of `host:address` or `host=address`, or a mapping."""
        pairs: list[tuple[str, str]] = []
        if isinstance(value, dict):
            pairs = [(str(k), str(v)) for k, v in value.items()]
        elif isinstance(value, list) and all(isinstance(i, str) for i in value):
            for item in value:
                text = self.sub(item, where)
                host, sep, addr = text.partition("=") if "=" in text else text.partition(":")
                if not sep:
                    raise ComposeUnsupportedError(
                        f"{where}: expected 'host:address' or 'host=address', found {item!r}"
                    )
                pairs.append((host.strip(), addr.strip()))
        else:
            raise ComposeUnsupportedError(
                f"{where}: expected a list of 'host:address' or a mapping, found {value!r}"
            )
        out = [(h, a[1:-1] if a.startswith("[") and a.endswith("]") else a) for h, a in pairs]
        for host, addr in out:
            if not host or not addr:
                raise ComposeUnsupportedError(
                    f"{where}: expected a host name and an address, found {host!r}:{addr!r}"
                )
        return out

    def _build(self, build: Any, where: str) -> tuple[Path, str]:
        if isinstance(build, str):
            context_s, dockerfile = build, "Dockerfile"
        elif isinstance(build, dict):
            unknown = sorted(set(build) - _BUILD_KEYS)
            if build.get("args"):
                unknown = sorted({*unknown, "args"})
            else:
                unknown = [k for k in unknown if k != "args"]
            if unknown:
                raise ComposeUnsupportedError(f"{where}: unsupported keys {unknown}")
            context_s = str(build.get("context", "."))
            dockerfile = str(build.get("dockerfile", "Dockerfile"))
        else:
            raise ComposeUnsupportedError(f"{where}: expected a path or a mapping, found {build!r}")
        try:
            context_s = self.sub(context_s, where)
        except _Harness as h:
            raise ComposeUnsupportedError(f"{where}: context uses harness variable {h}") from None
        if "://" in context_s or context_s.startswith("git@"):
            raise ComposeUnsupportedError(f"{where}: a remote build context {context_s!r}")
        context = (self.path.parent / context_s).resolve()
        if context != self.task_dir and self.task_dir not in context.parents:
            raise ComposeUnsupportedError(
                f"{where}: build context {context} lies outside the task directory"
            )
        if not (context / dockerfile).is_file():
            raise TaskLoadError(f"{where}: expected {dockerfile} in build context {context}")
        return context, dockerfile

    def _environment(self, value: Any, where: str) -> dict[str, str]:
        if value is None:
            return {}
        items: list[tuple[str, Any]]
        if isinstance(value, list):
            items = []
            for item in value:
                k, sep, v = str(item).partition("=")
                items.append((k, v if sep else None))
        elif isinstance(value, dict):
            items = list(value.items())
        else:
            raise ComposeUnsupportedError(f"{where}: environment must be a list or a mapping")
        out: dict[str, str] = {}
        for k, v in items:
            if v is None:  # `- NAME` passes the host's value through: the harness's
                log.debug("%s: environment %s without a value ignored", where, k)
                continue
            if isinstance(v, bool):
                v = "true" if v else "false"
            try:
                out[str(k)] = self.sub(v, f"{where}: environment {k}")
            except _Harness:
                continue  # set by the harness (TEST_DIR=${T_BENCH_TEST_DIR}): the verifier's
        return out

    def _depends_on(self, value: Any, where: str) -> dict[str, str]:
        if value is None:
            return {}
        if isinstance(value, list):
            return {str(v): "service_started" for v in value}
        if not isinstance(value, dict):
            raise ComposeUnsupportedError(f"{where}: depends_on must be a list or a mapping")
        out: dict[str, str] = {}
        for dep, opts in value.items():
            cond = (
                (opts or {}).get("condition", "service_started") if isinstance(opts, dict) else None
            )
            if cond not in ("service_started", "service_healthy", "service_completed_successfully"):
                raise ComposeUnsupportedError(f"{where}: depends_on {dep!r}: condition {cond!r}")
            out[str(dep)] = cond
        return out

    def _links(self, value: Any, where: str) -> list[tuple[str, str]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise ComposeUnsupportedError(f"{where}: links must be a list")
        out = []
        for item in value:
            target, _, alias = str(item).partition(":")
            out.append((target, alias or target))
        return out

    def _aliases(self, value: Any, where: str) -> tuple[list[str], tuple[str, str] | None]:
        """A service's `networks`: its aliases, and its fixed address (network, IPv4 address)
        if it has one (every service is on the group's one network)."""
        if value is None or isinstance(value, list):
            return [], None
        if not isinstance(value, dict):
            raise ComposeUnsupportedError(f"{where}: networks must be a list or a mapping")
        out: list[str] = []
        fixed: tuple[str, str] | None = None
        for net, opts in value.items():
            if isinstance(opts, dict):
                if "ipv6_address" in opts:
                    raise ComposeUnsupportedError(
                        f"{where}: networks {net!r}: ipv6_address: a fixed IPv6 address is not "
                        "supported (the group's network is IPv4)"
                    )
                if "ipv4_address" in opts:
                    if fixed is not None:
                        raise ComposeUnsupportedError(
                            f"{where}: networks {net!r}: a second fixed address (the first on "
                            f"{fixed[0]!r}): sandgym puts every service on one network"
                        )
                    fixed = (str(net), self.sub(opts["ipv4_address"], f"{where}: ipv4_address"))
                out += [str(a) for a in opts.get("aliases") or []]
        return out, fixed

    def subnet(self, networks: Any) -> tuple[str, str] | None:
        """The top-level `networks`' fixed IPv4 subnet, (network, subnet), from `ipam: config:
        [{subnet: ...}]`, or None. One network at most may fix one (the group has one);
        `gateway`, `ip_range` and `aux_addresses` are refused (the engine's gateway is kept)."""
        if networks is None:
            return None
        if not isinstance(networks, dict):
            raise ComposeUnsupportedError(f"{self.path}: networks must be a mapping")
        found: tuple[str, str] | None = None
        for net, opts in networks.items():
            ipam = (opts or {}).get("ipam") if isinstance(opts, dict) else None
            if ipam is None:
                continue
            where = f"{self.path}: networks {net!r}: ipam"
            configs = ipam.get("config") if isinstance(ipam, dict) else None
            if not isinstance(configs, list) or not configs:
                raise ComposeUnsupportedError(
                    f"{where}: expected `config: [{{subnet: ...}}]`, found {ipam!r}"
                )
            for cfg in configs:
                extra = sorted(set(cfg or {}) - {"subnet"}) if isinstance(cfg, dict) else None
                if extra is None or extra or not cfg.get("subnet"):
                    raise ComposeUnsupportedError(
                        f"{where}: config: expected entries with a `subnet` only, found {cfg!r}"
                    )
                if found is not None:
                    raise ComposeUnsupportedError(
                        f"{where}: a second subnet (the first: {found[1]} on {found[0]!r}): "
                        "sandgym puts every service on one network"
                    )
                found = (str(net), self.sub(cfg["subnet"], f"{where}: subnet"))
        return found


# -- Harbor ---------------------------------------------------------------------------------------

_HARBOR_HEALTH = {
    "command": "command",
    "interval_sec": "interval_s",
    "timeout_sec": "timeout_s",
    "start_period_sec": "start_period_s",
    "start_interval_sec": "start_interval_s",
    "retries": "retries",
}


def harbor_healthcheck(value: Any, where: str) -> HealthcheckSpec:
    """Harbor's `healthcheck` table (`HealthcheckConfig`: command, interval_sec, timeout_sec,
    start_period_sec, start_interval_sec, retries), with Harbor's defaults."""
    if not isinstance(value, dict):
        raise TaskLoadError(f"{where}: expected a table, found {value!r}")
    unknown = sorted(set(value) - set(_HARBOR_HEALTH))
    if unknown:
        raise TaskLoadError(f"{where}: unknown keys {unknown} (expected {sorted(_HARBOR_HEALTH)})")
    if not isinstance(value.get("command"), str):
        raise TaskLoadError(
            f"{where}: expected `command` as a string, found {value.get('command')!r}"
        )
    try:
        return HealthcheckSpec(**{_HARBOR_HEALTH[k]: v for k, v in value.items()})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise TaskLoadError(f"{where}: {loc}: {err['msg']}") from None


def harbor_environment(task_dir: Path, table: dict[str, Any], environment: Any, where: Path) -> Any:
    """A Harbor task's `EnvironmentSpec` with what `environment/docker-compose.yaml` (main
    service `main`) and `[environment] healthcheck` add: the services beside the main one,
    the main service's environment (under the task's own `env`), working directory (unless
    task.toml names one), build override and healthcheck (task.toml's wins)."""
    update: dict[str, Any] = {}
    if table.get("healthcheck") is not None:
        update["healthcheck"] = harbor_healthcheck(
            table["healthcheck"], f"{where}: [environment.healthcheck]"
        )
    env_dir = task_dir / "environment"
    compose_path = find_compose(env_dir, HARBOR_COMPOSE_NAMES)
    if compose_path is not None:
        c = load_compose(
            compose_path,
            main="main",
            task_dir=task_dir,
            variables={"CONTEXT_DIR": str(env_dir)},
        )
        update["services"] = c.services
        update["service_name"] = "main"
        update["bind_mounts"] = c.bind_mounts
        update["tmpfs"], update["dns"], update["extra_hosts"] = c.tmpfs, c.dns, c.extra_hosts
        update["main_entrypoint"], update["main_command"] = c.main_entrypoint, c.main_command
        update["subnet"], update["ipv4_address"] = c.subnet, c.ipv4_address
        update["env"] = {**c.env, **environment.env}
        if environment.workdir is None and c.workdir:
            update["workdir"] = c.workdir
        if c.build_context is not None:
            update["build_context"] = c.build_context
            update["dockerfile"] = c.dockerfile or "Dockerfile"
            update["image"] = None
        if "healthcheck" not in update and c.healthcheck is not None:
            update["healthcheck"] = c.healthcheck
    return environment.model_copy(update=update) if update else environment
