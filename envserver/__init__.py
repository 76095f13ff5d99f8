"""envserver: the websocket Gym server, its wire protocol, and the clients.

Importing this package registers `sandgym/Terminal-v0` (entry point `envserver.gym_env:RemoteEnv`)
and `sandgym/Desktop-v0` (`envserver.desktop_env:RemoteDesktopEnv`) with Gymnasium; it loads no server code, so clients and the trainer import it
cheaply. The server lives in `envserver.app` (`create_app`) and `envserver.runner`.
"""

import gymnasium

ENV_ID = "sandgym/Terminal-v0"
DESKTOP_ENV_ID = "sandgym/Desktop-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="envserver.gym_env:RemoteEnv")
if DESKTOP_ENV_ID not in gymnasium.registry:
    gymnasium.register(id=DESKTOP_ENV_ID, entry_point="envserver.desktop_env:RemoteDesktopEnv")

__all__ = ["DESKTOP_ENV_ID", "ENV_ID"]
