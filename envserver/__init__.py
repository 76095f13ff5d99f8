"""envserver: the websocket Gym server, its wire protocol, and the clients.

Importing this package registers `sandgym/Terminal-v0` with Gymnasium (entry point
`envserver.gym_env:RemoteEnv`); it loads no server code, so clients and the trainer import it
cheaply. The server lives in `envserver.app` (`create_app`) and `envserver.runner`.
"""

import gymnasium

ENV_ID = "sandgym/Terminal-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="envserver.gym_env:RemoteEnv")

__all__ = ["ENV_ID"]
