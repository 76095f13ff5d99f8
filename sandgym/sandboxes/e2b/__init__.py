"""The `e2b` backend: one E2B cloud sandbox (a Firecracker micro-VM) per sandgym sandbox.

Driven through the async E2B SDK (`e2b.AsyncSandbox`, verified against e2b 2.63), imported
lazily; tests inject an in-process fake of the same surface (`tests/fakes/e2b_fake.py`) through the
`sdk=` constructor parameter. Every SDK call runs under a timeout, and every SDK failure becomes
one of the named sandbox errors:

- no `E2B_API_KEY` (or a key E2B rejects), or no SDK installed -> `BackendUnavailableError`;
- create failed (unknown template, quota, timeout) -> `SandboxCreateError`;
- the VM is gone (killed, past its E2B timeout) -> `SandboxLostError`;
- a command past its timeout -> `ExecResult(timed_out=True)` (its process tree is killed).

Templates: `spec.image` names an E2B template. An explicit `template_map` entry wins; otherwise
the image reference is turned into a template name by `template_for_image` (drop the registry
and a `:latest` tag, then `/`, `:`, `.` become `-`: `sandgym/terminal:latest` ->
`sandgym-terminal`). A spec without an image (or with a Dockerfile build context, which E2B
cannot build at create time) runs on the backend's default template (`$SANDGYM_E2B_TEMPLATE`,
else `sandgym-terminal`); the task layer then applies the Dockerfile's WORKDIR/ENV/COPY steps,
as on the local backend. CPU and memory are properties of an E2B template (set when it is
built), not of a create call; `pids_limit` and `storage_mb` are not enforceable through E2B.

Commands: `exec` starts the command in the background with a unique `SANDGYM_EXEC_ID` in its
environment and streams its output into capped buffers. On timeout every process in the VM
carrying that marker is stopped and killed (the same /proc walk the docker backend uses), then
the command itself; so `(sleep 300 &); sleep 301` leaves nothing behind. The persistent shell is
the project's sentinel protocol (`sandgym.sandboxes.shell.PtyShell`) over an E2B pty: the pty's
bytes are bridged onto a local socketpair, so reading, sentinels, timeouts, resync and the pyte
screen are exactly the code the local and docker backends use.

Lifetimes and reaping: each sandbox is created with an E2B timeout equal to the backend's lease
(capped at E2B's 24 h), so E2B itself ends what a crashed server leaves; its metadata carries
`labels_for(spec)`, and `reap()` lists sandboxes by `sandgym.managed=1` metadata and kills those
`labels.should_reap` selects (lease expired, owner process dead, or, with
`only_expired=False`, every one this backend's owner created).

Layout: `api` (`E2BApi`: the SDK, key, request timeout, error mapping and kill that the
backend and its sandboxes share), `backend` (`E2BBackend`, templates, reaping), `sandbox`
(`E2BSandbox`, which holds the api, not the backend), `pty` (the shell's pty bridge).
"""

from sandgym.sandboxes.e2b.api import MAX_SANDBOX_TIMEOUT_S, E2BApi
from sandgym.sandboxes.e2b.backend import (
    DEFAULT_TEMPLATE,
    LABEL_SANDBOX_ID,
    E2BBackend,
    template_for_image,
)
from sandgym.sandboxes.e2b.sandbox import E2BSandbox

__all__ = [
    "DEFAULT_TEMPLATE",
    "LABEL_SANDBOX_ID",
    "MAX_SANDBOX_TIMEOUT_S",
    "E2BApi",
    "E2BBackend",
    "E2BSandbox",
    "template_for_image",
]
