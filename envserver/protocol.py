"""The websocket wire protocol (version 1.1): every message the client and the server exchange.

Client and server share only this module. It imports nothing else of sandgym, so the client side
(`envserver.client`, `envserver.gym_env`, the trainer) never loads server code.

Client messages are a discriminated union on `type` (`reset`, `step`, `close`, `resume`); actions
are a discriminated union on `kind`. Unknown fields are rejected everywhere (`extra="forbid"`).

Server replies: `observation` (to reset and resume), `step_result` (to step), `closed` (to close)
and `error` (to anything that failed). An `error` carries one of `ERROR_CODES`; the connection
stays usable after every code but `unauthorized`.

Two conditions that are not in the fixed code list map onto `invalid_message` (with a message
saying which): a second request while one is in flight on the same session (`retryable: true`;
the server answers it at once rather than queueing it) and a message above the size limit.

Example:
    >>> msg = parse_client_message('{"type":"step","request_id":"2","action":{"kind":"submit"}}')
    >>> type(msg).__name__, msg.action.kind
    ('StepMsg', 'submit')
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1

#: Every error code the server may send, in the order of the contract.
ERROR_CODES: tuple[str, ...] = (
    "invalid_message",
    "unknown_task",
    "no_episode",
    "capacity",
    "sandbox_lost",
    "action_timeout",
    "verifier_error",
    "unauthorized",
    "internal",
)
ErrorCode = Literal[
    "invalid_message",
    "unknown_task",
    "no_episode",
    "capacity",
    "sandbox_lost",
    "action_timeout",
    "verifier_error",
    "unauthorized",
    "internal",
]

#: Websocket close code sent when the bearer token is missing or wrong.
CLOSE_UNAUTHORIZED = 4401


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- actions ------------------------------------------------------------------------------------
class CommandAction(_Wire):
    """Run a command line in the episode's persistent shell (state kept between steps)."""

    kind: Literal["command"] = "command"
    command: str
    timeout_s: float | None = Field(
        None, gt=0, description="seconds before the command is killed; None = server default"
    )


class KeysAction(_Wire):
    """Send raw keys to the terminal's foreground program; the observation is the screen."""

    kind: Literal["keys"] = "keys"
    keys: str


class WriteFileAction(_Wire):
    """Write `content` (text) to `path` inside the sandbox (parents created)."""

    kind: Literal["write_file"] = "write_file"
    path: str
    content: str
    mode: int = Field(0o644, ge=0, le=0o7777, description="file mode bits")


class ReadFileAction(_Wire):
    """Read the file at `path`; its text is the observation's output."""

    kind: Literal["read_file"] = "read_file"
    path: str
    max_bytes: int | None = Field(None, gt=0, description="read at most this many bytes")


class SubmitAction(_Wire):
    """End the episode: the task's verifier runs and its reward is returned."""

    kind: Literal["submit"] = "submit"


class ClickAction(_Wire):
    """Desktop: click at pixel (x, y)."""

    kind: Literal["click"] = "click"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class DoubleClickAction(_Wire):
    """Desktop: double-click at pixel (x, y)."""

    kind: Literal["double_click"] = "double_click"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class MoveAction(_Wire):
    """Desktop: move the pointer to pixel (x, y)."""

    kind: Literal["move"] = "move"
    x: int = Field(ge=0)
    y: int = Field(ge=0)


class DragAction(_Wire):
    """Desktop: press at (x, y), move to (to_x, to_y), release."""

    kind: Literal["drag"] = "drag"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    to_x: int = Field(ge=0)
    to_y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class ScrollAction(_Wire):
    """Desktop: scroll by (dx, dy) notches, optionally after moving to (x, y)."""

    kind: Literal["scroll"] = "scroll"
    dx: int = 0
    dy: int = 0
    x: int | None = Field(None, ge=0)
    y: int | None = Field(None, ge=0)


class TypeAction(_Wire):
    """Desktop: type `text` as keystrokes into the focused window."""

    kind: Literal["type"] = "type"
    text: str


class KeyAction(_Wire):
    """Desktop: press a key chord in X keysym names, e.g. `ctrl+s`, `Return`."""

    kind: Literal["key"] = "key"
    key: str = Field(min_length=1)


class ScreenshotAction(_Wire):
    """Desktop: return a screenshot (base64 PNG in the observation's `image`)."""

    kind: Literal["screenshot"] = "screenshot"
    scale: float | None = Field(None, gt=0, le=1, description="shrink the image by this factor")


Action = Annotated[
    CommandAction
    | KeysAction
    | WriteFileAction
    | ReadFileAction
    | SubmitAction
    | ClickAction
    | DoubleClickAction
    | MoveAction
    | DragAction
    | ScrollAction
    | TypeAction
    | KeyAction
    | ScreenshotAction,
    Field(discriminator="kind"),
]
ACTION_KINDS: tuple[str, ...] = (
    "command",
    "keys",
    "write_file",
    "read_file",
    "submit",
    "click",
    "double_click",
    "move",
    "drag",
    "scroll",
    "type",
    "key",
    "screenshot",
)
DESKTOP_ACTION_KINDS = frozenset(
    {"click", "double_click", "move", "drag", "scroll", "type", "key", "screenshot"}
)


