"""The Dockerfile parser: what no-image backends apply, and what they refuse."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandgym.tasks.dockerfile import CopyStep, MkdirStep, RunStep, parse_dockerfile
from sandgym.tasks.errors import TaskLoadError, TaskUnsupportedError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


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


def test_a_copy_of_several_sources_gets_its_destination_slash_for_the_classic_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The classic builder refuses `COPY a b /dest` and `COPY dir/* /dest` (several matches)
    without the trailing slash, which BuildKit accepts; the rewritten context adds it."""
    from sandgym.tasks.dockerfile.copy_dest import copy_destinations
    from sandgym.tasks.loaders import load_task_dir
    from sandgym.tasks.sandbox_spec import sandbox_spec_for

    task_dir = tmp_path / "t"
    shutil.copytree(FIXTURES / "tbench-modern", task_dir)
    (task_dir / "deps").mkdir()
    for n in ("a.py", "b.py"):
        (task_dir / "deps" / n).write_text(n)
    (task_dir / "one").mkdir()
    (task_dir / "one" / "only.py").write_text("x")
    df = (
        "FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\n"
        "COPY deps/* /app\n"
        "COPY words.txt deps/a.py /srv\n"
        "COPY one/* /single\n"
        "COPY words.txt /app/words.txt\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.14 /uv /uvx /bin/\n"
        "COPY --chown=1:1 words.txt deps/b.py /opt/x/\n"
    )
    (task_dir / "Dockerfile").write_text(df)
    new, changed = copy_destinations(df, task_dir)
    assert changed == ["COPY deps/* /app", "COPY words.txt deps/a.py /srv"]
    assert "COPY deps/* /app/\n" in new and "COPY words.txt deps/a.py /srv/\n" in new
    # one match, one source, a slash already, another stage's image: as written
    for kept in ("COPY one/* /single\n", "COPY words.txt /app/words.txt\n", "/uvx /bin/\n"):
        assert kept in new
    assert copy_destinations(new, task_dir) == (new, [])  # idempotent
    monkeypatch.setenv("SANDGYM_CACHE", str(tmp_path / "cache"))
    spec = sandbox_spec_for(load_task_dir(task_dir))
    assert spec.build_context is not None and spec.build_context != task_dir
    assert (spec.build_context / "Dockerfile").read_text() == new
