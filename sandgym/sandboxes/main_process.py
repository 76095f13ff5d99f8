"""What a container runs as its main process: the engine's rule, and Harbor's main service.

`engine_argv` is how the engine combines a compose service's `entrypoint:`/`command:` with its
image's ENTRYPOINT and CMD (`docker.service_life.service_argv` uses it for the services beside a
sandbox). Harbor runs a task's main container with its compose files merged: its base file sets
`command: ["sh", "-c", "sleep infinity"]` on the main service (HARBOR_MAIN_COMMAND) and the
task's own `environment/docker-compose.yaml`, merged last, may set `entrypoint:` and `command:`
over it (Terminal-Bench 1's `docker-compose.yaml`, main service `client`, says the same things).
`main_argv` is what that main service runs; sandgym's pid 1 starts it once as its child
(`docker.exec_kill.image_argv`). An argv that only keeps the container up (`is_keep_alive`:
`sleep infinity`, `tail -f /dev/null`, alone or under `sh -c`) is not started: sandgym's pid 1
already keeps the container up."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

#: Harbor's main service command (its docker-compose files: `command: ["sh", "-c", "sleep
#: infinity"]`), which the image's ENTRYPOINT receives as its arguments, as under Harbor
HARBOR_MAIN_COMMAND = ("sh", "-c", "sleep infinity")

#: commands that do nothing but keep a container up (after `exec`, under `sh -c` or alone)
_KEEP_ALIVE = {("sleep", "infinity"), ("tail", "-f", "/dev/null")}

_SHELLS = {"sh", "bash", "dash", "ash"}


def engine_argv(
    entrypoint: Sequence[str] | None,
    command: Sequence[str] | None,
    image_config: Mapping[str, Any],
) -> list[str]:
    """The argv the engine runs for a compose service from an image whose config (`docker image
    inspect`'s Config) is `image_config`: the compose `entrypoint` (an empty one clears the
    image's), else the image's ENTRYPOINT; then the compose `command`, else the image's CMD,
    which an entrypoint set by the compose file drops (the engine's rule when a container is
    created with an entrypoint). None: the key is not set."""
    if entrypoint:
        return [*entrypoint, *(command or ())]
    image_entrypoint = list(image_config.get("Entrypoint") or []) if entrypoint is None else []
    cmd = list(command) if command else list(image_config.get("Cmd") or [])
    return [*image_entrypoint, *cmd]


def is_keep_alive(argv: Sequence[str]) -> bool:
    """Whether `argv` only keeps a container up: `sleep infinity` or `tail -f /dev/null`, alone
    or as the one command of `sh -c` / `bash -c` (an `exec` before it allowed); an empty argv
    runs nothing and counts as one too."""
    words = list(argv)
    if not words:
        return True
    if len(words) == 3 and os.path.basename(words[0]) in _SHELLS and words[1] == "-c":
        try:
            words = shlex.split(words[2])
        except ValueError:
            return False
        if words[:1] == ["exec"]:
            words = words[1:]
    if words:
        words[0] = os.path.basename(words[0])
    return tuple(words) in _KEEP_ALIVE


def main_argv(
    entrypoint: Sequence[str] | None,
    command: Sequence[str] | None,
    image_config: Mapping[str, Any],
) -> list[str]:
    """What Harbor's main service runs, given the task compose file's `entrypoint` and `command`
    on it (None: not set) and the image's config (`{}` where there is no image): `engine_argv`
    with HARBOR_MAIN_COMMAND standing for an unset command; [] when that only keeps the
    container up (`is_keep_alive`), which sandgym's pid 1 does already."""
    cmd = tuple(command) if command is not None else HARBOR_MAIN_COMMAND
    argv = engine_argv(entrypoint, cmd, image_config)
    return [] if is_keep_alive(argv) else argv
