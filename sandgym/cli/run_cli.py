"""`sandgym run --task ID`: play one episode through the websocket server and print its record.

Without `--server`, an in-process server on a free port serves the episode (on `--backend`).
Agents:
- `oracle`: writes the task's reference solution into the sandbox with `write_file` actions and
  runs it with one `command` action (keystroke solutions are replayed as `keys`/`command`
  actions), then submits. Reward 1.0 means the task and its verifier agree.
- `noop`: submits at once (a task whose no-op episode scores > 0 is broken).

The solution is read from the task directory on this machine (`--tasks` as for the server), so
with `--server` the same task directories must be available here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from sandgym.client.env_client import AsyncEnvClient, EnvError
from sandgym.client.episode_loop import RecordingSession, play_episode
from sandgym.server.settings import ServerSettings
from sandgym.tasks import TaskRegistry
from sandgym.tasks.sandbox_spec import parse_image_map

SOLUTION_DIR = "/solution"


def add_arguments(
    parser: argparse.ArgumentParser, agents: tuple[str, ...] = ("oracle", "noop")
) -> None:
    """The options of `sandgym run`; `agents`: the choices of --agent (the command line adds
    `llm`, whose agent lives in the trainer: sandgym/cli/run.py)."""
    parser.add_argument("--task", required=True, help="task id, e.g. builtin/hello-file")
    parser.add_argument("--agent", choices=list(agents), default="oracle")
    parser.add_argument(
        "--backend", choices=["local", "docker", "e2b", "null"], default=None,
        help="backend of the in-process server (default local)",
    )  # fmt: skip
    parser.add_argument(
        "--server",
        help="ws://HOST:PORT/v1/env of a running server, or a fleet: a comma-separated list "
        "of servers, or ray:ADDRESS (the episode goes to the one with the most room)",
    )
    parser.add_argument("--token", help="bearer token of --server")
    parser.add_argument("--tasks", action="append", type=Path, metavar="DIR", default=[])
    parser.add_argument("--image-map", action="append", metavar="FROM=TO", default=[])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the record as one JSON document")


def oracle_step_actions(task: Any) -> list[list[dict[str, Any]]]:
    """The oracle's actions for each step, in order (one list for a single-step task): each
    step's own solution, else the task's; the caller submits after each list."""
    if not task.steps:
        return [oracle_actions(task)]
    return [
        oracle_actions(
            task.model_copy(update={"solution": step.solution, "id": f"{task.id}:{step.name}"})
        )
        for step in task.steps
    ]


def oracle_actions(task: Any) -> list[dict[str, Any]]:
    """The actions that replay `task`'s reference solution (then the caller submits)."""
    sol = task.solution
    if sol is None:
        raise SystemExit(f"task {task.id} ships no oracle solution; use --agent noop")
    if sol.keystrokes is not None:
        out: list[dict[str, Any]] = []
        for k in sol.keystrokes:
            if k.block:
                out.append({"kind": "command", "command": k.keys, "timeout_s": k.max_timeout_s})
            else:
                out.append({"kind": "keys", "keys": k.keys + ("\r" if k.append_enter else "")})
        return out
    assert sol.script is not None
    root = sol.upload_dir or sol.script.parent
    files = [p for p in sorted(root.rglob("*")) if p.is_file()] if sol.upload_dir else [sol.script]
    actions: list[dict[str, Any]] = []
    for p in files:
        try:
            content = p.read_text()
        except UnicodeDecodeError:
            raise SystemExit(
                f"{p}: oracle file is not text; write_file carries text only"
            ) from None
        rel = p.relative_to(root).as_posix()
        actions.append({"kind": "write_file", "path": f"{SOLUTION_DIR}/{rel}", "content": content})
    rel = sol.script.relative_to(root).as_posix()
    env = " ".join(f"{k}={json.dumps(v)}" for k, v in sol.env.items())
    command = f"{'env ' + env + ' ' if env else ''}bash {SOLUTION_DIR}/{rel}"
    actions.append(
        {"kind": "command", "command": command, "timeout_s": task.timeouts.agent_timeout_s}
    )
    return actions


