"""What the docker sandbox's pid 1 starts for an image (`exec_kill.image_argv`): the image's
ENTRYPOINT with Harbor's main command (`sh -c "sleep infinity"`, which replaces the image's CMD),
nothing without an ENTRYPOINT, and the original image's argv from a snapshot of a sandbox."""

from __future__ import annotations

from sandgym.sandboxes.docker.exec_kill import (
    HARBOR_MAIN_COMMAND,
    MAIN_PREFIX,
    image_argv,
    main_entrypoint,
)

HARBOR = ["sh", "-c", "sleep infinity"]


def test_entrypoint_gets_harbors_command_not_the_images_cmd() -> None:
    config = {"Entrypoint": ["/docker-entrypoint.sh", "--flag"], "Cmd": ["postgres"]}
    assert list(HARBOR_MAIN_COMMAND) == HARBOR
    assert image_argv(config) == ["/docker-entrypoint.sh", "--flag", *HARBOR]


def test_no_entrypoint_starts_nothing() -> None:
    assert image_argv({"Cmd": ["bash"]}) == []
    assert image_argv({"Entrypoint": None, "Cmd": None}) == []
    assert image_argv({"Entrypoint": []}) == []


def test_a_snapshot_gives_back_the_original_images_argv() -> None:
    original = ["/entry.sh", *HARBOR]
    committed = {"Entrypoint": main_entrypoint(original), "Cmd": None}
    assert committed["Entrypoint"][: len(MAIN_PREFIX)] == list(MAIN_PREFIX)
    assert image_argv(committed, snapshot=True) == original
    assert image_argv({"Entrypoint": main_entrypoint([])}, snapshot=True) == []
    # a snapshot whose entrypoint is not sandgym's own (another version's): nothing is re-run
    assert image_argv({"Entrypoint": ["/bin/sh", "-c", "old"]}, snapshot=True) == []
