"""The spec cache: each task's `SandboxSpec`, built once per task object. Building one reads the
task's Dockerfile (about 5 % of the server's CPU when every reset rebuilt it, in the sessions
benchmark), and checks that the backend can give the task its network and services, so a task it
cannot run is refused here, before any sandbox is made."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandgym.sandboxes import SandboxBackend, SandboxSpec
from sandgym.server.settings import ServerSettings
from sandgym.tasks.sandbox_spec import sandbox_spec_for

if TYPE_CHECKING:
    from sandgym.tasks.models import TaskSpec


class SpecCache:
    """task id -> (the task object, its `SandboxSpec`)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.network_ceiling = settings.network_ceiling_policy()
        self._specs: dict[str, tuple[TaskSpec, SandboxSpec]] = {}

    def spec_for(self, task: TaskSpec, backend: SandboxBackend | None) -> SandboxSpec:
        """The task's spec (the server's network clamp applied), checked against `backend`."""

        cached = self._specs.get(task.id)
        if cached is not None and cached[0] is task:
            return cached[1]
        spec = sandbox_spec_for(task, self.settings.image_map, network_ceiling=self.network_ceiling)
        # A network this backend cannot enforce refuses the task here, before any sandbox.
        if backend is not None:
            backend.check_network(spec)
            backend.check_services(spec)  # a multi-container task needs docker
        self._specs[task.id] = (task, spec)
        return spec
