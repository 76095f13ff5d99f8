"""`PrivateVerifier`: a Docker sandbox's private verifier. `run` (the sandbox's `exec_private`)
runs the verifier in a sibling container started from a snapshot of the sandbox (`docker
commit`), sharing its network and process namespaces but not its files, with one capability
more than the agent's processes hold, so that nothing the agent left running can reach the
tests or the reward files, while the tests see the agent's processes as Harbor's do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from sandgym.sandboxes.common.files import one_file_tar
from sandgym.sandboxes.common.output import CappedBuffer
from sandgym.sandboxes.createlimit import creating
from sandgym.sandboxes.docker.core import Container
from sandgym.sandboxes.docker.names import (
    LABEL_BRIDGE_DIR,
    LABEL_VERIFIER_OF,
    SNAPSHOT_REPO,
    VERIFIER_OWN_CONTAINER_ENV,
)
from sandgym.sandboxes.docker.streams import _demux, _raw_socket
from sandgym.sandboxes.errors import SandboxError
from sandgym.sandboxes.lifetime import own_lifetime_settings
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.spec import ExecResult, SandboxSpec
from sandgym.sandboxes.usage import CompanionUsage, VerifierCgroup

log = logging.getLogger(__name__)

#: the capability the verifier's container holds beyond the sandbox's (`CAP_ADD`). It shares the
#: sandbox's process namespace; the kernel lets a process open another's /proc/PID/root, /mem,
#: /fd or /environ, or ptrace it, only with CAP_SYS_PTRACE or when it holds every capability the
#: target holds (cap_ptrace_access_check). The agent's processes hold at most `CAP_ADD` (compose
#: `cap_add` is refused at load), never this one, so every root process of the verifier is out
#: of their reach; with it the tests may read the agent's processes' /proc entries, as Harbor's
#: tests running beside them can.
VERIFIER_EXTRA_CAP = "SYS_PTRACE"

#: the backend name whose creation limits a verifier container obeys (`DockerBackend.name`)
DOCKER_BACKEND = "docker"

#: each engine's cgroup driver, asked once (the API client -> `CgroupDriver`)
_DRIVERS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _cgroup_driver(api: Any) -> str:
    """(Thread) the engine's cgroup driver (`cgroupfs`, `systemd`), asked once per client."""
    driver = _DRIVERS.get(api)
    if driver is None:
        try:
            driver = str(api.info().get("CgroupDriver") or "")
        except Exception:  # an engine that does not say: no parent group is set
            driver = ""
        with contextlib.suppress(TypeError):  # a client that takes no weak reference: ask again
            _DRIVERS[api] = driver
    return driver


#: the verifier container's entrypoint (`sh -c _STDIN_BOOT STDIN_FILE LIFE CMD...`): its stdin
#: is a file put there before it started. With a LIFE (whole seconds; empty for none) and
#: `sleep` and `date` in the image, a watcher beside the command kills the command LIFE seconds
#: after the container started, and the container stops; the engine then kills the rest of it
#: (every process in its cgroup: the agent's, in the sandbox's, are not among them). So a
#: verifier whose server was killed mid-run (nobody left to enforce its timeout) still ends
#: (`sandgym.sandboxes.lifetime`). LIFE is the verifier's timeout plus the grace, so the server's own
#: timeout (counted from a moment later) always comes first while it lives.
_STDIN_BOOT = (
    'l=$1; shift; exec 0<"$0" && rm -f "$0" && { '
    'if [ -n "$l" ] && command -v sleep >/dev/null && command -v date >/dev/null; then '
    "( d=$(( $(date +%s) + l )); while :; do sleep 1; "
    '[ "$(date +%s)" -gt "$d" ] && { kill -KILL $$; exit 0; }; done ) '
    "</dev/null >/dev/null 2>&1 & fi; "
    'exec "$@"; }'
)


