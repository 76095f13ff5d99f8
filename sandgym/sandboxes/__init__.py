"""sandboxes: isolated environments for agent episodes (local, docker, e2b, null backends).

Imports nothing else of sandgym. Vendor SDKs load lazily through `get_backend`.
"""

from sandgym.sandboxes.base import Sandbox, SandboxBackend, SandboxCapabilities
from sandgym.sandboxes.errors import (
    BackendUnavailableError,
    CommandTimeoutError,
    NetworkPolicyUnsupportedError,
    SandboxClosedError,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxGroupUnsupportedError,
    SandboxHealthcheckError,
    SandboxLostError,
    SandboxPathError,
    UnknownBackendError,
    UserUnsupportedError,
)
from sandgym.sandboxes.network import NetworkPolicy
from sandgym.sandboxes.paths import normalize_sandbox_path
from sandgym.sandboxes.pool import (
    PoolClosedError,
    PoolKeyFailingError,
    PoolSettings,
    PoolStats,
    PoolTimeoutError,
    SandboxPool,
)
from sandgym.sandboxes.registry import backend_names, get_backend
from sandgym.sandboxes.spec import ExecResult, SandboxSpec, ShellResult
from sandgym.sandboxes.version import __version__

__all__ = [
    "__version__",
    "BackendUnavailableError",
    "CommandTimeoutError",
    "ExecResult",
    "NetworkPolicy",
    "NetworkPolicyUnsupportedError",
    "UserUnsupportedError",
    "PoolClosedError",
    "PoolKeyFailingError",
    "PoolSettings",
    "PoolStats",
    "PoolTimeoutError",
    "Sandbox",
    "SandboxBackend",
    "SandboxCapabilities",
    "SandboxClosedError",
    "SandboxCreateError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxGroupUnsupportedError",
    "SandboxHealthcheckError",
    "SandboxLostError",
    "SandboxPathError",
    "SandboxPool",
    "SandboxSpec",
    "ShellResult",
    "UnknownBackendError",
    "backend_names",
    "get_backend",
    "normalize_sandbox_path",
]
