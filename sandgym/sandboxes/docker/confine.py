"""`Confinement`: the host-config options every container of a docker sandbox gets: the
sandbox's own, its verifier's and its services' (Docker's init or the sandbox's own, the reduced
capabilities `CAP_ADD`, `no-new-privileges`, the spec's CPU, memory, pids and storage limits,
the engine runtime), and the compose options its own container takes (`main_container`). The
backend holds one and hands it to each sandbox and service group, so neither reaches back into
the backend."""

from __future__ import annotations

from typing import Any

from sandgym.sandboxes.cgroups import CPU_PERIOD_US
from sandgym.sandboxes.docker.quota import StorageQuota
from sandgym.sandboxes.spec import SandboxSpec

#: What root inside the sandbox keeps: enough to own, chmod and chown its files, switch to an
#: unprivileged user (apt's _apt, `su`-less `exec user=`), signal its processes, bind low ports.
#: Dropped compared to Docker's default: NET_RAW (raw sockets), MKNOD, AUDIT_WRITE.
CAP_ADD = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "SETUID",
    "SETGID",
    "SETPCAP",
    "SETFCAP",
    "KILL",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
]


class Confinement:
    """The host config of a docker sandbox's containers (see the module docstring). `runtime`:
    the engine runtime every container runs under (None: the engine's default); `quota`: the
    storage quota, which says whether `--storage-opt size` bounds a container here."""

    def __init__(self, runtime: str | None, quota: StorageQuota) -> None:
        self.runtime = runtime
        self.quota = quota

    @staticmethod
    def main_container(spec: SandboxSpec, verifier: bool = False) -> dict[str, Any]:
        """Host-config options of compose's that the spec gives the sandbox's own container:
        `tmpfs` ({target: options}), `dns` and `extra_hosts`. A verifier's container
        (`verifier=True`) gets the tmpfs mounts (empty: what the agent wrote there is not in the
        snapshot) and shares the sandbox's network namespace, with its /etc/hosts and
        /etc/resolv.conf, so it takes no dns or extra_hosts of its own (the engine refuses them
        beside `network_mode=container:`)."""
        out: dict[str, Any] = {}
        if spec.tmpfs:
            out["tmpfs"] = {target: opts for target, opts in spec.tmpfs}
        if not verifier:
            if spec.dns:
                out["dns"] = list(spec.dns)
            if spec.extra_hosts:
                out["extra_hosts"] = {host: addr for host, addr in spec.extra_hosts}
        return out

    def host(
        self, spec: SandboxSpec, image_mb: int = 0, docker_init: bool = True
    ) -> dict[str, Any]:
        """Host-config options every container of a sandbox gets (the sandbox's own, its
        verifier's, and its services', which get no storage bound): Docker's init (unless `docker_init` is False: the sandbox's own container
        has an init of its own, `MAIN_INIT`), the reduced capabilities, `no-new-privileges`,
        and the spec's CPU, memory, pids and storage limits. `image_mb`: what the storage quota
        must leave for the image's own files on top of `storage_mb` (`StorageQuota.image_mb`)."""
        host: dict[str, Any] = dict(
            init=docker_init,
            cap_drop=["ALL"],
            cap_add=CAP_ADD,
            security_opt=["no-new-privileges"],
        )
        if spec.cpus:
            # A 10 ms CFS period (Docker's --cpus uses 100 ms): see cgroups.CPU_PERIOD_US.
            host["cpu_period"] = CPU_PERIOD_US
            host["cpu_quota"] = int(spec.cpus * CPU_PERIOD_US)
        if spec.memory_mb:
            host["mem_limit"] = f"{spec.memory_mb}m"
            host["memswap_limit"] = f"{spec.memory_mb}m"  # equal: no swap on top
        if spec.pids_limit:
            host["pids_limit"] = spec.pids_limit
        if spec.storage_mb:
            # A per-file size cap (RLIMIT_FSIZE, bytes; execs inherit it): the storage quota
            # below works only on an engine that supports `--storage-opt size` (btrfs driver;
            # overlay2 over xfs with pquota), and without it one `dd` could fill the host's
            # disk. The cap holds on any filesystem; many files can still add up past
            # storage_mb where the quota is unsupported.
            import docker.types

            size = spec.storage_mb * 2**20
            host["ulimits"] = [docker.types.Ulimit(name="fsize", soft=size, hard=size)]
        if self.runtime:
            host["runtime"] = self.runtime
        if spec.storage_mb and self.quota.supported is not False:
            host["storage_opt"] = {"size": f"{spec.storage_mb + image_mb}M"}
        return host