class PrivateVerifier:
    """The verifier in a sibling container made from a snapshot of `container`. `host`: the
    host-config options the sandbox's containers get (its confinement, and what a verifier
    takes of compose's settings); `labels`: the sandbox's labels, asked at each run."""

    def __init__(
        self,
        container: Container,
        spec: SandboxSpec,
        host: dict[str, Any],
        labels: Callable[[], dict[str, str]],
        max_output_bytes: int,
    ) -> None:
        self.container = container
        self.spec = spec
        self.host = host
        self.labels = labels
        self.max_output_bytes = max_output_bytes
        #: what each verifier container consumed (its episode's cost ledger counts them)
        self.runs: list[CompanionUsage] = []
        #: called (in a thread) with each verifier container's id once it is created, before it
        #: starts: the tamper trace watches its snapshot's files then (sandgym/tasks/tamper_trace.py)
        self.on_created: Callable[[str], None] | None = None

    async def run(
        self,
        cmd: list[str],
        stdin: bytes,
        timeout_s: float = 60.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        see_processes: bool = True,
    ) -> ExecResult:
        """`cmd` as root in a *sibling container* of its own, beside the agent's processes but
        out of their reach: what the verifier uses (sandgym/tasks/private_verify.py), so that nothing
        the agent left running can join or touch the tests or the reward files.

        1. The sandbox's file system is snapshotted (`docker commit`, the container paused
           meanwhile) into `sandgym/verifier-snapshot:<name>`;
        2. a container `<sandbox id>-verifier-<hex>` starts from it with the sandbox's
           confinement (reduced capabilities, `no-new-privileges`, the spec's CPU, memory,
           pids and file-size limits; Docker runs no init of its own in a shared process
           namespace: the sandbox's init reaps the tests' orphans, and the engine kills what is
           left of the verifier's processes when its command ends) plus `VERIFIER_EXTRA_CAP`,
           `VERIFIER_OWN_CONTAINER_ENV=1` set, sharing the sandbox's *network* and *process*
           namespaces (`network_mode` and `pid_mode` `container:<sandbox>`): a test can query a
           service the agent left listening on localhost and find the agent's processes
           (`pgrep nginx`, `psutil.process_iter`), as in Harbor's and Terminal-Bench's
           harnesses, while mount, IPC and UTS namespaces are its own. The agent's processes
           see the verifier's (their command lines) but cannot reach its files or memory
           through /proc or ptrace: every root process of the verifier holds a capability
           theirs lack (`VERIFIER_EXTRA_CAP`). They can signal it: a killed verifier writes no
           reward block, a `verifier_error`, which the trainer scores 0. With `see_processes`
           False (a verifier that drops to another user, who holds no capability: the agent's
           root, with `CAP_SETUID`, could become that user and reach it) the container has a
           process namespace of its own instead, and sees none of the agent's processes;
        3. `stdin` is put into that container as a file (mode 0600) before it starts, and the
           entrypoint makes it the command's stdin and deletes it; stdout and stderr are read
           from an attach made before the start, capped like `exec`'s. On timeout the container
           is killed (every process in it: no marker hunt needed), `exit_code` is None; should
           this process die first, the container's own watcher kills it `timeout_s` plus the
           lifetime grace after it started (`_STDIN_BOOT`);
        4. the container and the image are removed in every case (shielded from cancellation,
           after any Docker call still in flight). Both carry the sandbox's owner labels plus
           `sandgym.verifier_of=<sandbox id>`, so a reap after a server died mid-verify removes
           them (`DockerBackend.reap_matching`), and the pool's sweep of untracked sandboxes
           leaves a live one alone (`owned_sandbox_ids` skips them).

        What the verifier does not see: the contents of the sandbox's volumes (an image's
        `VOLUME`s; the backend itself mounts only the read-only bridge directory at
        /run/sandgym, which is left empty there) and of its tmpfs mounts (compose `tmpfs`: the
        verifier's container gets them, empty). Files the agent changed are all there (a commit
        holds the whole writable layer). The programs the verifier runs (sh, bash, the tests'
        interpreters) come from that snapshot too: an agent that replaces them still runs code
        as the verifier, as in any design where the tests run in the agent's environment
        (sandgym/tasks/private_verify.py).

        Cost: a commit (grows with the bytes the agent changed), a container start and two
        removals; the verifier's container counts against its own limits, beside the sandbox's.
        Measured here (runc, overlay2, 2 cores; medians of 5 and of 8), `run_verifier` on a
        small task: +1 to +46 ms per verify (~0.4 s either way) over running the tests inside
        the sandbox (commit 80-100 ms, create+start 125-140 ms, removals ~15 ms, minus the
        copy-in and read-back that path needed); after the agent wrote 50 MB and 2,000 files:
        +0.9 to +1.1 s (commit ~0.5 s, image removal 0.2-0.25 s). The runtime
        must let a container join another's network and process namespaces (runc does;
        gVisor's runsc keeps both inside its sandbox)."""
        import docker.errors

        await self.container.raise_if_lost("private exec")
        api = self.container.api
        name = f"{self.container.sandbox_id}-verifier-{uuid.uuid4().hex[:8]}"
        image = f"{SNAPSHOT_REPO}:{name}"
        stdin_path = f"/.sandgym-verifier-stdin-{uuid.uuid4().hex}"
        workdir = normalize_sandbox_path(cwd, self.spec.workdir) if cwd else self.spec.workdir
        full_env = {**self.spec.env, **(env or {}), VERIFIER_OWN_CONTAINER_ENV: "1"}
        host: dict[str, Any] = dict(
            network_mode=f"container:{self.container.id}",
            log_config={"type": "none"},  # output comes through the attach; none kept on disk
            **self.host,
        )
        if see_processes:
            host["pid_mode"] = f"container:{self.container.id}"
            host["cap_add"] = [*host.get("cap_add", ()), VERIFIER_EXTRA_CAP]
        host.pop("storage_opt", None)  # the verifier writes little; its writes are discarded
        # Its figures outlive it in a parent group of its own (the ledger reads them at the end).
        cgroup: VerifierCgroup | None = None
        if await asyncio.to_thread(_cgroup_driver, api) == "cgroupfs":
            cgroup = VerifierCgroup(name)
            host["cgroup_parent"] = cgroup.parent
        life = own_lifetime_settings()  # its own end, should its server die mid-run
        life_s = f"{int(-(-(timeout_s + life.grace_s) // 1))}" if life.enabled else ""
        start = time.perf_counter()
        in_flight: list[asyncio.Future[Any]] = []

        def thread(fn: Any, *args: Any, **kw: Any) -> asyncio.Future[Any]:
            fut = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kw))
            in_flight.append(fut)
            return fut

        def prepare() -> str:
            labels = self.labels()
            # The snapshot inherits the sandbox's labels; these mark it and its container as
            # a verifier's (and drop the bridge directory, which is the sandbox's alone).
            labels.update({LABEL_VERIFIER_OF: self.container.sandbox_id, LABEL_BRIDGE_DIR: ""})
            api.commit(
                self.container.id, repository=SNAPSHOT_REPO, tag=name, conf={"Labels": labels}
            )
            cid: str = api.create_container(
                image,
                entrypoint=["/bin/sh", "-c", _STDIN_BOOT, stdin_path, life_s],
                command=list(cmd),
                name=name,
                labels=labels,
                environment=full_env,
                working_dir=workdir,
                user="0",
                host_config=api.create_host_config(**host),
            )["Id"]
            api.put_archive(cid, "/", one_file_tar(stdin_path, stdin, 0o600))
            mounts = api.inspect_container(self.container.id).get("Mounts") or []
            unseen = sorted(m.get("Destination", "?") for m in mounts if m.get("Type") == "volume")
            if unseen:
                log.warning(
                    "docker: the verifier of sandbox %s sees the image's contents, not the "
                    "agent's, at its volume(s) %s (a commit holds no volume)",
                    self.container.sandbox_id,
                    ", ".join(unseen),
                )
            if self.on_created is not None:
                self.on_created(cid)
            return cid

        out, err = CappedBuffer(self.max_output_bytes), CappedBuffer(self.max_output_bytes)
        timed_out = False
        exit_code: int | None = None
        try:
            try:
                # a container creation like a sandbox's: under the same creation limits
                async with creating(DOCKER_BACKEND):
                    cid = await asyncio.shield(thread(prepare))
                    params = {"stdout": 1, "stderr": 1, "stream": 1}  # attached before start
                    sock = await asyncio.shield(thread(api.attach_socket, cid, params=params))
                    reader = thread(_demux, sock, out, err)
                    await asyncio.shield(thread(api.start, cid))
            except docker.errors.APIError as exc:
                await self.container.raise_if_lost("private exec", exc)
                raise SandboxError(
                    f"docker could not start the verifier container of sandbox {self.container.sandbox_id}: {exc}"
                ) from exc
            try:
                await asyncio.wait_for(asyncio.shield(reader), timeout_s)
            except TimeoutError:
                timed_out = True
                with contextlib.suppress(docker.errors.APIError):
                    await asyncio.shield(thread(api.kill, cid))
                try:  # the stream ends with the container; never hang on it
                    await asyncio.wait_for(asyncio.shield(reader), 5.0)
                except TimeoutError:
                    raw = _raw_socket(sock)
                    if raw is not None:
                        with contextlib.suppress(OSError):
                            raw.shutdown(socket.SHUT_RDWR)
            if not timed_out:
                status = await asyncio.shield(thread(api.wait, cid, timeout=60))
                exit_code = int(status.get("StatusCode", -1))
        finally:
            await asyncio.shield(self._drop_verifier(in_flight, name, image))
            await asyncio.shield(self._count_run(name, cgroup, time.perf_counter() - start))
        return ExecResult.from_buffers(
            out, err, exit_code=exit_code, timed_out=timed_out, started=start
        )

    async def _count_run(self, name: str, cgroup: VerifierCgroup | None, seconds: float) -> None:
        """Add what the verifier container `name` consumed to `runs` (read from its parent group,
        which is then removed)."""
        if cgroup is None:
            self.runs.append(
                CompanionUsage(
                    kind="verifier",
                    name=name,
                    seconds=seconds,
                    peak_memory_unavailable="cgroup_not_visible",
                )
            )
            return
        used = await asyncio.to_thread(cgroup.read_and_remove)
        self.runs.append(
            CompanionUsage(
                kind="verifier",
                name=name,
                seconds=seconds,
                cpu_s=used.cpu_s,
                peak_memory_bytes=used.peak_memory_bytes,
                peak_memory_unavailable=used.peak_memory_unavailable,
            )
        )

    async def _drop_verifier(
        self, in_flight: list[asyncio.Future[Any]], name: str, image: str
    ) -> None:
        """Remove a verifier's container and snapshot image, once the Docker calls it still has
        in flight returned (a commit or create finishing after the removal would leak)."""
        import docker.errors

        await self.container.engine.remove_container(name)  # ends the attach stream, if still open
        for fut in in_flight:
            with contextlib.suppress(BaseException):
                await fut
        await self.container.engine.remove_container(name)
        try:
            await asyncio.to_thread(self.container.api.remove_image, image, force=True)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("docker: could not remove verifier snapshot %s: %s", image, exc)
