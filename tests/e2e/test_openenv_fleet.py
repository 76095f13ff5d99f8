"""OpenEnv's released client (openenv==0.10.0) against a fleet of two real `sandgym serve
--backend local` processes behind one address: the `sandgym route` process
(sandgym/integrations/openenv_router.py).

Episodes of builtin/hello-file land on both servers (each episode's session is found in its
server's `GET /v1/sessions`), each scored 1.0; a dropped socket is resumed through the router on
its own server; OpenEnv's runtime validator passes against the router's address; SIGKILL of the server holding an episode makes
that server's episodes raise OpenEnv's `SESSION_ERROR` (no reward), one mid-request and one at
its next request, while the episode on the other server goes on and is scored; the next episodes
run on the survivor with reward 1.0.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from sandgym.server.runner import free_port
from tests.e2e.test_fleet import (  # noqa: F401  (fleet2: the two-server fixture)
    Server,
    fleet2,
    start_answering,
    stop_process,
)
from tests.waiting import wait_until

openenv_core = pytest.importorskip("openenv.core")
from openenv.cli._validation import validate_running_environment  # noqa: E402

TASK = "builtin/hello-file"
SOLVE = {"kind": "command", "command": "printf 'Hello, world!\\n' > /app/hello.txt"}
SUBMIT = {"kind": "submit"}


class Router:
    """`sandgym route --fleet A,B` as its own process."""

    def __init__(self, fleet: str, token: str | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "sandgym.cli", "route", "--fleet", fleet,
               "--port", str(self.port)]  # fmt: skip
        cmd += ["--token", token] if token else []
        self.proc = start_answering(cmd, self.url, f"router on {self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture
def router(fleet2: list[Server]) -> Iterator[Router]:  # noqa: F811
    r = Router(",".join(s.url for s in fleet2))
    try:
        yield r
    finally:
        r.stop()


def holder(servers: list[Server], session_id: str) -> Server:
    """The one server whose `/v1/sessions` lists `session_id`."""
    found = [
        s
        for s in servers
        if s.proc is not None
        and s.proc.poll() is None
        and session_id
        in {
            x["session_id"] for x in httpx.get(f"{s.url}/v1/sessions", timeout=5).json()["sessions"]
        }
    ]
    assert len(found) == 1, f"expected one server holding {session_id}, found {len(found)}"
    return found[0]


def is_busy(server: Server, session_id: str) -> bool:
    """`session_id`'s request is being answered on `server` (its `/v1/sessions` says so)."""
    body = httpx.get(f"{server.url}/v1/sessions", timeout=5).json()
    return any(x["busy"] for x in body["sessions"] if x["session_id"] == session_id)


def episode(base: str, servers: list[Server]) -> tuple[Server, float | None]:
    """One solved episode through OpenEnv's client: (the server it ran on, its reward)."""
    with openenv_core.GenericEnvClient(base_url=base).sync() as env:
        first = env.reset(task_id=TASK, seed=0)
        where = holder(servers, first.metadata["session_id"])
        res = env.step(SOLVE)
        assert res.observation["exit_code"] == 0 and res.done is False
        res = env.step(SUBMIT)
        assert res.done is True
        return where, res.reward


def test_openenv_client_on_a_fleet_of_two(fleet2: list[Server], router: Router) -> None:  # noqa: F811
    a, b = fleet2
    base = router.url + "/openenv"

    played = [episode(base, fleet2) for _ in range(4)]
    assert [r for _, r in played] == [1.0] * 4
    assert Counter(s.port for s, _ in played) == {a.port: 2, b.port: 2}

    # a socket dropped without `close`, resumed through the router: back on its own server
    ws_url = "ws" + base.removeprefix("http") + "/ws"
    with connect(ws_url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"task_id": TASK, "seed": 0}}))
        meta = json.loads(ws.recv())["data"]["metadata"]
        ws.send(json.dumps({"type": "step", "data": SOLVE}))
        assert json.loads(ws.recv())["data"]["observation"]["exit_code"] == 0
    holder(fleet2, meta["session_id"])  # held by one server (only it can resume the session)
    query = f"?session_id={meta['session_id']}&resume_token={meta['resume_token']}"
    with connect(ws_url + query) as ws:
        ws.send(json.dumps({"type": "step", "data": SUBMIT}))
        reply = json.loads(ws.recv())
    assert reply["type"] == "observation" and reply["data"]["reward"] == 1.0, reply

    # stateless HTTP through the router: a fresh one-action episode on some server, and
    # OpenEnv's own runtime validator against the router's one address
    r = httpx.post(f"{base}/step", json={"action": SUBMIT, "task_id": TASK, "seed": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["reward"] == 0.0 and r.json()["done"] is True
    report = validate_running_environment(base)
    assert report["passed"], report["summary"]

    # three episodes open at once (so one server holds two); that server dies mid-episode, one
    # of its episodes mid-request, the other between requests: each gets OpenEnv's error, never a
    # reward; the episode on the survivor goes on and is scored
    with ExitStack() as stack:
        envs = [stack.enter_context(openenv_core.GenericEnvClient(base_url=base).sync())
                for _ in range(3)]  # fmt: skip
        sids = [env.reset(task_id=TASK, seed=0).metadata["session_id"] for env in envs]
        where = [holder(fleet2, sid) for sid in sids]
        victim = Counter(where).most_common(1)[0][0]
        survivor = b if victim is a else a
        assert sorted(Counter(where).values()) == [1, 2]  # placed by room: 2 + 1
        on_victim = [(e, sid) for e, sid, w in zip(envs, sids, where, strict=True) if w is victim]
        (busy, busy_sid), (idle, _) = on_victim
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(busy.step, {"kind": "command", "command": "sleep 20"})
            asyncio.run(wait_until(lambda: is_busy(victim, busy_sid), 30, what="the step running"))
            victim.kill()
            with pytest.raises(RuntimeError, match=r"code: SESSION_ERROR") as err:
                pending.result(timeout=30)
        assert victim.url in str(err.value)
        with pytest.raises(RuntimeError, match=r"code: SESSION_ERROR"):
            idle.step(SOLVE)
        (alive,) = [e for e, w in zip(envs, where, strict=True) if w is survivor]
        alive.step(SOLVE)
        assert alive.step(SUBMIT).reward == 1.0

    # the next episodes go to the survivor, scored as before
    after = [episode(base, fleet2) for _ in range(2)]
    assert [(s.port, rew) for s, rew in after] == [(survivor.port, 1.0)] * 2
    health = httpx.get(f"{router.url}/healthz", timeout=5).json()
    states = {s["url"]: s["healthy"] for s in health["servers"]}
    assert states == {victim.url: False, survivor.url: True}


def test_router_asks_the_token_and_says_when_no_server_is_up() -> None:
    """`--token`: a client without it gets 401 (HTTP) or close 4401 (ws); with it, a fleet whose
    one server does not answer gets OpenEnv's CAPACITY_REACHED (ws) and 503 (HTTP)."""
    dead = f"http://127.0.0.1:{free_port()}"
    r = Router(f"{dead},{dead.replace('127.0.0.1', 'localhost')}", token="s3cret")
    try:
        base = r.url + "/openenv"
        assert httpx.get(f"{base}/health", timeout=10).status_code == 401
        with connect("ws" + base.removeprefix("http") + "/ws") as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{base}/health", headers=auth, timeout=30).status_code == 503
        with openenv_core.GenericEnvClient(base_url=base, headers=auth).sync() as env:
            with pytest.raises(RuntimeError, match=r"code: CAPACITY_REACHED"):
                env.reset(task_id=TASK, seed=0)
    finally:
        r.stop()
