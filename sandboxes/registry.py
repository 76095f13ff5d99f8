"""Lazy registry from backend name to class, so vendor SDKs load only when a backend is used."""

from __future__ import annotations

import importlib
from typing import Any

from sandboxes.base import SandboxBackend
from sandboxes.errors import UnknownBackendError

_BACKENDS: dict[str, str] = {
    "local": "sandboxes.local:LocalBackend",
    "docker": "sandboxes.docker:DockerBackend",
    "e2b": "sandboxes.e2b:E2BBackend",
    "null": "sandboxes.null:NullBackend",
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
