"""`sandgym.sandboxes.docker.changes.split_diff`: which `docker diff` entries are the sandbox's own
changes (packed or deleted) and which are what the engine mounts into every container."""

from __future__ import annotations

from sandgym.sandboxes.docker.changes import split_diff


def test_engine_paths_mounts_and_init_are_left_out() -> None:
    diff = [
        {"Path": "/app", "Kind": 0},
        {"Path": "/app/data.txt", "Kind": 1},
        {"Path": "/etc/debian_version", "Kind": 2},
        {"Path": "/etc/hosts", "Kind": 0},
        {"Path": "/etc/hostname", "Kind": 0},
        {"Path": "/etc/resolv.conf", "Kind": 0},
        {"Path": "/run/sandgym", "Kind": 1},
        {"Path": "/run/sandgym/gateway.sock", "Kind": 1},
        {"Path": "/data", "Kind": 1},  # a volume
        {"Path": "/data/x", "Kind": 1},
        {"Path": "/usr/sbin/docker-init", "Kind": 1},
        {"Path": "/sbin/docker-init", "Kind": 1},
        {"Path": "/usr/local/bin/docker-init", "Kind": 1},  # not the engine's: a file
        {"Path": "/run/sandgymx", "Kind": 1},  # a sibling, not under the mount
        {"Path": "/dev/shm/y", "Kind": 1},
        {"Path": "/", "Kind": 0},
        {"Path": "relative", "Kind": 1},
    ]
    keep, deleted = split_diff(diff, mounts=("/run/sandgym", "/data"))
    assert keep == ["/app", "/app/data.txt", "/run/sandgymx", "/usr/local/bin/docker-init"]
    assert deleted == ["/etc/debian_version"]


def test_nothing_changed() -> None:
    assert split_diff([], mounts=()) == ([], [])
