"""Sandbox labels, and the decisions made from them: which sandboxes to reap, and which of a
live owner's own the pool's sweep may remove.

Every sandgym sandbox carries labels (Docker container labels, a local sandbox's `labels.json`,
E2B metadata): the owner server's id, its pid and host, a lease expiry. One decision function,
`should_reap`, says which ones go:

- default (orphans only): the lease expired, or the owning process on this host is dead
  (`owner_is_gone`); sandboxes of a live owner are never touched;
- `owner_id=X`: additionally everything owner X created (a server cleaning up after itself);
- `everything=True` (`sandgym reap --all`): every sandgym-managed sandbox, live owner or not.

Things without `sandgym.managed=1` are never removed, whatever the mode.

A live owner's own leftovers (a creation whose answer was lost when the engine died or the
call was cancelled: labelled with the live owner's id, so none of the above takes them) are the
live pool's to remove: its periodic sweep lists the sandboxes under its owner id and
`sweep_untracked` decides which the pool does not hold and no creation in flight may return.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandgym.sandboxes.version import __version__

if TYPE_CHECKING:
    from sandgym.sandboxes.spec import SandboxSpec

#: Label keys every sandgym sandbox carries (Docker labels, local marker file, E2B metadata).
LABEL_MANAGED = "sandgym.managed"
LABEL_OWNER = "sandgym.owner"  # owner server id
LABEL_OWNER_PID = "sandgym.owner_pid"  # pid of the owning process (same-host liveness check)
LABEL_OWNER_HOST = "sandgym.owner_host"
LABEL_LEASE_EXPIRY = "sandgym.lease_expiry"  # unix time after which anyone may reap it
LABEL_VERSION = "sandgym.version"
LABEL_FINGERPRINT = "sandgym.fingerprint"


def sandbox_labels(
    spec: SandboxSpec, *, backend: str, owner_id: str, lease_s: float
) -> dict[str, str]:
    """The labels a sandbox of `spec` carries on backend `backend` for owner `owner_id`, whose
    lease runs `lease_s` from now (the spec's own labels first, ours over them)."""
    labels = dict(spec.labels)
    labels.update(
        {
            LABEL_MANAGED: "1",
            LABEL_OWNER: owner_id,
            LABEL_OWNER_PID: str(os.getpid()),
            LABEL_OWNER_HOST: socket.gethostname(),
            LABEL_LEASE_EXPIRY: str(int(time.time() + lease_s)),
            LABEL_VERSION: __version__,
            LABEL_FINGERPRINT: spec.fingerprint(backend),
        }
    )
    return labels


def owner_is_gone(labels: dict[str, str], now: float | None = None) -> bool:
    """True when a sandbox's labels say nobody owns it any more (lease expired, or the owning
    process on this host is dead)."""
    now = time.time() if now is None else now
    try:
        if float(labels.get(LABEL_LEASE_EXPIRY, "0")) < now:
            return True
    except ValueError:
        return True
    if labels.get(LABEL_OWNER_HOST) == socket.gethostname():
        try:
            pid = int(labels.get(LABEL_OWNER_PID, "0"))
        except ValueError:
            return True
        if pid <= 0:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def should_reap(
    labels: dict[str, str],
    *,
    owner_id: str | None = None,
    everything: bool = False,
    now: float | None = None,
) -> bool:
    """Decide whether a sandbox with these labels is to be removed (see the module docstring)."""
    if labels.get(LABEL_MANAGED) != "1":
        return False
    if everything:
        return True
    if owner_id is not None and labels.get(LABEL_OWNER) == owner_id:
        return True
    return owner_is_gone(labels, now=now)


@dataclass(frozen=True)
class Sighting:
    """An untracked sandbox of ours, as the live pool's sweep first saw it."""

    first_seen: float  # monotonic time of the sweep round that first listed it
    creates_in_flight: frozenset[int]  # the creations in flight during that round's listing


def sweep_untracked(
    listed: Iterable[str],
    tracked: Set[str],
    seen: Mapping[str, Sighting],
    *,
    in_flight_during: Set[int],
    in_flight_now: Set[int],
    now: float,
    grace_s: float,
) -> tuple[list[str], dict[str, Sighting]]:
    """Decide which of a live owner's own sandboxes (`listed`: every one the backend holds
    under our owner id) the owner itself no longer knows of and may remove: the leftovers of a
    creation whose answer was lost (engine died, call cancelled) and of abandoned destroys.

    A listed sandbox is removed only when all of these hold:
    - it is not `tracked` (every sandbox a creation returned and whose close has not ended);
    - a previous round saw it untracked too (`seen`); a creation that returns later drops its
      id from `seen`, so it is never taken for a leftover;
    - no creation that was in flight while that round listed it is still in flight: a
      leftover can only come from a creation that began before it was listed, so once those
      have all ended (and none returned it) nobody will ever claim it;
    - at least `grace_s` passed since it was first seen (a margin on top).

    Returns (ids to remove, the sightings to keep for the next round). No clock of the
    backend is compared with ours: `now` and `first_seen` are the caller's monotonic time.
    """
    remove: list[str] = []
    keep: dict[str, Sighting] = {}
    for sid in dict.fromkeys(listed):
        if sid in tracked:
            continue
        sighting = seen.get(sid)
        if sighting is None:
            keep[sid] = Sighting(now, frozenset(in_flight_during))
        elif now - sighting.first_seen >= grace_s and not (
            sighting.creates_in_flight & in_flight_now
        ):
            remove.append(sid)
        else:
            keep[sid] = sighting
    return remove, keep
