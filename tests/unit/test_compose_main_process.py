"""A task compose file's `entrypoint:`/`command:` on the main service (issue 58 item 1): read by
the loader (Harbor's `main`, Terminal-Bench 1's `client`), carried to the SandboxSpec (and its
fingerprint), combined with the image's ENTRYPOINT by Harbor's rule (`main_process.main_argv`,
what the docker sandbox's pid 1 starts), a keep-alive starting nothing, and anything else
refused by name on backends that cannot run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes.docker.exec_kill import image_argv
from sandgym.sandboxes.errors import SandboxGroupUnsupportedError
from sandgym.sandboxes.main_process import HARBOR_MAIN_COMMAND, is_keep_alive, main_argv
from sandgym.sandboxes.null import NullBackend
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks import load_task_dir
from sandgym.tasks.sandbox_spec import sandbox_spec_for
from tests.unit.test_compose_services import harbor_task, tb1_task

MARK = ["sh", "-c", "touch /tmp/compose-command-ran && exec sleep infinity"]
IMAGE = {"Entrypoint": ["/entry.sh"], "Cmd": ["serve"]}


def test_harbor_main_command_and_entrypoint_reach_the_spec(tmp_path: Path) -> None:
    compose = (
        "services:\n  main:\n    entrypoint: [/bin/run-me, --flag]\n"
        '    command: ["sh", "-c", "touch /tmp/compose-command-ran && exec sleep infinity"]\n'
    )
    task = load_task_dir(harbor_task(tmp_path, compose))
    assert task.environment.main_entrypoint == ("/bin/run-me", "--flag")
    assert task.environment.main_command == tuple(MARK)
    spec = sandbox_spec_for(task)
    assert (spec.main_entrypoint, spec.main_command) == (("/bin/run-me", "--flag"), tuple(MARK))
    # what the main process is changes the sandbox: it is in the fingerprint
    plain = spec.model_copy(update={"main_entrypoint": None, "main_command": None})
    assert spec.fingerprint("docker") != plain.fingerprint("docker")
    assert image_argv(IMAGE, entrypoint=spec.main_entrypoint, command=spec.main_command) == [
        "/bin/run-me",
        "--flag",
        *MARK,
    ]


def test_tb1_client_command_reaches_the_spec(tmp_path: Path) -> None:
    compose = (
        "services:\n  client:\n    build: {dockerfile: Dockerfile}\n"
        "    command: touch /tmp/x\n    entrypoint: ''\n"
    )
    spec = sandbox_spec_for(load_task_dir(tb1_task(tmp_path, compose)))
    assert (spec.main_entrypoint, spec.main_command) == ((), ("touch", "/tmp/x"))
    # an empty entrypoint clears the image's: the command alone runs
    assert image_argv(IMAGE, entrypoint=(), command=spec.main_command) == ["touch", "/tmp/x"]


def test_harbors_rule() -> None:
    harbor = list(HARBOR_MAIN_COMMAND)
    # no compose keys: the image's ENTRYPOINT with Harbor's command; none: nothing
    assert main_argv(None, None, IMAGE) == ["/entry.sh", *harbor]
    assert main_argv(None, None, {"Cmd": ["bash"]}) == []
    # a command alone: after the image's ENTRYPOINT, or alone as the main process
    assert main_argv(None, MARK, IMAGE) == ["/entry.sh", *MARK]
    assert main_argv(None, MARK, {"Cmd": ["bash"]}) == MARK
    # an entrypoint alone gets Harbor's command (its base file's, merged under the task's)
    assert main_argv(["/bin/e"], None, IMAGE) == ["/bin/e", *harbor]


@pytest.mark.parametrize(
    "argv",
    [
        ["sh", "-c", "sleep infinity"],
        ["/bin/bash", "-c", "exec sleep infinity"],
        ["sleep", "infinity"],
        ["tail", "-f", "/dev/null"],
        ["sh", "-c", "tail -f /dev/null"],
    ],
)
def test_a_keep_alive_starts_nothing(tmp_path: Path, argv: list[str]) -> None:
    assert is_keep_alive(argv)
    assert main_argv(None, argv, {}) == []
    assert image_argv({"Cmd": ["bash"]}, command=tuple(argv)) == []
    # with an image ENTRYPOINT the keep-alive is its argument, as under Harbor
    assert image_argv(IMAGE, command=tuple(argv)) == ["/entry.sh", *argv]
    # and on a backend that runs no image it is no reason to refuse the task
    spec = SandboxSpec(main_command=tuple(argv))
    assert spec.container_settings == []


def test_not_keep_alives() -> None:
    for argv in (MARK, ["sleep", "10"], ["sh", "-c", "sleep infinity; echo"], ["tail", "-f", "x"]):
        assert not is_keep_alive(argv), argv


async def test_a_main_process_is_refused_by_name_where_it_cannot_run(tmp_path: Path) -> None:
    from sandgym.sandboxes.docker import DockerBackend
    from sandgym.sandboxes.local import LocalBackend

    for fields, names in (
        ({"main_command": tuple(MARK)}, "['main_command']"),
        ({"main_entrypoint": ("/bin/e",)}, "['main_entrypoint']"),
        ({"main_entrypoint": ("sleep",), "main_command": ("infinity",)}, None),
        ({"main_entrypoint": (), "main_command": ("sleep", "infinity")}, None),
    ):
        spec = SandboxSpec(**fields)  # type: ignore[arg-type]
        DockerBackend.check_services(DockerBackend.__new__(DockerBackend), spec)  # accepted
        if names is None:  # the result only keeps the container up
            assert spec.container_settings == []
            continue
        null = NullBackend()
        with pytest.raises(SandboxGroupUnsupportedError, match=f"container settings \\{names}"):
            await null.create(spec)
        assert null.created == 0
        with pytest.raises(SandboxGroupUnsupportedError, match="local backend cannot honour"):
            await LocalBackend(root=tmp_path / "local").create(spec)
