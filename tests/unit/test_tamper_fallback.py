"""The tamper report's fallback without a trace (sandgym/tasks/tamper.py, `classify_fallback`):
a file in one of the sandbox's own PATH directories, uv's managed CPython, git hooks and config,
name resolution and certificate stores are named; other paths are not."""

from __future__ import annotations

import pytest

from sandgym.tasks.tamper import classify_fallback

PATH = ("/opt/venv/bin", "/usr/local/bin", "/usr/bin")


@pytest.mark.parametrize(
    ("path", "category"),
    [
        ("/opt/venv/bin/python", "search_path"),
        ("/opt/conda/bin/python", "tool_stores"),
        (
            "/root/.local/share/uv/python/cpython-3.13-linux-x86_64-gnu/bin/python3.13",
            "tool_stores",
        ),
        ("/app/.git/hooks/post-commit", "git_files"),
        ("/app/.git/config", "git_files"),
        ("/etc/hosts", "name_resolution"),
        ("/etc/resolv.conf", "name_resolution"),
        ("/etc/ssl/certs/ca-certificates.crt", "certificates"),
        ("/usr/local/share/ca-certificates/agent.crt", "certificates"),
        ("/srv/data/input.csv", None),
        ("/opt/venv/lib/notes.txt", None),
        ("/opt/venv/bin", None),
    ],
)
def test_fallback_categories(path: str, category: str | None) -> None:
    assert classify_fallback(path, PATH) == category


def test_search_path_is_the_sandboxes_own() -> None:
    assert classify_fallback("/opt/venv/bin/python", ()) is None
    assert classify_fallback("/opt/tool/bin/run", ("/opt/tool/bin",)) == "search_path"
