"""Lazy registry from backend name to class, so vendor SDKs load only when a backend is used."""

from __future__ import annotations

import importlib
from typing import Any

from sandgym.sandboxes.base import SandboxBackend
from sandgym.sandboxes.errors import UnknownBackendError

_BACKENDS: dict[str, str] = {
    "local": "sandgym.sandboxes.local:LocalBackend",
    "docker": "sandgym.sandboxes.docker:DockerBackend",
    "e2b": "sandgym.sandboxes.e2b:E2BBackend",
    "null": "sandgym.sandboxes.null:NullBackend",
}


def backend_names() -> list[str]:
    return sorted(_BACKENDS)


def get_backend(name: str, **kwargs: Any) -> SandboxBackend:
    """Instantiate the backend registered as `name` (`local`, `docker`, `e2b`, `null`)."""
    try:
        target = _BACKENDS[name]
    except KeyError:
        raise UnknownBackendError(
            f"unknown backend {name!r}; expected one of {', '.join(backend_names())}"
        ) from None
    module_name, cls_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    backend: SandboxBackend = cls(**kwargs)
    return backend
