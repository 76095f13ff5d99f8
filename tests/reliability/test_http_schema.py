"""schemathesis over the HTTP API's own OpenAPI schema (a real server, null backend): whatever
the generated paths, query strings and bodies, no answer is a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from sandgym.sandboxes import get_backend
from sandgym.server.runner import BackgroundServer
from sandgym.server.settings import ServerSettings


@pytest.fixture(scope="module")
def http_schema(rel_tasks: Path) -> Iterator[Any]:
    s = ServerSettings(
        host="127.0.0.1", port=0, backend="null", task_dirs=[rel_tasks], include_builtin=False
    )
    with BackgroundServer(s, get_backend("null")) as srv:
        yield schemathesis.openapi.from_url(f"{srv.http_url}/openapi.json")


# schemathesis' own pytest integration does not load under this pytest; each operation's
# hypothesis strategy is driven directly instead (same generation, same calls).
def test_http_api_never_answers_5xx(http_schema: Any) -> None:
    operations = [r.ok() for r in http_schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/healthz", "/v1/tasks", "/v1/pool", "/v1/sessions", "/v1/pool/prewarm"} <= paths
    statuses: dict[int, int] = {}
    # Negative cases need something to make invalid: an operation without parameters or body
    # has none (hypothesis would report Unsatisfiable), so it runs in positive mode only.
    # Nothing else is passed over: any error of the run fails the test.
    runs = [
        (op, mode)
        for op in operations
        for mode in schemathesis.GenerationMode
        if mode is schemathesis.GenerationMode.POSITIVE or _has_inputs(op)
    ]
    assert any(mode is schemathesis.GenerationMode.NEGATIVE for _, mode in runs)
    for op, mode in runs:

        @settings(
            max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(case=op.as_strategy(generation_mode=mode))
        def call(case: Any) -> None:
            response = case.call(timeout=30)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} body={str(case.body)[:300]} -> "
                f"{response.status_code} {response.text[:300]}"
            )

        try:
            call()
        except Unsatisfiable:
            # negative mode of an operation whose only inputs admit every value (a free string
            # path parameter, as /v1/sandboxes/{id}): nothing can be made invalid; its positive
            # mode still ran above (runs lists POSITIVE first)
            if mode is not schemathesis.GenerationMode.NEGATIVE:
                raise
    assert sum(statuses.values()) >= len(operations) and 422 in statuses, statuses


def _has_inputs(op: Any) -> bool:
    return any(True for _ in op.iter_parameters()) or any(True for _ in op.body)
