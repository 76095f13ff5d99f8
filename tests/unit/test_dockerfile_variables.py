"""`$VAR` in a Dockerfile (issue 58, item 1): where an image is built, the image's own Env and
WorkingDir are the truth and a task's own env lies over them (`spec_over_image`); where none is
built, the parser expands variables from the base image's known environment and earlier ARG/ENV
lines by Docker's rules, and names what it cannot know instead of substituting ""."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgym.sandboxes.docker.image_config import spec_over_image
from sandgym.sandboxes.null import NullBackend
from sandgym.sandboxes.spec import SandboxSpec
from sandgym.tasks import load_task_dir
from sandgym.tasks.dockerfile import apply_dockerfile, parse_dockerfile
from sandgym.tasks.dockerfile.base_env import DEFAULT_PATH, PYTHON_PATH, base_image_env
from sandgym.tasks.errors import TaskUnsupportedError
from sandgym.tasks.sandbox_spec import sandbox_spec_for

CORPUS = Path(__file__).parents[1] / "fixtures" / "tasks" / "dockerfile-env"


@pytest.mark.parametrize(
    "line, value",
    [
        ('ENV PATH="/opt/tools/bin:${PATH}"', "/opt/tools/bin:" + PYTHON_PATH),
        ("ENV PATH=/opt/tools/bin:$PATH", "/opt/tools/bin:" + PYTHON_PATH),
        ("ENV X=${UNSET_IN_IMAGE:-dflt}", "dflt"),
        ("ENV X=${LANG:-dflt}", "C.UTF-8"),
        ("ENV X=${LANG:+alt}", "alt"),
        ("ENV X=${UNSET_IN_IMAGE:+alt}", ""),
        ("ENV X=$HOME", ""),  # the image sets no HOME: docker build expands it to ""
        ("ENV X=${EMPTY:-dflt}", "dflt"),  # with the colon an empty value counts as unset
        ("ENV X=${EMPTY-dflt}", ""),  # without it, only an unset one does
        ("ENV X=${EMPTY+alt}", "alt"),
        ("ENV X=${EMPTY:+alt}", ""),
        ("ENV X=${NOVALUE-dflt}", "dflt"),  # an ARG declared without a value is unset
        ("ENV X=${NOVALUE:-$LANG}", "C.UTF-8"),  # the word is expanded in turn
    ],
)
def test_expansion_follows_docker(line: str, value: str) -> None:
    df = parse_dockerfile(f"FROM python:3.13-slim\nENV EMPTY=\nARG NOVALUE\n{line}\n")
    key = line.split()[1].partition("=")[0]
    assert df.env[key] == value
    assert df.unresolved == []


def test_chains_arg_and_env_resolve_in_order() -> None:
    df = parse_dockerfile(
        "FROM debian:bookworm\nARG JDK=/opt/jdk\nENV JAVA_HOME=$JDK\n"
        "ENV PATH=$JAVA_HOME/bin:$PATH B=bee\nENV A=$B\nWORKDIR $JAVA_HOME/work\n"
    )
    assert df.env == {
        "JAVA_HOME": "/opt/jdk",
        "PATH": "/opt/jdk/bin:" + DEFAULT_PATH,
        "B": "bee",
        "A": "bee",
    }
    assert df.workdir == "/opt/jdk/work"
    assert df.unresolved == []


@pytest.mark.parametrize(
    "dockerfile, line, var, why",
    [
        (
            "FROM example.org/rust:1\nENV PATH=/usr/local/cargo/bin:${PATH}\n",
            2,
            "$PATH",
            "base image 'example.org/rust:1' is not one sandgym knows",
        ),
        (
            "FROM python:3.13-slim\nWORKDIR /src/$PYTHON_VERSION\n",
            2,
            "$PYTHON_VERSION",
            "base image 'python:3.13-slim' sets it, but its value is not in the image's name",
        ),
        (
            "FROM python:3.13-slim\nENV X=${LANG:?unset}\n",
            2,
            "${LANG:?unset}",
            "a substitution form the classic builder and BuildKit do not share",
        ),
    ],
)
def test_what_it_cannot_know_is_named(dockerfile: str, line: int, var: str, why: str) -> None:
    df = parse_dockerfile(dockerfile)
    assert len(df.unresolved) == 1, df.unresolved
    assert df.unresolved[0].startswith(f"Dockerfile line {line}: ")
    assert f"uses {var}, which sandgym cannot expand" in df.unresolved[0]
    assert why in df.unresolved[0]
    assert "X" not in df.env and "PATH" not in df.env  # never a half-expanded value


def test_a_variable_derived_from_an_unknown_one_is_refused_too() -> None:
    df = parse_dockerfile("FROM example.org/img\nARG P=$PATH\nENV A=ok\nENV Q=$P\n")
    assert df.env == {"A": "ok"}  # the ARG alone (unused) is no refusal
    assert len(df.unresolved) == 1 and "line 4: ENV uses $P" in df.unresolved[0]
    assert "line 2: ARG uses $PATH" in df.unresolved[0]


def test_a_full_python_tag_tells_its_version() -> None:
    df = parse_dockerfile("FROM python:3.11.9-slim-bookworm\nENV V=$PYTHON_VERSION\n")
    assert df.env == {"V": "3.11.9"}
    env = base_image_env("docker.io/library/ubuntu:24.04")
    assert env is not None and env.env == {"PATH": DEFAULT_PATH}
    assert base_image_env("example.org/ubuntu:24.04") is None


def test_spec_keeps_the_task_env_apart_from_the_parsed_dockerfile() -> None:
    task = load_task_dir(CORPUS / "java-home-chain")
    task.environment.env["TASK_OWN"] = "1"
    spec = sandbox_spec_for(task)
    assert spec.own_env == {"TASK_OWN": "1"}
    assert spec.own_workdir is False  # WORKDIR came from the Dockerfile
    # where no image is built, the parsed environment fills in under the task's own
    assert spec.env["PATH"] == "/opt/jdk/bin:" + PYTHON_PATH
    assert spec.env["TASK_OWN"] == "1" and spec.workdir == "/app"


def test_image_config_is_the_truth_where_an_image_runs() -> None:
    spec = SandboxSpec(
        env={"PATH": "/opt/tools/bin:", "TASK_OWN": "1"},
        own_env={"TASK_OWN": "1"},
        own_workdir=False,
        workdir="/app",
    )
    config = {"Env": ["PATH=/opt/tools/bin:/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/w"}
    run = spec_over_image(spec, config)
    assert run.env == {"PATH": "/opt/tools/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TASK_OWN": "1"}
    assert run.workdir == "/w"
    # an image without a WorkingDir keeps the default; a task's own workdir wins over the image's
    assert spec_over_image(spec, {"Env": []}).workdir == "/app"
    own = spec.model_copy(update={"own_workdir": True, "workdir": "/mine"})
    assert spec_over_image(own, config).workdir == "/mine"
    # sandgym's own variables (the egress proxy's) lie over the image's, the task's over both
    proxied = spec_over_image(
        spec.model_copy(update={"own_env": {"TASK_OWN": "1", "NO_PROXY": "task"}}),
        {"Env": ["HTTP_PROXY=http://image:1", "NO_PROXY=image"]},
        between={"HTTP_PROXY": "http://127.0.0.1:3128", "NO_PROXY": "sandgym"},
    )
    assert proxied.env == {
        "HTTP_PROXY": "http://127.0.0.1:3128",
        "NO_PROXY": "task",
        "TASK_OWN": "1",
    }
    # a spec of its own (the sandbox API's: no Dockerfile read) is left as it is
    plain = SandboxSpec(env={"A": "1"})
    assert spec_over_image(plain, config) is plain


async def test_image_less_backend_refuses_what_the_parser_cannot_know(tmp_path: Path) -> None:
    task_dir = tmp_path / "t"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('version = "1.0"\n')
    (task_dir / "instruction.md").write_text("x\n")
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        "FROM example.org/go:1.22\nENV PATH=/usr/local/go/bin:$PATH\n"
    )
    task = load_task_dir(task_dir)
    backend = NullBackend()
    sandbox = await backend.create(sandbox_spec_for(task))
    try:
        with pytest.raises(TaskUnsupportedError) as err:
            await apply_dockerfile(task, sandbox, [])
    finally:
        await sandbox.close()
    assert "Dockerfile line 2: ENV uses $PATH" in str(err.value)
    assert "'example.org/go:1.22'" in str(err.value)
    assert "PATH" not in sandbox.spec.env  # the sandbox never got a PATH cut short


def test_a_separate_verifier_runs_in_the_agents_workdir_not_its_images(tmp_path: Path) -> None:
    from sandgym.tasks.verifier.separate import verifier_sandbox_spec

    task_dir = tmp_path / "t"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text(
        'version = "1.0"\n[verifier]\nenvironment_mode = "separate"\n'
    )
    (task_dir / "instruction.md").write_text("x\n")
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\n")
    (task_dir / "tests" / "Dockerfile").write_text("FROM python:3.13-slim\nWORKDIR /grader\n")
    (task_dir / "environment" / "Dockerfile").write_text("FROM python:3.13-slim\nWORKDIR /app\n")
    spec = verifier_sandbox_spec(load_task_dir(task_dir), workdir="/srv/agent")
    run = spec_over_image(spec, {"Env": ["PATH=/usr/bin:/bin"], "WorkingDir": "/grader"})
    assert run.workdir == "/srv/agent"
    assert run.env == {"PATH": "/usr/bin:/bin"}
