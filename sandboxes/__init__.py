"""sandboxes: isolated environments for agent episodes (local, docker, e2b, null backends).

Imports nothing else of sandgym. Vendor SDKs load lazily through `get_backend`.
"""

__version__ = "0.1.0"

from sandboxes.base import Sandbox, SandboxBackend, SandboxCapabilities  # noqa: E402
from sandboxes.errors import (  # noqa: E402
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
from sandboxes.network import NetworkPolicy  # noqa: E402
from sandboxes.paths import normalize_sandbox_path  # noqa: E402
from sandboxes.pool import (  # noqa: E402
    PoolClosedError,
    PoolKeyFailingError,
    PoolSettings,
    PoolStats,
    PoolTimeoutError,
    SandboxPool,
)
from sandboxes.registry import backend_names, get_backend  # noqa: E402
from sandboxes.spec import ExecResult, SandboxSpec, ShellResult  # noqa: E402

__all__ = [
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