async def play(
    url: str,
    task_id: str,
    actions: list[list[dict[str, Any]]],
    seed: int | None,
    token: str | None,
) -> dict[str, Any]:
    """One episode through the shared loop (sandgym.client.episode_loop): each list of
    `actions` then a submit, until the episode ends (a multi-step task's steps each get theirs;
    a no-op agent's lists are empty). The record's `outcome` says how it ended: `scored` (the
    server's reward), `agent_failure` (a code the agent can cause: reward 0.0, `error` set),
    `masked` (a lost connection, a server fault: reward None, `error` set)."""
    record: dict[str, Any] = {"task_id": task_id, "seed": seed, "steps": [], "error": None}
    started = time.perf_counter()

    async def run_actions(session: RecordingSession) -> str:
        record.update(instruction=session.observation.get("output"), reset_info=session.info)
        for step_actions in actions:
            for action in [*step_actions, {"kind": "submit"}]:
                await session.step(action)
                if session.ended:
                    return "submitted"
        return "submitted"

    env = AsyncEnvClient(url, token, request_timeout_s=None)  # connects on the reset, in the loop
    try:
        end = await play_episode(
            env, task_id, run_actions, seed=seed, session_factory=RecordingSession
        )
    finally:
        await env.close()
    session = end.session
    if isinstance(session, RecordingSession):
        record["steps"] = [
            {"action": s["action"], "observation": s["observation"], "info": s["info"]}
            for s in session.steps
        ]
    res = end.result
    if res is not None and isinstance(res.info.get("step"), dict):  # multi-step: step rewards
        record["step_rewards"] = res.info["step"]["rewards"]
    record.update(
        reward=end.reward, terminated=end.terminated, truncated=end.truncated, outcome=end.outcome
    )
    if end.error is not None:
        record["error"] = {"code": end.code, "message": _message(end.error)}
    record["duration_s"] = round(time.perf_counter() - started, 4)
    return record


def _message(exc: BaseException) -> str:
    return exc.message if isinstance(exc, EnvError) else f"{type(exc).__name__}: {exc}"


def in_process_settings(args: argparse.Namespace) -> Any:
    """The `ServerSettings` of the in-process server that serves the episode without --server
    (a free port, --backend, --tasks, --image-map)."""

    return ServerSettings(
        port=0,
        backend=args.backend or "local",
        task_dirs=list(args.tasks),
        image_map=parse_image_map(args.image_map),
    )


def run(args: argparse.Namespace) -> int:
    registry = TaskRegistry(args.tasks)
    task = registry.get(args.task)
    n_steps = max(1, len(task.steps))
    actions = oracle_step_actions(task) if args.agent == "oracle" else [[]] * n_steps
    if args.server:
        record = asyncio.run(play(args.server, args.task, actions, args.seed, args.token))
        record["server"] = args.server
    else:
        # lazy: every `sandgym` command builds its parser from this module (cli/run.py imports it);
        # server.runner loads fastapi and uvicorn: +0.19 s CPU at start-up (0.73 s without),
        # measured
        from sandgym.server.runner import BackgroundServer

        settings = in_process_settings(args)
        with BackgroundServer(settings) as srv:
            record = asyncio.run(play(srv.url, args.task, actions, args.seed, None))
        record["backend"] = settings.backend
    record["agent"] = args.agent
    if args.json:
        print(json.dumps(record))
    else:
        err = record["error"]
        print(f"task {record['task_id']} agent {args.agent}: ", end="")
        if err:
            print(f"error {err['code']} ({record['outcome']}): {err['message']}")
        else:
            print(
                f"reward {record['reward']:g} after {len(record['steps'])} steps "
                f"({'terminated' if record['terminated'] else 'truncated'}, "
                f"{record['duration_s']:.2f}s)"
            )
    return 0 if record["error"] is None else 1


if __name__ == "__main__":
    from sandgym.server.standalone import run_module

    sys.exit(run_module("sandgym run", sys.modules[__name__], sys.argv[1:]))
