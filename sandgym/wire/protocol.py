"""The websocket wire protocol (version 1.1): every message the client and the server exchange.

Protocol version 1.2 adds the sandbox API (HTTP, `/v1/sandboxes`): its models live in
`sandgym.wire.sandbox_protocol` (import them from there; this module does not re-export them).

Client and server share only this module. It imports nothing else of sandgym, so the client side
(`sandgym.client.env_client`, `sandgym.client.gym_env`, the trainer) never loads server code.

Client messages are a discriminated union on `type` (`reset`, `step`, `close`, `resume`); actions
are a discriminated union on `kind`. Unknown fields are rejected everywhere (`extra="forbid"`).

Server replies: `observation` (to reset and resume), `step_result` (to step), `closed` (to close)
and `error` (to anything that failed). An `error` carries one of `ERROR_CODES`; the connection
stays usable after every code but `unauthorized`.

This module is the whole contract: the `info` objects of replies (`ResetInfo`, `StepInfo`,
`ResumeInfo`: typed, open to keys added later, so older clients keep working), the HTTP body of
`POST /v1/pool/prewarm` (`PrewarmRequest`, `PrewarmReply`, `HttpErrorBody`), and the lists of
codes and kinds (`ERROR_CODES`, `ACTION_KINDS`, `DESKTOP_ACTION_KINDS`, `REPLY_TYPES`), which are
read off the models rather than written out a second time.

Two conditions that are not in the fixed code list map onto `invalid_message` (with a message
saying which): a second request while one is in flight on the same session (`retryable: true`;
the server answers it at once rather than queueing it) and a message above the size limit.

Example:
    >>> msg = parse_client_message('{"type":"step","request_id":"2","action":{"kind":"submit"}}')
    >>> type(msg).__name__, msg.action.kind
    ('StepMsg', 'submit')
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1

#: Every error code the server may send, in the order of the contract.
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
ERROR_CODES: tuple[ErrorCode, ...] = get_args(ErrorCode)

#: Websocket close code sent when the bearer token is missing or wrong.
CLOSE_UNAUTHORIZED = 4401


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _DesktopAction(_Wire):
    """Base of the actions only a desktop task's sandbox performs (`DESKTOP_ACTION_KINDS`)."""


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


class ClickAction(_DesktopAction):
    """Desktop: click at pixel (x, y)."""

    kind: Literal["click"] = "click"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class DoubleClickAction(_DesktopAction):
    """Desktop: double-click at pixel (x, y)."""

    kind: Literal["double_click"] = "double_click"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class MoveAction(_DesktopAction):
    """Desktop: move the pointer to pixel (x, y)."""

    kind: Literal["move"] = "move"
    x: int = Field(ge=0)
    y: int = Field(ge=0)


class DragAction(_DesktopAction):
    """Desktop: press at (x, y), move to (to_x, to_y), release."""

    kind: Literal["drag"] = "drag"
    x: int = Field(ge=0)
    y: int = Field(ge=0)
    to_x: int = Field(ge=0)
    to_y: int = Field(ge=0)
    button: Literal["left", "middle", "right"] = "left"


class ScrollAction(_DesktopAction):
    """Desktop: scroll by (dx, dy) notches, optionally after moving to (x, y)."""

    kind: Literal["scroll"] = "scroll"
    dx: int = 0
    dy: int = 0
    x: int | None = Field(None, ge=0)
    y: int | None = Field(None, ge=0)


class TypeAction(_DesktopAction):
    """Desktop: type `text` as keystrokes into the focused window."""

    kind: Literal["type"] = "type"
    text: str


class KeyAction(_DesktopAction):
    """Desktop: press a key chord in X keysym names, e.g. `ctrl+s`, `Return`."""

    kind: Literal["key"] = "key"
    key: str = Field(min_length=1)


class ScreenshotAction(_DesktopAction):
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
_ACTION_TYPES: tuple[type[_Wire], ...] = get_args(get_args(Action)[0])


def _kind_of(model: type[BaseModel]) -> str:
    (kind,) = get_args(model.model_fields["kind"].annotation)
    return str(kind)


#: Every action kind, in the order of the contract (read off the `Action` union).
ACTION_KINDS: tuple[str, ...] = tuple(_kind_of(t) for t in _ACTION_TYPES)
#: The kinds only a desktop sandbox performs (the `_DesktopAction` subclasses).
DESKTOP_ACTION_KINDS = frozenset(
    _kind_of(t) for t in _ACTION_TYPES if issubclass(t, _DesktopAction)
)