# -- client -> server ---------------------------------------------------------------------------
class GroupOptions(_Wire):
    """`reset.options.group` (protocol 1.1): this episode is one of `size` that start from one
    prepared state (GRPO/RLOO groups). The first reset of a group id prepares the sandbox
    (environment, task set-up, the seed's instance); the others start from a copy of it and
    then diverge on their own. Every member names the same task, seed and size; a failed
    preparation fails every member with the same error. `info.group` reports `id`, `size`,
    `member` (0 = the one prepared) and `forked`."""

    id: str = Field(min_length=1, max_length=128, description="the group's id, unique per group")
    size: int = Field(ge=1, le=1024, description="how many episodes the group holds")


class ResetOptions(_Wire):
    """`reset.options`: typed (protocol 1.1); unknown keys are refused."""

    group: GroupOptions | None = Field(None, description="start from a group's prepared state")
    gateway_url: str | None = Field(
        None,
        description="http://127.0.0.1:PORT of a model gateway, bridged into the sandbox as the "
        "unix socket /run/sandgym/gateway.sock (local, docker)",
    )


class ResetMsg(_Wire):
    """Start a new episode of `task_id` on this connection (ending any previous one)."""

    type: Literal["reset"] = "reset"
    request_id: str
    task_id: str
    seed: int | None = None
    options: ResetOptions = Field(default_factory=ResetOptions)


class StepMsg(_Wire):
    """Apply one action to the current episode."""

    type: Literal["step"] = "step"
    request_id: str
    action: Action


class CloseMsg(_Wire):
    """End the current episode (no reward) and release its sandbox."""

    type: Literal["close"] = "close"
    request_id: str


class ResumeMsg(_Wire):
    """Re-attach to an episode whose connection dropped, within the server's grace period."""

    type: Literal["resume"] = "resume"
    request_id: str
    session_id: str
    resume_token: str


ClientMsg = Annotated[ResetMsg | StepMsg | CloseMsg | ResumeMsg, Field(discriminator="type")]
# mypy types TypeAdapter's argument as `type[T]`; an Annotated union is valid at run time.
_CLIENT_MSG: TypeAdapter[ResetMsg | StepMsg | CloseMsg | ResumeMsg] = TypeAdapter(ClientMsg)  # type: ignore[arg-type]
_ACTION: TypeAdapter[Any] = TypeAdapter(Action)  # type: ignore[arg-type]


def parse_client_message(data: str | bytes) -> ResetMsg | StepMsg | CloseMsg | ResumeMsg:
    """Validate one JSON text frame; raises `pydantic.ValidationError` when it is not valid."""
    return _CLIENT_MSG.validate_json(data)


def parse_action(data: dict[str, Any] | str) -> Any:
    """Validate an ACTION dict; a plain string is shorthand for a `command` action."""
    if isinstance(data, str):
        return CommandAction(command=data)
    return _ACTION.validate_python(data)


# -- server -> client ---------------------------------------------------------------------------
class Observation(_Wire):
    """What the agent sees after an action."""

    output: str = Field("", description="text the action produced (command: stdout+stderr)")
    exit_code: int | None = Field(None, description="exit status of a command, else None")
    screen: str = Field("", description="the rendered terminal screen")
    image: str | None = Field(None, description="desktop tasks: base64 PNG screenshot")


class ObservationReply(_Wire):
    """Reply to `reset` and `resume`: the episode's first (or latest) observation."""

    type: Literal["observation"] = "observation"
    request_id: str
    session_id: str
    resume_token: str
    observation: Observation
    info: dict[str, Any] = Field(default_factory=dict)


class TaskStepInfo(BaseModel):
    """`info.step` of a `submit` reply in a multi-step task (protocol 1.1): the step just
    scored. While steps remain the reply has `terminated: false`, `reward` 0.0 and the next
    step's instruction as its observation's `output` (`next` names that step); the last step,
    or a failed `min_reward` gate (`stopped` says which key), ends the episode with the task's
    aggregate as `reward` (`aggregate`: `mean` of the steps' rewards, or the `final` one's).
    The reply's action count is then `info.actions`."""

    model_config = ConfigDict(extra="allow")

    name: str
    index: int = Field(description="0-based")
    count: int
    reward: float = Field(description="this step's reward")
    rewards: list[float] = Field(description="every step's reward so far, this one included")
    next: dict[str, Any] | None = None
    stopped: str | None = None
    aggregate: Literal["mean", "final"] | None = None


class StepResultReply(_Wire):
    """Reply to `step`."""

    type: Literal["step_result"] = "step_result"
    request_id: str
    observation: Observation
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class ClosedReply(_Wire):
    """Reply to `close`: the episode (if any) has ended and its sandbox is released."""

    type: Literal["closed"] = "closed"
    request_id: str
    session_id: str | None = None


class ErrorReply(_Wire):
    """Reply to any request that failed. `request_id` is None when the request had none."""

    type: Literal["error"] = "error"
    request_id: str | None
    code: ErrorCode
    message: str
    retryable: bool = False


ServerReply = Annotated[
    ObservationReply | StepResultReply | ClosedReply | ErrorReply, Field(discriminator="type")
]
_SERVER_REPLY: TypeAdapter[ObservationReply | StepResultReply | ClosedReply | ErrorReply] = (
    TypeAdapter(ServerReply)  # type: ignore[arg-type]
)


def parse_server_reply(
    data: str | bytes,
) -> ObservationReply | StepResultReply | ClosedReply | ErrorReply:
    """Validate one server frame (used by the clients)."""
    return _SERVER_REPLY.validate_json(data)
