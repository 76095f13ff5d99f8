"""The one error-code table (sandgym/wire/codes.py): one row per code of each API, the servers'
mappings take their retryable flags from it, and the runners take "the agent can cause it" from
it instead of spelling codes."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandgym.client.env_client import ConnectionLostError, EnvError
from sandgym.client.episode_loop import classify
from sandgym.sandboxes import errors as sbx
from sandgym.sandboxes.desktop import DesktopActionError, DesktopStartError
from sandgym.sandboxes.pool import PoolClosedError, PoolKeyFailingError, PoolTimeoutError
from sandgym.server import errors as e
from sandgym.server import sandbox_api as sa
from sandgym.tasks import errors as terr
from sandgym.trainer.failures import classify_failure, drops_group, is_masked
from sandgym.wire import codes
from sandgym.wire.protocol import ERROR_CODES, parse_client_message
from sandgym.wire.sandbox_protocol import SANDBOX_ERROR_CODES, ExecRequest

REPO = Path(__file__).resolve().parents[2]


def _validation_error(parse) -> ValidationError:
    try:
        parse()
    except ValidationError as exc:
        return exc
    raise AssertionError("expected a ValidationError")


# -- the table -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "wire_codes"),
    [(codes.EPISODE_RULES, ERROR_CODES), (codes.SANDBOX_RULES, SANDBOX_ERROR_CODES)],
    ids=["episode", "sandbox"],
)
def test_every_code_has_exactly_one_row(rows, wire_codes) -> None:
    assert len(wire_codes) >= 9, wire_codes
    counts = Counter(r.code for r in rows)
    assert {c: n for c, n in counts.items() if n != 1} == {}, "a code with several rows"
    assert sorted(counts) == sorted(wire_codes), "the table's codes are not the wire's"
    assert len({r.api for r in rows}) == 1


def test_each_row_says_who_and_why_in_one_line() -> None:
    rows = codes.EPISODE_RULES + codes.SANDBOX_RULES
    assert len(rows) == len(ERROR_CODES) + len(SANDBOX_ERROR_CODES)
    bad = [
        r.code
        for r in rows
        if r.caused_by not in codes.CAUSES or not r.reason.strip() or "\n" in r.reason
    ]
    assert bad == []
    conditions = [(r.api, r.code, name, c) for r in rows for name, c in r.conditions.items()]
    assert len(conditions) >= 5, conditions  # busy, pool_closed (x2), sandbox_create, desktop, ...
    # a condition exists only to give a different answer, and says why
    pointless = [
        (api, code, name)
        for api, code, name, c in conditions
        if c.retryable == codes.rule(api, code).retryable or not c.reason.strip()
    ]
    assert pointless == []
    assert codes.rule("episode", "action_timeout").caused_by == "agent"
    assert codes.AGENT_CAUSABLE_CODES == {"action_timeout", "verifier_error"}
    assert codes.GOES_ON_CODES == {"invalid_message"}


def test_a_code_of_both_apis_answers_once_or_says_why_not() -> None:
    shared = sorted(set(ERROR_CODES) & set(SANDBOX_ERROR_CODES))
    assert shared == ["capacity", "internal", "sandbox_lost", "unauthorized"]
    differing = []
    for code in shared:
        ep, sb = codes.rule("episode", code), codes.rule("sandbox", code)
        if ep.retryable != sb.retryable:
            differing.append(code)
            assert ep.api_note and sb.api_note, f"{code}: answers differ by API without a note"
    assert differing == ["sandbox_lost"]


def test_unknown_codes_and_conditions_are_named_errors() -> None:
    with pytest.raises(codes.UnknownCodeError, match="expected a episode API error code in"):
        codes.retryable_for("episode", "exec_timeout")
    with pytest.raises(codes.UnknownCodeError, match="expected a condition of episode code"):
        codes.retryable_for("episode", "capacity", "busy")


# -- the servers' mappings agree with the table ------------------------------------------------------
#: (exception, the episode API's code, the table's condition it is met for)
WIRE_CASES: list[tuple[BaseException, str, str | None]] = [
    (
        _validation_error(lambda: parse_client_message('{"type":"close","request_id":"1","x":1}')),
        "invalid_message",
        None,
    ),
    (e.InvalidMessageError("bad"), "invalid_message", None),
    (e.MessageTooLargeError("big"), "invalid_message", None),
    (e.BusyError("busy"), "invalid_message", "busy"),
    (e.UnsupportedActionError("no x"), "invalid_message", None),
    (e.NoEpisodeError("none"), "no_episode", None),
    (e.CapacityError("full"), "capacity", None),
    (e.UnauthorizedError("who"), "unauthorized", None),
    (terr.UnknownTaskError("no task x"), "unknown_task", None),
    (terr.TaskUnsupportedError("not on local"), "unknown_task", None),
    (terr.VerifierError("no reward", output="log"), "verifier_error", None),
    (sbx.NetworkPolicyUnsupportedError("allowlist"), "unknown_task", None),
    (sbx.SandboxGroupUnsupportedError("services"), "unknown_task", None),
    (sbx.UserUnsupportedError("user"), "unknown_task", None),
    (PoolTimeoutError("waited"), "capacity", None),
    (PoolClosedError("closed"), "internal", "pool_closed"),
    (DesktopActionError("x must be an int"), "invalid_message", None),
    (DesktopStartError("no window"), "internal", "desktop"),
    (sbx.CommandTimeoutError("slow"), "action_timeout", None),
    (sbx.SandboxLostError("dead"), "sandbox_lost", None),
    (sbx.SandboxClosedError("closed"), "sandbox_lost", None),
    (sbx.SandboxPathError("../.."), "invalid_message", None),
    (sbx.SandboxFileNotFoundError("/x"), "invalid_message", None),
    (sbx.SandboxCreateError("no image"), "internal", "sandbox_create"),
    (PoolKeyFailingError("failing", "k", None), "internal", "sandbox_create"),
    (sbx.BackendUnavailableError("no docker"), "internal", None),
    (TimeoutError("slow"), "action_timeout", None),
    (RuntimeError("boom"), "internal", None),
]

SANDBOX_CASES: list[tuple[BaseException, str, str | None]] = [
    (
        _validation_error(lambda: ExecRequest.model_validate({"command": "ls", "tty": True})),
        "invalid_request",
        None,
    ),
    (sa.UnknownSandboxError("sb-1"), "unknown_sandbox", None),
    (sa.SandboxCapacityError("full"), "capacity", None),
    (PoolTimeoutError("waited"), "capacity", None),
    (PoolClosedError("closed"), "internal", "pool_closed"),
    (sa.EnvironmentInvalidError("no Dockerfile"), "environment_invalid", None),
    (terr.TaskError("bad task.toml"), "environment_invalid", None),
    (sbx.SandboxGroupUnsupportedError("services"), "environment_invalid", None),
    (sbx.UserUnsupportedError("user"), "environment_invalid", None),
    (sbx.NetworkPolicyUnsupportedError("allowlist"), "network_unsupported", None),
    (sbx.SandboxCreateError("build failed"), "build_failed", None),
    (sbx.CommandTimeoutError("slow"), "exec_timeout", None),
    (sbx.SandboxLostError("dead"), "sandbox_lost", None),
    (sbx.SandboxClosedError("closed"), "sandbox_lost", None),
    (sbx.SandboxFileNotFoundError("/x"), "file_not_found", None),
    (sbx.SandboxPathError("../.."), "invalid_request", None),
    (RuntimeError("boom"), "internal", None),
]


@pytest.mark.parametrize(
    ("api", "mapping", "cases"),
    [
        ("episode", e.to_wire_error, WIRE_CASES),
        ("sandbox", sa.to_sandbox_error, SANDBOX_CASES),
    ],
    ids=["to_wire_error", "to_sandbox_error"],
)
def test_the_servers_mappings_agree_with_the_table(api, mapping, cases) -> None:
    assert len(cases) >= 15
    wrong = []
    for exc, code, condition in cases:
        err = mapping(exc)
        expected = (code, codes.retryable_for(api, code, condition))
        if (err.code, err.retryable) != expected:
            wrong.append((type(exc).__name__, (err.code, err.retryable), expected))
    assert wrong == [], f"(exception, mapped, the table's answer): {wrong}"


def _isinstance_classes(fn) -> set[str]:
    """The class names every `isinstance(exc, ...)` in `fn` tests (`a.B` -> `B`; a module's
    or a variable's lower-case name is not a class)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            for sub in ast.walk(node.args[1]):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
                elif isinstance(sub, ast.Attribute):
                    names.add(sub.attr)
    return {n for n in names if n[:1].isupper()}


@pytest.mark.parametrize(
    ("mapping", "cases", "helpers"),
    [
        (e.to_wire_error, WIRE_CASES, [e._task_error_code]),
        (sa.to_sandbox_error, SANDBOX_CASES, []),
    ],
    ids=["to_wire_error", "to_sandbox_error"],
)
def test_every_class_a_mapping_names_is_among_the_cases(mapping, cases, helpers) -> None:
    named = set().union(*(_isinstance_classes(f) for f in [mapping, *helpers]))
    assert len(named) >= 10, named
    covered = {cls.__name__ for exc, _, _ in cases for cls in type(exc).__mro__}
    assert sorted(named - covered) == [], "a mapped class with no case in this test"


@pytest.mark.parametrize("fn", [e.to_wire_error, e._wire, sa.to_sandbox_error, sa._api_error])
def test_no_mapping_spells_a_retryable_flag_of_its_own(fn) -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    # a bool passed as another keyword (`exc.errors(include_url=False)`) is not a flag
    other_keywords = {
        id(k.value) for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg != "retryable"
    }
    flags = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, bool) and id(n) not in other_keywords
    ]
    assert flags == [], f"{fn.__name__} spells True/False (lines {flags}): read the table"


