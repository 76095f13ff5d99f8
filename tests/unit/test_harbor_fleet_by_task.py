"""`lab.bench.harbor_fleet.by_task`: one phase's raw trial lines grouped per task, as the Harbor
fleet record writes them (rewards sorted with the missing ones last, exceptions, and the
environments each server held, a retried trial counting on both)."""

from __future__ import annotations

from typing import Any

from lab.bench.harbor_fleet import by_task


def _row(task: str, servers: list[str], reward: float | None, exc: str | None) -> dict[str, Any]:
    return {"task": task, "servers": servers, "reward": reward, "exception": exc}


def test_by_task_groups_rewards_and_servers_per_task() -> None:
    rows = [
        _row("sqlite-db-truncate", ["B"], None, "ServerLostError"),
        _row("hello-file", ["A"], 1.0, None),
        _row("sqlite-db-truncate", ["B", "A"], 1.0, None),
        _row("sqlite-db-truncate", ["A"], 0.0, None),
    ]
    assert by_task(rows) == [
        {
            "task": "hello-file",
            "trials": 1,
            "rewards": [1.0],
            "exceptions": ["None"],
            "environments_per_server": {"A": 1},
        },
        {
            "task": "sqlite-db-truncate",
            "trials": 3,
            "rewards": [0.0, 1.0, None],
            "exceptions": ["None", "None", "ServerLostError"],
            "environments_per_server": {"B": 2, "A": 2},
        },
    ]
