"""The wire models: the contract's examples parse, unknown fields and kinds are refused, and
every reply round-trips."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sandgym.wire import protocol as p


@pytest.mark.parametrize(
    ("frame", "cls"),
    [
        (
            {
                "type": "reset",
                "request_id": "1",
                "task_id": "builtin/hello-file",
                "seed": 0,
                "options": {},
            },
            p.ResetMsg,
        ),  # fmt: skip
        (
            {
                "type": "step",
                "request_id": "2",
                "action": {"kind": "command", "command": "ls -la", "timeout_s": 30},
            },
            p.StepMsg,
        ),  # fmt: skip
        ({"type": "close", "request_id": "3"}, p.CloseMsg),
        (
            {"type": "resume", "request_id": "4", "session_id": "s", "resume_token": "t"},
            p.ResumeMsg,
        ),
    ],
)
def test_contract_examples_parse(frame, cls):
    msg = p.parse_client_message(json.dumps(frame))
    assert isinstance(msg, cls) and msg.request_id == frame["request_id"]


@pytest.mark.parametrize(
    "action",
    [
        {"kind": "command", "command": "ls -la", "timeout_s": 30},
        {"kind": "keys", "keys": "q"},
        {"kind": "write_file", "path": "/app/x", "content": "hi"},
        {"kind": "read_file", "path": "/app/x"},
        {"kind": "submit"},
        {"kind": "click", "x": 1, "y": 2},
        {"kind": "double_click", "x": 1, "y": 2, "button": "right"},
        {"kind": "move", "x": 1, "y": 2},
        {"kind": "drag", "x": 1, "y": 2, "to_x": 3, "to_y": 4},
        {"kind": "scroll", "dy": -3},
        {"kind": "type", "text": "hello"},
        {"kind": "key", "key": "ctrl+s"},
        {"kind": "screenshot"},
    ],
)
def test_every_action_kind_parses(action):
    parsed = p.parse_action(action)
    assert parsed.kind == action["kind"]
    assert parsed.model_dump(exclude_unset=True) == action | {}


def test_action_kinds_table_matches_union():
    assert p.ACTION_KINDS, "no action kind to check"
    for kind in p.ACTION_KINDS:
        with pytest.raises(ValidationError) as exc:  # missing fields, but the kind is known
            p.parse_action({"kind": kind, "nope": 1})
        assert "union_tag_invalid" not in str(exc.value)


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"reset","request_id":"1","task_id":"t","extra":1}',
        '{"type":"step","request_id":"1","action":{"kind":"command","command":"ls","x":1}}',
        '{"type":"step","request_id":"1","action":{"kind":"teleport"}}',
        '{"type":"step","request_id":"1"}',
        '{"type":"dance","request_id":"1"}',
        '{"type":"close"}',
        '{"type":"step","request_id":"1","action":{"kind":"command","command":"ls","timeout_s":0}}',
        '{"type":"step","request_id":"1","action":{"kind":"click","x":-1,"y":0}}',
        "not json",
        "[]",
    ],
)
def test_invalid_frames_are_refused(frame):
    with pytest.raises(ValidationError):
        p.parse_client_message(frame)


def test_string_action_is_a_command():
    assert p.parse_action("ls") == p.CommandAction(command="ls")


def test_replies_round_trip():
    obs = p.Observation(output="hi\n", exit_code=0, screen="$ ")
    replies = [
        p.ObservationReply(request_id="1", session_id="s", resume_token="t", observation=obs),
        p.StepResultReply(request_id="2", observation=obs, reward=1.0, terminated=True),
        p.ClosedReply(request_id="3", session_id="s"),
        p.ErrorReply(request_id=None, code="capacity", message="full", retryable=True),
    ]
    for reply in replies:
        assert p.parse_server_reply(reply.model_dump_json()) == reply
    step = json.loads(replies[1].model_dump_json())
    assert set(step["observation"]) == {"output", "exit_code", "screen", "image"}


def test_error_codes_are_exactly_the_contract():
    assert p.ERROR_CODES == (
        "invalid_message", "unknown_task", "no_episode", "capacity", "sandbox_lost",
        "action_timeout", "verifier_error", "unauthorized", "internal",
    )  # fmt: skip
    with pytest.raises(ValidationError):
        p.ErrorReply(request_id="1", code="busy", message="x")  # type: ignore[arg-type]
