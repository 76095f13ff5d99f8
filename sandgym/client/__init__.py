"""The clients: what a trainer's environment needs, depending only on `sandgym.wire`.

- `AsyncEnvClient` (`sandgym.client.env_client`): the asyncio episode client (websocket `/v1/env`);
- `SandboxClient` (`sandgym.client.sandbox_client`): the sandbox API client (HTTP `/v1/sandboxes`);
- `RemoteEnv` / `RemoteDesktopEnv`: the Gymnasium envs.

Importing this package registers `sandgym/Terminal-v0` (entry point
`sandgym.client.gym_env:RemoteEnv`) and `sandgym/Desktop-v0`
(`sandgym.client.desktop_env:RemoteDesktopEnv`) with Gymnasium. It loads no server code.
"""

import gymnasium

from sandgym.client.env_client import AsyncEnvClient, ConnectionLostError, EnvError, StepResult
from sandgym.client.sandbox_client import SandboxClient

ENV_ID = "sandgym/Terminal-v0"
DESKTOP_ENV_ID = "sandgym/Desktop-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="sandgym.client.gym_env:RemoteEnv")
if DESKTOP_ENV_ID not in gymnasium.registry:
    gymnasium.register(id=DESKTOP_ENV_ID, entry_point="sandgym.client.desktop_env:RemoteDesktopEnv")

__all__ = [
    "DESKTOP_ENV_ID",
    "ENV_ID",
    "AsyncEnvClient",
    "ConnectionLostError",
    "EnvError",
    "SandboxClient",
    "StepResult",
]