# -- the runners read the table ---------------------------------------------------------------------
def test_runners_classify_every_code_as_the_table_says() -> None:
    assert len(ERROR_CODES) == 9
    scored_0 = [c for c in ERROR_CODES if classify(EnvError(c, "x")) == "agent_failure"]
    assert scored_0 == sorted(codes.AGENT_CAUSABLE_CODES, key=ERROR_CODES.index)
    # the trainer: an agent-causable code is scored (neither masked nor dropping its group);
    # every other code is left unscored
    trainer_scored = [
        c
        for c in ERROR_CODES
        if not is_masked(r := classify_failure(EnvError(c, "x"))) and not drops_group(r)
    ]
    assert trainer_scored == scored_0
    # a lost connection is masked whatever code the client gave it
    lost = [ConnectionLostError(c, "connection lost", True) for c in ERROR_CODES]
    assert [classify(x) for x in lost] == ["masked"] * len(ERROR_CODES)
    assert [is_masked(classify_failure(x)) for x in lost] == [True] * len(ERROR_CODES)


def _code_sets(path: Path) -> list[int]:
    """Lines of `path` where a set, frozenset, list or tuple literal (not a type's subscript)
    holds both "action_timeout" and "verifier_error": a list of agent-causable codes."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_subscript = {
        id(sub) for n in ast.walk(tree) if isinstance(n, ast.Subscript) for sub in ast.walk(n)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.List | ast.Tuple) and id(node) not in in_subscript:
            values = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if {"action_timeout", "verifier_error"} <= values:
                found.append(node.lineno)
    return found


def test_no_module_outside_the_wire_lists_the_agent_causable_codes() -> None:
    sources = [p for p in sorted((REPO / "sandgym").rglob("*.py")) if "wire" not in p.parts]
    assert len(sources) > 100
    assert _code_sets(REPO / "sandgym" / "wire" / "codes.py") == [], "the table builds its set"
    listed = {str(p.relative_to(REPO)): lines for p in sources if (lines := _code_sets(p))}
    assert listed == {}, "spells the agent-causable codes: import sandgym.wire.codes instead"


def test_the_check_sees_a_spelled_set(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('CODES = frozenset({"action_timeout", "verifier_error"})\n')
    assert _code_sets(bad) == [1]
    typed = tmp_path / "typed.py"
    typed.write_text(
        'from typing import Literal\nR = Literal["action_timeout", "verifier_error"]\n'
    )
    assert _code_sets(typed) == []


@pytest.mark.parametrize(
    "module",
    [
        "sandgym/trainer/failures.py",
        "sandgym/integrations/episode.py",
        "sandgym/client/episode_loop.py",
        "sandgym/server/errors.py",
        "sandgym/server/sandbox_api.py",
    ],
)
def test_the_consumers_import_the_table(module: str) -> None:
    tree = ast.parse((REPO / module).read_text(encoding="utf-8"))
    froms = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert "sandgym.wire.codes" in froms, f"{module} imports {froms}"
