"""The one image per task that both sides of `sandgym bench harbor_provider` run: the task copy's
`[environment] docker_image` names it (lab/bench/harbor_shared_images.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from lab.bench.harbor_shared_images import (
    SharedImageError,
    build_argv,
    build_shared,
    image_name,
    set_docker_image,
)

IMAGE = "sandgym-bench-shared/regex-log:bench-harbor-1a2b3c4d"


def _env(text: str) -> dict[str, object]:
    return dict(tomllib.loads(text)["environment"])


def test_docker_image_added_to_the_environment_table_keeping_its_settings() -> None:
    text = (
        'version = "1.0"\n[metadata]\nname = "x"\n[environment]\ncpus = 2\n'
        'network_mode = "public"\n[environment.healthcheck]\ncommand = "true"\n'
        "[verifier]\ntimeout_sec = 60.0\n"
    )
    out = tomllib.loads(set_docker_image(text, IMAGE))
    assert out["environment"]["docker_image"] == IMAGE
    assert out["environment"]["cpus"] == 2
    assert out["environment"]["network_mode"] == "public"
    assert out["environment"]["healthcheck"] == {"command": "true"}
    assert out["verifier"] == {"timeout_sec": 60.0}
    assert "docker_image" not in out["metadata"]


def test_docker_image_replaced_where_the_task_named_one() -> None:
    text = '[environment]\ndocker_image = "ghcr.io/x/y:1"\nmemory_mb = 512\n'
    out = set_docker_image(text, IMAGE)
    assert _env(out) == {"docker_image": IMAGE, "memory_mb": 512}


def test_docker_image_of_another_table_left_alone() -> None:
    text = '[agent]\ndocker_image = "other"\n[environment]\ncpus = 1\n'
    out = tomllib.loads(set_docker_image(text, IMAGE))
    assert out["agent"]["docker_image"] == "other"
    assert out["environment"]["docker_image"] == IMAGE


def test_environment_table_added_when_the_task_has_none() -> None:
    out = tomllib.loads(set_docker_image('version = "1.0"\n[verifier]\ntimeout_sec = 9\n', IMAGE))
    assert out["environment"] == {"docker_image": IMAGE}
    assert out["verifier"] == {"timeout_sec": 9}


def test_image_name_is_a_lower_case_reference_per_task_and_run() -> None:
    assert image_name("Regex_Log", "bench-harbor-1a2b3c4d") == (
        "sandgym-bench-shared/regex_log:bench-harbor-1a2b3c4d"
    )
    assert image_name("a", "r1") != image_name("a", "r2")


def test_build_argv_builds_the_environment_dir_under_the_shared_tag(tmp_path: Path) -> None:
    argv = build_argv(tmp_path / "t", IMAGE)
    assert argv[:2] == ["docker", "build"]
    assert argv[argv.index("-t") + 1] == IMAGE
    assert argv[argv.index("-f") + 1] == str(tmp_path / "t" / "environment" / "Dockerfile")
    assert argv[-1] == str(tmp_path / "t" / "environment")


def test_a_task_without_a_dockerfile_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / "t" / "environment").mkdir(parents=True)
    (tmp_path / "t" / "task.toml").write_text("[environment]\n")
    with pytest.raises(SharedImageError, match="environment/Dockerfile"):
        build_shared(tmp_path / "t", "r1")
