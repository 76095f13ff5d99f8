"""The backend-neutral contract of `Sandbox.exec_private` that the command it runs may read.

A backend whose private exec is a container of its own, where nothing of the agent's runs (the
docker backend), sets `OWN_CONTAINER_ENV=1` in that command's environment; the verifier's
wrapper (sandgym/tasks/private_verify.py) then makes plain directories instead of mounting tmpfs. The
name lives here, not in a backend, so that the task layer names no backend.
"""

from __future__ import annotations

#: set (to "1") in a private exec that runs in a container of its own
OWN_CONTAINER_ENV = "SANDGYM_VERIFIER_OWN_CONTAINER"
