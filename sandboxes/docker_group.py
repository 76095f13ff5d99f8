"""Moved to `sandboxes.docker.group`; this name stays for existing imports."""

from sandboxes.docker.group import (
    LABEL_GROUP_OF,
    LABEL_SERVICE,
    DockerGroup,
    owned_group_ids,
    reap_group_networks,
    remove_group,
    wait_docker_health,
)

__all__ = [
    "LABEL_GROUP_OF",
    "LABEL_SERVICE",
    "DockerGroup",
    "owned_group_ids",
    "reap_group_networks",
    "remove_group",
    "wait_docker_health",
]
