"""The host's static bash for bash-less service containers (`sandgym.sandboxes.docker.service_life`):
a file counts only when it is a 64-bit ELF with no program interpreter; `SANDGYM_STATIC_BASH`
naming anything else is a named error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandgym.sandboxes.docker import service_life
from sandgym.sandboxes.docker.service_life import is_static_elf, static_bash, static_bash_tar
from tests.integration.test_service_life import pause_program


def test_a_static_elf_is_told_from_a_dynamic_one_and_from_a_script(tmp_path: Path) -> None:
    assert is_static_elf(pause_program())  # no PT_INTERP
    dynamic = Path(os.path.realpath("/bin/sh")).read_bytes()[:65536]
    assert not is_static_elf(dynamic)  # the host's sh asks for ld.so
    assert not is_static_elf(b"#!/bin/sh\necho hi\n")


def test_the_named_static_bash_or_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    static = tmp_path / "bash"
    static.write_bytes(pause_program())
    monkeypatch.setenv("SANDGYM_STATIC_BASH", str(static))
    assert static_bash() == static
    monkeypatch.setenv("SANDGYM_STATIC_BASH", os.path.realpath("/bin/sh"))
    with pytest.raises(ValueError, match="expected a statically linked 64-bit ELF executable"):
        static_bash()
    monkeypatch.setenv("SANDGYM_STATIC_BASH", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match="expected a static bash, found no file"):
        static_bash()
    monkeypatch.delenv("SANDGYM_STATIC_BASH")
    monkeypatch.setattr(service_life, "STATIC_BASH_PATHS", (str(tmp_path / "absent"),))
    assert static_bash() is None  # none on this host: services without bash keep the watcher


def test_the_copy_lands_at_its_place(tmp_path: Path) -> None:
    import io
    import tarfile

    static = tmp_path / "bash"
    static.write_bytes(pause_program())
    with tarfile.open(fileobj=io.BytesIO(static_bash_tar(static))) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert list(names) == ["run", "run/sandgym-keeper", "run/sandgym-keeper/bash"]
    member = names["run/sandgym-keeper/bash"]
    assert member.mode == 0o755 and member.size == len(pause_program())


def test_a_misnamed_static_bash_is_a_warning_where_containers_are_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A creation is not refused for it: the container keeps the weaker form, and the log says
    what the variable named."""
    from sandgym.sandboxes.docker.service_life import usable_static_bash

    monkeypatch.setenv("SANDGYM_STATIC_BASH", str(tmp_path / "absent"))
    with caplog.at_level("WARNING", logger="sandgym.sandboxes.docker.service_life"):
        assert usable_static_bash() is None
    assert f"found no file {tmp_path / 'absent'}" in caplog.text
