"""The `local` backend, the embedded default: bubblewrap sandboxes, no Docker needed.

Each sandbox is a private directory tree `<root>/<id>/fs` that becomes `/` inside a bubblewrap
namespace set (own user, pid, net, ipc, uts, cgroup namespaces). The host's system directories
(`/usr`, `/etc`, the `/bin`-style links) are bound read-only; everything else (`/app`, `/logs`,
`/tests`, `/tmp`, `/root`, the workdir...) is private and writable, and visible to the host, so
the file API is plain file I/O. One long-lived init process holds the namespaces; `exec` and the
shell join them with `nsenter`, so a service started by the agent is visible to the verifier.

Limits: a cgroup per sandbox (memory, pids, CPU) when cgroups are writable, and a sub-cgroup per
`exec` so a timeout kills the whole tree, daemons included. Without cgroups: rlimits (weaker;
logged). Without bwrap at all: a plain-directory mode with no isolation, which says so loudly.
Network follows the spec's policy (`sandgym.sandboxes.network`): public shares the host's network,
no-network keeps the namespace's loopback only, allowlist adds an egress proxy listening inside
it (`sandgym.sandboxes.egress`). `sandbox.close()` kills the cgroup and deletes the
tree; if the server dies, `--die-with-parent` ends the sandbox and `sandgym reap` removes the
tree (each holds a `labels.json`).

Layout: `backend` (`LocalBackend`), `sandbox` (`LocalSandbox`), `tree` (what a sandbox's root
tree holds), `root` (where the trees live, and their labels).
"""

from sandgym.sandboxes.local.backend import LocalBackend
from sandgym.sandboxes.local.root import DEFAULT_LOCAL_ROOT, MEMORY_LOCAL_ROOT, local_root
from sandgym.sandboxes.local.sandbox import DEFAULT_PATH, LocalSandbox
from sandgym.sandboxes.local.tree import (
    PRIVATE_DIRS,
    SECRET_GLOBS,
    SYSTEM_DIRS,
    VERIFIER_MOUNTS,
    _host_secret_files,
)

__all__ = [
    "DEFAULT_LOCAL_ROOT",
    "DEFAULT_PATH",
    "MEMORY_LOCAL_ROOT",
    "PRIVATE_DIRS",
    "SECRET_GLOBS",
    "SYSTEM_DIRS",
    "VERIFIER_MOUNTS",
    "LocalBackend",
    "LocalSandbox",
    "_host_secret_files",
    "local_root",
]
