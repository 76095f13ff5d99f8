"""The Dockerfile parser: what no-image backends apply, and what they refuse."""

from __future__ import annotations

import pytest

from tasks.dockerfile import CopyStep, MkdirStep, RunStep, parse_dockerfile
from tasks.errors import TaskLoadError, TaskUnsupportedError


def test_full_example() -> None:
    df = parse_dockerfile(
        """
        # comment
        ARG BASE=ubuntu:24.04
        FROM ${BASE}
        ARG APP=/srv
        WORKDIR $APP
        WORKDIR app
        ENV A=1 B="two words" \\
            C=${A}x
        ENV LEGACY value with spaces
        COPY --chown=1000:1000 --chmod=0755 run.sh data/ ./bin/
        ADD ["cfg.json", "/etc/cfg.json"]
        RUN apt-get update && \\
            apt-get install -y jq
        USER nobody
        RUN ["echo", "hi there"]
        CMD ["sleep", "infinity"]
        EXPOSE 80
        """
    )
    assert df.base_image == "ubuntu:24.04"
    assert df.workdir == "/srv/app"
    assert df.env == {"A": "1", "B": "two words", "C": "1x", "LEGACY": "value with spaces"}
    assert df.user == "nobody"
    steps = df.steps
    assert steps[0] == MkdirStep("/srv", steps[0].line)
    assert steps[1] == MkdirStep("/srv/app", steps[1].line)
    copy = steps[2]
    assert isinstance(copy, CopyStep)
    assert copy.sources == ["run.sh", "data/"] and copy.dest == "/srv/app/bin/"
    assert copy.chown == "1000:1000" and copy.chmod == "0755"
    add = steps[3]
    assert isinstance(add, CopyStep) and add.sources == ["cfg.json"] and add.dest == "/etc/cfg.json"
    run1, run2 = df.run_steps
    assert run1.command == "apt-get update && apt-get install -y jq"
    assert run1.workdir == "/srv/app" and run1.user is None
    assert isinstance(run2, RunStep) and run2.command == "echo 'hi there'" and run2.user == "nobody"
    assert any("CMD" in i for i in df.ignored) and any("EXPOSE" in i for i in df.ignored)


def test_multistage_is_unsupported() -> None:
    with pytest.raises(TaskUnsupportedError, match="multi-stage"):
        parse_dockerfile("FROM a AS build\nRUN make\nFROM b\n")


def test_copy_from_and_url_are_unsupported() -> None:
    with pytest.raises(TaskUnsupportedError, match="--from"):
        parse_dockerfile("FROM a\nCOPY --from=build /x /y\n")
    with pytest.raises(TaskUnsupportedError, match="URL"):
        parse_dockerfile("FROM a\nADD https://example.com/x.tgz /x\n")


def test_missing_from_and_bad_copy() -> None:
    with pytest.raises(TaskLoadError, match="no FROM"):
        parse_dockerfile("WORKDIR /app\n")
    with pytest.raises(TaskLoadError, match="source and a destination"):
        parse_dockerfile("FROM a\nCOPY onlyone\n")
