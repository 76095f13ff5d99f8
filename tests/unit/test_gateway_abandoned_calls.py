"""A finished run clears the harness calls of episodes it abandoned in flight
(`sandgym.trainer.gateway.records.drop_abandoned_calls`, called by the trainer's shutdown)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sandgym.trainer.gateway.records import CallStore, drop_abandoned_calls


def test_a_finished_runs_left_calls_are_dropped(tmp_path: Path) -> None:
    store_dir = tmp_path / "gateway"
    store_dir.mkdir()
    CallStore(store_dir / "w0.sqlite").close()  # the real table
    with sqlite3.connect(store_dir / "w0.sqlite") as db:
        db.executemany(
            "INSERT INTO calls VALUES (?, ?, ?)",
            [("s1", 0, "{}"), ("s1", 1, "{}"), ("s2", 0, "{}")],
        )
    assert drop_abandoned_calls(store_dir) == 3
    with sqlite3.connect(store_dir / "w0.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM calls").fetchone() == (0,)
    assert drop_abandoned_calls(tmp_path / "absent") == 0
