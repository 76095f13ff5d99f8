"""The `docker` backend: one container per sandbox, driven through the Docker SDK.

A sandbox is a container under an init of its own (`MAIN_INIT`: it reaps zombies, and the
agent cannot kill it) with CPU, memory (swap equal, i.e. no extra swap) and pids limits, all
capabilities dropped except the few a root user needs to work on its own files,
`no-new-privileges`, and the network its spec's policy names (`sandgym.sandboxes.network`: public =
the engine's bridge, attached or detached per phase; no-network = loopback only; allowlist =
loopback plus an egress proxy listening in the container's network namespace,
`sandgym.sandboxes.egress`).
With bash in the image the init execs a fork-free bash loop as pid 1 (`HELPER_SCRIPT`): the
kill helper and the deadline keeper, which no process inside can stop; without bash the image's
sh keeps the deadline (`MAIN_BOOT`) and there is no helper. Images come by name (default
`sandgym/terminal:latest`, made offline by `images/bootstrap-base.sh`), or are built from
`spec.build_context` once per content hash (`sandgym/ctx:<hash16>`, reused while it exists;
concurrent creates of one context share one build).

Commands: `exec` uses the low-level exec API and reads the multiplexed stream itself so output
is capped while it streams (a 10 MB flood costs at most the cap in memory). Each exec carries a
unique `SANDGYM_EXEC_ID` in its environment; on timeout every process inside the container that
still carries it (the command, its children, background jobs, even ones that called setsid) is
stopped and killed, by a `docker exec`ed killer and by the helper, which needs no new pid and so
still works when a fork bomb fills the pids limit. Background jobs of an exec that finishes in
time keep running (as with `docker exec`); if their leftovers later exhaust the pids limit, the
next exec kills them and retries once. Docker keeps reading an exec's output for up to ~2 s
after its main process exits while a background job holds the pipe. The persistent shell is a
`PtyShell` over `docker exec -it ... bash`, started lazily (restarted if it exits). Files
move as tar archives (`put_archive`/`get_archive`); symlinks resolve inside the container's
root, never on the host. Every SDK call goes through `asyncio.to_thread`. A container that
vanished or stopped raises `SandboxLostError` from exec, shell and file calls.

Gateway bridge: every container gets a host directory of its own, `<bridge_root>/<sandbox id>`
(`bridge_root` is a backend option, default `$SANDGYM_DOCKER_BRIDGE_ROOT` or
`/tmp/sandgym-bridge`), bind-mounted read-only at `/run/sandgym`. The env server puts unix
sockets there (`Sandbox.bridge_dir`, used by `sandgym.server.gateway_bridge`); a process in the
container can connect to them (a socket on a read-only mount still accepts connections) while
the container's network stays `none`, and cannot replace them. The directory is removed with its
container (close, failed create, reap). When the server itself runs in a container (compose),
Docker resolves the bind source on the *host*, so the same directory must be mounted into the
server's container at the same path (`- /tmp/sandgym-bridge:/tmp/sandgym-bridge`).

Verifier: `exec_private` runs it in a sibling container started from a snapshot of the sandbox
(`docker commit` into `sandgym/verifier-snapshot:<name>`), with the same confinement plus
`CAP_SYS_PTRACE`, sharing the sandbox's network and process namespaces: the tests reach the
services the agent left on localhost and see its processes, while nothing the agent left running
can reach the tests' files, output or memory (it lacks that capability); container and image are
removed after every verify (see `PrivateVerifier.run` for what a snapshot lacks, and the cost).

Groups: a spec with `services` (a compose file's other services) runs them beside the sandbox
on a private network of their own, the sandbox's container joined to it in every phase
(`sandgym.sandboxes.docker.group`); they go with it on close, sweep and reap. Healthchecks: an image's
HEALTHCHECK is waited for through Docker's status, `spec.healthcheck` is run inside
(`sandgym.sandboxes.health`), before `create` returns.

Reaping: `reap(only_expired=True)` removes containers of any owner whose lease expired or whose
owning process on this host is dead; `reap(only_expired=False)` also removes every container this
backend's owner created (what a server does when it shuts down or restarts under the same id).
Verifier snapshot images go with their verifier containers, by the same labels. `sandgym.sandboxes.labels`
holds the decision (`should_reap`), `sandgym.sandboxes.reaper` the cross-backend `sandgym reap`.

Layout, by composition around one engine connection: `client` (`DockerEngine`, the SDK client
every part uses), `backend` (`DockerBackend`: create; it holds the parts `images.ImageStore`,
`quota.StorageQuota`, `confine.Confinement` (every container's host config) and
`reaping.DockerReaper`, and hands a sandbox and its service group the engine and the parts they
use, never itself), `sandbox`
(`DockerSandbox`: network, shell, lifecycle; it holds the parts given one `core.Container`
handle: `exec_kill.ContainerExec`, `files.ContainerFiles`, `changes.ContainerChanges` (a
sandbox's changed files, applied to another: how a group's members copy member 0, unless the
backend option `group_fork="snapshot"` asks for a commit) and `verifier.PrivateVerifier`),
`bridge` (the bridge directories), `group` (services beside a sandbox), `service_life`,
`streams` (Docker's multiplexed streams), `names` (labels and repositories).
"""

from sandgym.sandboxes.common.kill import (
    EXEC_MARKER_ENV,
    KILL_ALL_BUT_INIT_SCRIPT,
    kill_marked_bash_script,
    kill_marked_script,
)
from sandgym.sandboxes.docker.backend import DockerBackend
from sandgym.sandboxes.docker.bridge import BRIDGE_SWEEP_GRACE_S
from sandgym.sandboxes.docker.confine import CAP_ADD, Confinement
from sandgym.sandboxes.docker.exec_kill import HELPER_DIR, HELPER_SCRIPT, MAIN_BOOT
from sandgym.sandboxes.docker.names import (
    BRIDGE_MOUNT,
    CTX_REPO,
    DEFAULT_BRIDGE_ROOT,
    DEFAULT_IMAGE,
    GROUP_SNAPSHOT_REPO,
    LABEL_BRIDGE_DIR,
    LABEL_SNAPSHOT_OF,
    LABEL_VERIFIER_OF,
    SNAPSHOT_REPO,
    VERIFIER_OWN_CONTAINER_ENV,
)
from sandgym.sandboxes.docker.sandbox import DockerSandbox

__all__ = [
    "BRIDGE_MOUNT",
    "BRIDGE_SWEEP_GRACE_S",
    "CAP_ADD",
    "Confinement",
    "CTX_REPO",
    "DEFAULT_BRIDGE_ROOT",
    "DEFAULT_IMAGE",
    "EXEC_MARKER_ENV",
    "GROUP_SNAPSHOT_REPO",
    "HELPER_DIR",
    "HELPER_SCRIPT",
    "KILL_ALL_BUT_INIT_SCRIPT",
    "LABEL_BRIDGE_DIR",
    "LABEL_SNAPSHOT_OF",
    "LABEL_VERIFIER_OF",
    "MAIN_BOOT",
    "SNAPSHOT_REPO",
    "VERIFIER_OWN_CONTAINER_ENV",
    "DockerBackend",
    "DockerSandbox",
    "kill_marked_bash_script",
    "kill_marked_script",
]
