"""sandgym as a Harbor environment provider: `harbor run --env sandgym.integrations.harbor:SandgymEnvironment`.

The class lives in `sandgym.integrations.harbor.environment` and is loaded on first use (this package
imports without Harbor installed; Harbor needs Python >= 3.12). It talks to a running
`sandgym serve` through the sandbox API (`sandgym.client.sandbox_client`): set `SANDGYM_URL` and
`SANDGYM_TOKEN`, or pass `--ek url=... --ek token=...`. See docs/sandbox-api.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SandgymEnvironment"]


def __getattr__(name: str) -> Any:
    if name == "SandgymEnvironment":
        # lazy: environment.py imports Harbor (Python >= 3.12, an extra); this package imports
        # without it
        from sandgym.integrations.harbor.environment import SandgymEnvironment

        return SandgymEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
