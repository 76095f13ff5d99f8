"""`sandgym/wire/protocol.py` as the only contract: the code and kind lists are read off the models,
the `info` and prewarm models hold the shapes the server sends, and the client's errors carry
an `ErrorCode`."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from sandgym.client.env_client import ConnectionLostError, EnvError, StepResult, http_base
from sandgym.wire import protocol as p


def test_code_and_kind_lists_are_read_off_the_models() -> None:
    assert p.ERROR_CODES == get_args(p.ErrorCode)
    union = get_args(get_args(p.Action)[0])
    assert p.ACTION_KINDS == tuple(cls.model_fields["kind"].default for cls in union)
    assert p.DESKTOP_ACTION_KINDS == {
        "click", "double_click", "move", "drag", "scroll", "type", "key", "screenshot"
    }  # fmt: skip
    assert set(p.REPLY_TYPES) == {"observation", "step_result", "closed", "error"}


def test_copies_elsewhere_follow_the_protocol() -> None:
    from lab.bench import reliability
    from sandgym.client.desktop_env import POINTER_KINDS
    from sandgym.client.gym_env import VOLATILE_INFO_KEYS

    assert reliability.ACTION_KINDS[:-1] == p.ACTION_KINDS  # and one kind the protocol lacks
    assert reliability.ACTION_KINDS[-1] not in p.ACTION_KINDS
    assert set(POINTER_KINDS) <= p.DESKTOP_ACTION_KINDS
    assert VOLATILE_INFO_KEYS == p.VOLATILE_INFO_KEYS
    assert {"acquire_s", "action_s", "sandbox_id", "from_pool"} <= p.VOLATILE_INFO_KEYS
    assert not {"task_id", "seed", "step", "truncation"} & p.VOLATILE_INFO_KEYS


def test_info_models_send_only_the_keys_set_and_read_later_keys() -> None:
    info = p.ResetInfo(task_id="t", seed=None, from_pool=True, group=p.GroupInfo(
        id="g", size=2, member=1, forked=True)).wire()  # fmt: skip
    assert info == {
        "task_id": "t",
        "seed": None,  # set to None: sent as null, as before
        "from_pool": True,
        "group": {"id": "g", "size": 2, "member": 1, "forked": True},
    }
    # a key a later server adds is kept, not refused (older clients keep working)
    later = p.StepInfo.model_validate({"step": 3, "action_s": 0.1, "gpu_s": 2.0})
    assert later.step == 3 and later.model_extra == {"gpu_s": 2.0}
    multi = p.StepInfo.model_validate(
        {"step": {"name": "a", "index": 0, "count": 2, "reward": 1.0, "rewards": [1.0]}}
    )
    assert isinstance(multi.step, p.TaskStepInfo) and multi.step.rewards == [1.0]
    with pytest.raises(ValidationError):
        p.StepInfo.model_validate({"truncation": "bored"})
    result = StepResult({"output": ""}, 0.0, False, True, {"step": 9, "truncation": "max_steps"})
    assert result.typed_info.truncation == "max_steps" and result.typed_info.step == 9


def test_prewarm_models_refuse_unknown_fields() -> None:
    assert p.PrewarmRequest(task_ids=["a"]).count == 1
    with pytest.raises(ValidationError):
        p.PrewarmRequest.model_validate({"task_ids": ["a"], "count": 1, "priority": 9})
    with pytest.raises(ValidationError):
        p.PrewarmRequest(task_ids=[])
    with pytest.raises(ValidationError):
        p.HttpErrorBody(code="busy", message="x")  # type: ignore[arg-type]


def test_env_errors_carry_a_protocol_code() -> None:
    err = EnvError("capacity", "full", retryable=True)
    assert (err.code, err.message, err.retryable, str(err)) == (
        "capacity", "full", True, "capacity: full"
    )  # fmt: skip
    with pytest.raises(ValueError, match="expected an error code in"):
        EnvError("connection", "x")  # type: ignore[arg-type]
    lost = ConnectionLostError("sandbox_lost", "connection to ws://x lost", retryable=True)
    assert isinstance(lost, EnvError) and lost.code == "sandbox_lost"


def test_http_base() -> None:
    assert http_base("ws://h:1/v1/env") == "http://h:1"
    assert http_base("wss://h/v1/env") == "https://h"


def test_the_sandbox_side_keeps_no_desktop_kinds_of_its_own() -> None:
    """The desktop dispatch lives in `sandgym.server.actions` and reads the protocol's list; the
    `sandgym.sandboxes.desktop` primitive keeps no copy of it."""
    import sandgym.sandboxes.desktop as desktop
    from sandgym.server import actions

    assert not hasattr(desktop, "DESKTOP_ACTION_KINDS")
    assert actions.DESKTOP_ACTION_KINDS is p.DESKTOP_ACTION_KINDS