# -- client -> server ---------------------------------------------------------------------------
#: how an episode is verified (docs/verification.md)
VerifyMode = Literal["shared", "pristine", "refuse-tampered"]


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
    verify: VerifyMode | None = Field(
        None,
        description="how this episode is verified (docs/verification.md); None: the server's "
        "setting, else the task's, else `shared`",
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


class TamperedPathInfo(BaseModel):
    """One path of `info.tamper.paths`: changed by the agent, runnable or importable by the
    verifier before it writes its reward."""

    path: str
    change: Literal["created", "modified", "deleted"]
    category: str = Field(description="verifier_mounts, executables, loader, python_startup, ...")


class TamperTraceInfo(BaseModel):
    """`info.tamper.trace`: how the report followed what the verifier ran or read."""

    model_config = ConfigDict(extra="allow")

    method: str = Field(description="inotify (the verifier's run traced) or paths (not traced)")
    watched: int = 0
    opened: int = 0
    unwatched: int = 0
    overflow: bool = False
    search_path: list[str] = Field(default_factory=list)
    note: str | None = None


class TamperInfo(BaseModel):
    """`info.tamper` of a scored `submit`: the episode's tamper report (docs/verification.md)."""

    model_config = ConfigDict(extra="allow")

    checked: bool = Field(description="the backend listed the changed paths (else see `reason`)")
    tampered: bool = False
    paths: list[TamperedPathInfo] = Field(default_factory=list, description="the first 100")
    count: int = Field(0, description="tampered paths in all")
    changed: int = Field(0, description="paths the agent changed in all")
    expected: int = Field(0, description="sensitive paths the task declares expected")
    reason: str | None = None
    trace: TamperTraceInfo | None = Field(None, description="absent from older servers")


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


class _Info(BaseModel):
    """Base of the `info` objects. Unlike messages, an info accepts keys it does not name: the
    server may report more in a later version and an older client must still read the reply.
    Fields marked `volatile` differ between otherwise identical episodes (timings, identities);
    `VOLATILE_INFO_KEYS` lists them."""

    model_config = ConfigDict(extra="allow")

    def wire(self) -> dict[str, Any]:
        """The JSON object sent as a reply's `info`: the keys that were set, no others."""
        return self.model_dump(exclude_unset=True)


def _volatile(description: str) -> Any:
    return Field(None, description=description, json_schema_extra={"volatile": True})


class GroupInfo(BaseModel):
    """`info.group` of a group member's reset (protocol 1.1)."""

    model_config = ConfigDict(extra="allow")

    id: str
    size: int
    member: int = Field(description="0 = the member whose sandbox was prepared")
    forked: bool = Field(description="this member started from a copy of the prepared state")


class ResetInfo(_Info):
    """`info` of the reply to `reset`."""

    task_id: str | None = None
    seed: int | None = None
    acquire_s: float | None = _volatile("seconds spent getting a sandbox (pool or fresh)")
    prepare_s: float | None = _volatile("seconds spent preparing the task in it")
    from_pool: bool | None = _volatile("the sandbox came ready from the warm pool")
    desktop: bool | None = Field(None, description="a desktop task: observations carry `image`")
    sandbox_id: str | None = _volatile("the backend's id of the episode's sandbox")
    backend: str | None = None
    max_steps: int | None = Field(None, description="the server's step limit per episode")
    time_limit_s: float | None = Field(None, description="the server's time limit per episode")
    gateway_socket: str | None = Field(
        None, description="where a `reset.options.gateway_url` gateway is reachable in the sandbox"
    )
    network: dict[str, Any] | None = Field(
        None, description="the network policy in force (after any server clamp), per phase"
    )
    group: GroupInfo | None = None
    verify: VerifyMode | None = Field(None, description="how the episode will be verified")


class CompanionCost(BaseModel):
    """A container that ran beside an episode's sandbox (a compose service, a private verifier
    run): its seconds and what its cgroup says it consumed."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="`service` or `verifier`")
    name: str
    seconds: float | None = None
    cpu_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_unavailable: str | None = Field(
        None, description="why peak_memory_bytes is None (sandgym.sandboxes.usage)"
    )


class EpisodeCost(BaseModel):
    """`info.cost` of the reply that ends an episode: what it cost in sandbox time, by phase,
    and what its sandbox consumed by its own accounting (None: the backend cannot say)."""

    model_config = ConfigDict(extra="allow")

    backend: str | None = None
    pool_s: float = Field(0.0, description="sandbox seconds before the lease: made, then ready")
    prepare_s: float = Field(0.0, description="sandbox seconds setting the episode up")
    agent_s: float = Field(0.0, description="sandbox seconds of the agent's turns")
    verifier_s: float = Field(0.0, description="sandbox seconds of verifier runs (submits)")
    sandbox_s: float = Field(0.0, description="the four phases together")
    cpu_s: float | None = Field(None, description="CPU seconds of the sandbox's cgroup")
    peak_memory_bytes: int | None = Field(None, description="the sandbox cgroup's peak memory")
    bytes_written: int | None = Field(None, description="bytes its writes keep on disk")
    commands: int = Field(0, description="command actions run")
    peak_memory_unavailable: str | None = Field(
        None,
        description="why peak_memory_bytes is None: cgroup_not_visible, no_memory_peak, "
        "not_read, unsupported (sandgym.sandboxes.usage)",
    )
    companions: list[CompanionCost] = Field(
        default_factory=list,
        description="the containers beside the sandbox: its compose services, its private "
        "verifier runs",
    )


class StepInfo(_Info):
    """`info` of a `step_result`."""

    step: int | TaskStepInfo | None = Field(
        None,
        description="actions taken so far; for the `submit` of a multi-step task the step just "
        "scored (`TaskStepInfo`), the action count then being `actions`",
    )
    actions: int | None = None
    action_s: float | None = _volatile("seconds the action took on the server")
    elapsed_s: float | None = _volatile("seconds since the episode started")
    verifier_s: float | None = _volatile("seconds the submit took (verifier included)")
    verifier_duration_s: float | None = _volatile("seconds the verifier itself ran")
    verifier_output: str | None = Field(None, description="the tail of the verifier's output")
    verifier_reason: Literal["test_timeout", "parse_error"] | None = Field(
        None,
        description="a scored submit whose reward is not the tests' own verdict: `test_timeout` "
        "(a Terminal-Bench 1 task's tests ran past max_test_timeout_sec: unresolved, 0) or "
        "`parse_error` (its tests reported no result: unresolved, 0)",
    )
    from_pool: bool | None = _volatile("the sandbox came ready from the warm pool")
    truncation: Literal["max_steps", "time_limit"] | None = Field(
        None, description="why the episode was truncated (with `truncated: true`)"
    )
    tamper: TamperInfo | None = Field(None, description="a scored submit: its tamper report")
    verify: VerifyMode | None = Field(None, description="a scored submit: how it was verified")
    timed_out: bool | None = Field(None, description="the command ran past its timeout")
    output_truncated: bool | None = Field(None, description="the output was cut to the cap")
    cost: EpisodeCost | None = _volatile("the reply that ends the episode: what it cost")


class ResumeInfo(_Info):
    """`info` of the reply to `resume`."""

    resumed: bool = True
    ended: bool | None = Field(None, description="the episode ended while the client was away")
    task_id: str | None = None
    step: int | None = None
    last_request_id: str | None = Field(
        None,
        description="the last request the server handled (a resend of it is answered "
        "from its cache)",
    )
    elapsed_s: float | None = _volatile("seconds since the episode started")


#: `info` keys whose values differ between otherwise identical episodes (read off the models).
VOLATILE_INFO_KEYS = frozenset(
    name
    for model in (ResetInfo, StepInfo, ResumeInfo)
    for name, f in model.model_fields.items()
    if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("volatile")
)


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


#: Every reply `type` (read off the `ServerReply` union).
REPLY_TYPES: tuple[str, ...] = tuple(
    str(get_args(t.model_fields["type"].annotation)[0]) for t in get_args(get_args(ServerReply)[0])
)


def parse_server_reply(
    data: str | bytes,
) -> ObservationReply | StepResultReply | ClosedReply | ErrorReply:
    """Validate one server frame (used by the clients)."""
    return _SERVER_REPLY.validate_json(data)


# -- HTTP ops endpoints -------------------------------------------------------------------------
class SessionEntry(BaseModel):
    """One live episode in `GET /v1/sessions`."""

    session_id: str
    task_id: str
    seed: int | None
    steps: int
    age_s: float
    idle_s: float
    attached: bool  # a connection holds it now
    busy: bool  # a request of it is being answered
    sandbox_id: str
    from_pool: bool  # its sandbox came ready from the warm pool


class SessionsReply(BaseModel):
    """`GET /v1/sessions`: the live episodes and the capacity they hold."""

    count: int
    resetting: int  # resets holding a slot before their session exists (capacity counts them)
    max_sessions: int
    sessions: list[SessionEntry]


class PrewarmRequest(_Wire):
    """Body of `POST /v1/pool/prewarm`: keep `count` sandboxes ready for each task's
    environment (a trainer asks this for the tasks of its next groups)."""

    task_ids: list[str] = Field(min_length=1, description="tasks whose sandboxes to keep ready")
    count: int = Field(1, ge=0, description="ready sandboxes per task environment")


class PrewarmReply(_Wire):
    """Answer of `POST /v1/pool/prewarm` (HTTP 200)."""

    scheduled: int = Field(description="how many task environments the pool now prepares")
    count: int


class HttpErrorBody(_Wire):
    """Body of an HTTP ops endpoint's failure (4xx/5xx): the same code as a websocket error."""

    code: ErrorCode
    message: str
    retryable: bool = False
