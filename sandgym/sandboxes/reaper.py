"""`sandgym reap`: removes, on every backend, the sandboxes a dead or expired owner left behind.

The decision is `sandgym.sandboxes.labels.should_reap` (orphans by default; `owner_id=X` also all of
owner X's; `everything=True` every sandgym-managed sandbox). Each backend removes what it selects
through its own hook, `SandboxBackend.reap_matching`; this module only makes the backends by name
(`sandgym.sandboxes.registry`, so a vendor SDK loads only for the backend asked for) and collects what
they removed and what they could not into one report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.errors import BackendUnavailableError, SandboxError

# The label decisions moved to `sandgym.sandboxes.labels`; these names stay importable here.
from sandgym.sandboxes.labels import Sighting as Sighting
from sandgym.sandboxes.labels import should_reap as should_reap
from sandgym.sandboxes.labels import sweep_untracked as sweep_untracked
from sandgym.sandboxes.registry import get_backend

BACKENDS = ("docker", "local", "e2b")


@dataclass
class ReapReport:
    """What one reap removed, and what it could not (one entry per sandbox or backend)."""

    removed: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, list[dict[str, str]]]:
        return {"removed": self.removed, "errors": self.errors}


def default_backends() -> list[str]:
    """What `sandgym reap` looks at by default: docker and local, and E2B when a key is set
    (without one there is no E2B account to look in)."""
    return [b for b in BACKENDS if b != "e2b" or os.environ.get("E2B_API_KEY")]


async def reap_backend(
    report: ReapReport,
    backend: SandboxBackend,
    *,
    everything: bool = False,
    owner_id: str | None = None,
    images: bool = False,
) -> None:
    """Run one backend's reap hook into `report`; a backend that cannot run (no engine, no key)
    or whose listing failed is one error entry with an empty id."""
    name = backend.name
    try:
        removed, errors = await backend.reap_matching(
            everything=everything, owner_id=owner_id, images=images
        )
    except BackendUnavailableError as exc:
        report.errors.append({"backend": name, "id": "", "error": str(exc)})
        return
    except SandboxError as exc:  # the listing failed (the service answered with an error)
        report.errors.append({"backend": name, "id": "", "error": f"{name}: {exc}"})
        return
    report.removed += [{"backend": name, "id": i} for i in removed]
    report.errors += [{"backend": name, "id": i, "error": e} for i, e in errors]


async def reap(
    backends: tuple[str, ...] | list[str] = BACKENDS,
    *,
    everything: bool = False,
    owner_id: str | None = None,
    local_root_dir: Path | None = None,
    images: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> ReapReport:
    """Reap orphans on each named backend; a backend that cannot run is an error entry.
    `images`: also the cached images no sandbox uses (docker's task-context images).
    `options`: constructor arguments per backend name (`local_root_dir` is the local
    backend's `root`)."""
    for name in backends:
        if name not in BACKENDS:
            raise ValueError(f"expected a backend among {', '.join(BACKENDS)}, got {name!r}")
    opts = {k: dict(v) for k, v in (options or {}).items()}
    if local_root_dir is not None:
        opts.setdefault("local", {})["root"] = local_root_dir
    report = ReapReport()
    for name in backends:
        try:
            backend = get_backend(name, **opts.get(name, {}))
        except BackendUnavailableError as exc:
            report.errors.append({"backend": name, "id": "", "error": str(exc)})
            continue
        try:
            await reap_backend(
                report, backend, everything=everything, owner_id=owner_id, images=images
            )
        finally:
            await backend.aclose()
    return report
