"""Companion sandboxes counted beside the sandbox they were made for: a pristine or separate
verifier's sandbox is read (`usage`) and closed by `close_counted`, and what it used is kept
beside its episode's sandbox (`counted_beside`) for the episode's cost ledger
(`sandgym.server.cost`). Apart from `sandgym.sandboxes.usage` (the figures) so that the usage
models stay below `sandgym.sandboxes.base`."""

from __future__ import annotations

import asyncio
import time
import weakref

from sandgym.sandboxes.base import Sandbox
from sandgym.sandboxes.usage import CompanionKind, CompanionUsage, SandboxUsage

#: what was counted beside a sandbox and is not part of its own usage (`close_counted`)
_BESIDE: weakref.WeakKeyDictionary[Sandbox, list[CompanionUsage]] = weakref.WeakKeyDictionary()

#: a companion sandbox's usage read for longer than this is left out (its figures None)
READ_TIMEOUT_S = 10.0


def counted_beside(sandbox: Sandbox) -> list[CompanionUsage]:
    """What `close_counted` recorded beside `sandbox` (its episode's ledger adds it)."""
    return list(_BESIDE.get(sandbox, ()))


async def close_counted(companion: Sandbox, *, beside: Sandbox, kind: CompanionKind) -> None:
    """Close `companion` (a sandbox made for `beside`'s episode: a pristine or separate
    verifier's), having read its usage first and recorded it, and its own companions, beside
    `beside`. The close happens whatever the read does."""
    try:
        try:
            used = await asyncio.wait_for(companion.usage(), READ_TIMEOUT_S)
        except Exception:  # gone, or a slow engine: the figures are unknown, not 0
            used = SandboxUsage(peak_memory_unavailable="not_read")
        seconds = max(0.0, time.time() - companion.created_at)
        entry = CompanionUsage(
            kind=kind,
            name=companion.id,
            seconds=seconds,
            cpu_s=used.cpu_s,
            peak_memory_bytes=used.peak_memory_bytes,
            peak_memory_unavailable=used.peak_memory_unavailable,
        )
        _BESIDE.setdefault(beside, []).extend([entry, *used.companions])
    finally:
        await companion.close()
