"""Every code block of README.md and docs/integrations.md, run as a reader would run it (issue
57, item 7).

The server is README's own `sandgym serve` line, run as written from the repository root (local
backend), with the placeholders a reader fills in replaced by `PLACEHOLDERS` (the port: a free
one). Each Python block is a script written to a fresh directory (beside it, the YAML files its
section names) and run by a fresh interpreter of the environment its door uses (`.venv`;
verl's `.venv-verl`), from that directory, so `import sandgym` is the installed package. Each
must exit by itself with status 0 (a hang guard far above its expected time stops one that does
not, and fails naming it), and must leave no episode open on the server: an example that never
calls `close()` relies on the client closing it at interpreter exit.

`NOT_RUN` lists, by heading, the blocks that cannot run here, each with the reason; a block
that is neither run nor listed fails `test_every_block_is_run_or_listed`, so the docs cannot
grow an example nobody runs.

`test_forgotten_*` check the exit path alone: an episode left in progress (no submit, no close)
by a Gymnasium env and by the doors' `SyncEpisode`, in a fresh interpreter: it exits by itself
and the server's episode is closed (well before the server's 60 s resume grace would release
it); with the server stopped (SIGSTOP), it still exits, each exit hook reporting its bound.

verl's GPU command cannot run here; `test_verl_gpu_command_composes_with_verls_config` composes
its overrides with verl's own trainer config instead. Run time here: 2.5 to 4 min, most of it
the TRL block (100 to 150 s: two GRPO steps of SmolLM2-135M on CPU) and verl's (35 to 45 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import local_available
from tests.waiting import wait_until

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/integrations.md")

#: What a reader substitutes, in this order: the server's address (the docs say 8765 or HOST).
PLACEHOLDERS = (
    ("--port 8765", "--port {port}"),
    ("127.0.0.1:8765", "127.0.0.1:{port}"),
    ("HOST:8765", "127.0.0.1:{port}"),
)

Key = tuple[str, str, int]  # (document, heading, index of the block under that heading)

#: README's `sandgym serve` block: the module's server is this command, run as written.
SERVER_BLOCK: Key = ("README.md", "1. As a Gym environment", 0)


@dataclass(frozen=True)
class Script:
    """How a Python block runs: the virtualenv of its door, the files of its section written
    beside it (YAML blocks, under the name their first comment line gives), and a hang guard
    (far above the expected time; never the claim)."""

    venv: str = ".venv"
    files: tuple[Key, ...] = ()
    hang_guard_s: float = 180.0
    #: the last line the example prints, where the docs say what it prints
    prints: str | None = None


#: Python blocks run here (each in a fresh interpreter, against the live server).
SCRIPTS: dict[Key, Script] = {
    ("README.md", "1. As a Gym environment", 1): Script(),
    ("docs/integrations.md", "OpenEnv", 1): Script(prints="1.0 True"),
    # a real model on CPU: loads in ~20 s, two GRPO steps of two rollouts; minutes on a busy
    # 2-core machine
    ("docs/integrations.md", "TRL", 1): Script(hang_guard_s=1500.0),
    ("docs/integrations.md", "SkyRL", 1): Script(prints="1.0 True"),
    ("docs/integrations.md", "verl", 2): Script(
        venv=".venv-verl", files=(("docs/integrations.md", "verl", 1),), hang_guard_s=900.0
    ),
}

#: Blocks used by a script above (written beside it), not run on their own.
FILES: frozenset[Key] = frozenset(k for s in SCRIPTS.values() for k in s.files)

#: docs/integrations.md's `python -m verl.trainer.main_ppo ...` command (GPU only).
VERL_GPU_BLOCK: Key = ("docs/integrations.md", "verl", 3)

#: Blocks not run here, by heading, with the reason.
NOT_RUN: dict[Key, str] = {
    ("README.md", "sandgym", 0): "a diagram, not code",
    ("README.md", "Two commands", 0): (
        "demo.sh installs system packages and builds .venv (a fresh machine's first command); "
        "test.sh installs everything and runs the whole suite (it is CI: .ci/run runs it)"
    ),
    ("README.md", "2. As sandboxes, or as Harbor's environment", 0): (
        "Harbor needs Python >= 3.12 (this host: 3.11); tests/e2e/test_harbor_provider.py runs "
        "`harbor run --env sandgym.integrations.harbor:SandgymEnvironment` in a container"
    ),
    ("README.md", "3. To train a model", 0): (
        "installs the training extras and runs Ray trainings (minutes to hours on CPU); "
        "tests/e2e/test_train_smoke.py runs the smoke config"
    ),
    ("docs/integrations.md", "OpenEnv", 0): "installs into the reader's environment",
    ("docs/integrations.md", "TRL", 0): "installs into the reader's environment",
    ("docs/integrations.md", "SkyRL", 0): "installs into the reader's environment",
    ("docs/integrations.md", "verl", 0): (
        "creates verl's environment (scripts/setup.sh --train builds it as .venv-verl, the way "
        "the block does)"
    ),
    VERL_GPU_BLOCK: (
        "verl's trainer needs vLLM or SGLang on a GPU; its overrides are composed with verl's "
        "own trainer config by test_verl_gpu_command_composes_with_verls_config"
    ),
    ("docs/integrations.md", "NeMo-Gym", 0): (
        "nemo-gym 0.5 to 0.7 require Python >= 3.13.14, newer than any CPython packaged here "
        "(3.13.5); tests/e2e/test_integration_nemo_gym.py installs it in the runner image"
    ),
    ("docs/integrations.md", "NeMo-Gym", 1): (
        "NeMo-Gym's config; needs Python >= 3.13.14 (tests/e2e/test_integration_nemo_gym.py)"
    ),
    ("docs/integrations.md", "NeMo-Gym", 2): (
        "nemo-gym needs Python >= 3.13.14; tests/e2e/test_integration_nemo_gym.py drives the "
        "same calls with the released package in the runner image"
    ),
    ("docs/integrations.md", "Harbor", 0): (
        "Harbor needs Python >= 3.12 (this host: 3.11); tests/e2e/test_harbor_provider.py runs "
        "it in a container"
    ),
}


@dataclass(frozen=True)
class Block:
    doc: str
    heading: str
    index: int
    lang: str
    code: str

    @property
    def key(self) -> Key:
        return (self.doc, self.heading, self.index)


_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def extract(doc: str) -> list[Block]:
    """The fenced blocks of one document, each under its nearest heading."""
    blocks: list[Block] = []
    heading, per_heading = "", 0
    lines = (REPO / doc).read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence is None:
            if line.startswith("#"):
                heading, per_heading = line.lstrip("#").strip(), 0
            i += 1
            continue
        indent, lang = fence.group(1), fence.group(2)
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{doc}: a code block under {heading!r} is never closed")
        blocks.append(Block(doc, heading, per_heading, lang, "\n".join(body) + "\n"))
        per_heading += 1
        i += 1
    return blocks


def all_blocks() -> dict[Key, Block]:
    return {b.key: b for doc in DOCS for b in extract(doc)}


def fill(code: str, port: int) -> str:
    for placeholder, value in PLACEHOLDERS:
        code = code.replace(placeholder, value.format(port=port))
    return code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["HF_HUB_OFFLINE"] = "1"  # nothing is fetched from a model hub here (MACHINE-NOTES)
    # The examples share 2 cores with pytest and the server: one intra-op thread, or torch's
    # threads contend (measured: 64 tokens of SmolLM2 took 55 s with 2 threads, 8 s with 1,
    # on a loaded machine).
    env["OMP_NUM_THREADS"] = "1"
    return env


@dataclass
class LiveServer:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sessions(self) -> list[dict[str, object]]:
        view = httpx.get(f"{self.http_url}/v1/sessions", timeout=10).json()
        return list(view["sessions"])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    if not local_available():
        pytest.skip("bubblewrap not installed (README's server runs the local backend)")
    block = all_blocks()[SERVER_BLOCK]
    assert block.lang == "bash" and "sandgym serve" in block.code, (
        f"expected README's {SERVER_BLOCK[1]!r} to start with the `sandgym serve` block, got "
        f"{block.code!r}"
    )
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", fill(block.code, port)],
            cwd=REPO,
            env=_env(REPO / ".venv"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    srv = LiveServer(port, proc)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"README's `sandgym serve` exited with {proc.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            return httpx.get(f"{srv.http_url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        asyncio.run(wait_until(healthy, 90, 0.2, "README's sandgym serve answering /healthz"))
        yield srv
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def run_script(code: str, venv: Path, cwd: Path, hang_guard_s: float) -> str:
    """Run `code` as a script in a fresh interpreter of `venv`, from `cwd`; its output, or a
    named failure when it does not exit by itself with status 0."""
    script = cwd / "example.py"
    script.write_text(code)
    try:
        proc = subprocess.run(
            [str(venv / "bin" / "python"), str(script)],
            cwd=cwd,
            env=_env(venv),
            capture_output=True,
            text=True,
            timeout=hang_guard_s,
        )
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-3000:]
        raise AssertionError(
            f"expected the example to exit by itself; it was still running after the "
            f"{hang_guard_s:g} s hang guard. stderr tail: {tail!r}"
        ) from None
    assert proc.returncode == 0, (
        f"expected exit status 0, got {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


async def no_episode_left(srv: LiveServer, what: str) -> None:
    """The server holds no session (polled: a close the client sent may still be landing)."""
    await wait_until(lambda: srv.sessions() == [], 15, 0.1, f"no session left on the server {what}")


# -- the docs cannot drift -------------------------------------------------------------------------


def test_every_block_is_run_or_listed() -> None:
    blocks = all_blocks()
    assert len(blocks) >= len(SCRIPTS) + len(NOT_RUN), f"fewer blocks than listed: {list(blocks)}"
    handled = {SERVER_BLOCK, *SCRIPTS, *FILES, *NOT_RUN}
    assert len(handled) == 1 + len(SCRIPTS) + len(FILES) + len(NOT_RUN), (
        "a block is both run and listed as not run"
    )
    new = [f"{k} ({blocks[k].lang or 'no language'})" for k in blocks if k not in handled]
    stale = [k for k in handled if k not in blocks]
    assert not new, (
        f"code blocks neither run nor listed in {__name__}: {new}; add each to SCRIPTS (run) "
        "or NOT_RUN (with the reason)"
    )
    assert not stale, (
        f"listed blocks that the docs no longer have (heading or order moved): {stale}"
    )
    wrong = [k for k in SCRIPTS if blocks[k].lang != "python"]
    wrong += [k for k in FILES if blocks[k].lang != "yaml"]
    assert not wrong, f"expected python scripts and yaml files, got other languages at {wrong}"


# -- the examples, as written ----------------------------------------------------------------------


def _script_params() -> list[object]:
    return [
        pytest.param(
            key, marks=pytest.mark.timeout(int(s.hang_guard_s) + 120), id=f"{key[1]}-{key[2]}"
        )
        for key, s in SCRIPTS.items()
    ]


@pytest.mark.parametrize("key", _script_params())
async def test_python_block_runs_as_written(key: Key, server: LiveServer, tmp_path: Path) -> None:
    how = SCRIPTS[key]
    venv = REPO / how.venv
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"{how.venv} not built (scripts/setup.sh --train builds it)")
    blocks = all_blocks()
    for file_key in how.files:
        name = blocks[file_key].code.splitlines()[0].lstrip("# ").split()[0].rstrip(",")
        assert re.fullmatch(r"[\w.-]+\.ya?ml", name), (
            f"expected the YAML block {file_key} to name its file on its first line, got {name!r}"
        )
        (tmp_path / name).write_text(fill(blocks[file_key].code, server.port))
    code = fill(blocks[key].code, server.port)
    assert "8765" not in code and "HOST" not in code, f"a placeholder is left in {key}: {code}"
    out = await asyncio.to_thread(run_script, code, venv, tmp_path, how.hang_guard_s)
    if how.prints is not None:
        last = out.splitlines()[-1] if out.strip() else ""
        assert last == how.prints, f"expected the example to print {how.prints!r} last, got {out!r}"
    await no_episode_left(server, f"after the example {key}")


# -- a forgotten env is closed at exit -------------------------------------------------------------

FORGOTTEN_GYM_ENV = """\
import gymnasium as gym
import sandgym.client

env = gym.make("sandgym/Terminal-v0", server_url="ws://127.0.0.1:{port}/v1/env",
               task_id="builtin/hello-file")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step("echo in progress")
"""

FORGOTTEN_SYNC_EPISODE = """\
from sandgym.integrations.episode import SyncEpisode

episodes = [SyncEpisode("ws://127.0.0.1:{port}/v1/env") for _ in range(2)]
for seed, ep in enumerate(episodes):
    ep.reset("builtin/hello-file", seed=seed)
    ep.act({{"kind": "command", "command": "echo in progress"}})
"""


@pytest.mark.parametrize(
    ("source", "open_during"),
    [(FORGOTTEN_GYM_ENV, 1), (FORGOTTEN_SYNC_EPISODE, 2)],
    ids=["gymnasium-env", "sync-episode"],
)
async def test_forgotten_episodes_close_at_exit(
    source: str, open_during: int, server: LiveServer, tmp_path: Path
) -> None:
    await no_episode_left(server, "before the script")
    # the script blocks on its stdin after its last line until the test has seen its episodes
    code = source.format(port=server.port) + "import sys; sys.stdin.readline()\n"
    script = tmp_path / "forgotten.py"
    script.write_text(code)
    venv = REPO / ".venv"
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [str(venv / "bin" / "python"), str(script)],
        cwd=tmp_path,
        env=_env(venv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await wait_until(
            lambda: proc.poll() is not None or len(server.sessions()) == open_during,
            120,
            0.1,
            f"{open_during} episode(s) of the script open on the server",
        )
        assert proc.poll() is None, f"the script ended early: {proc.communicate()[1][-3000:]}"
        # in progress: one step each, no submit
        assert [s["steps"] for s in server.sessions()] == [1] * open_during
        try:
            _out, err = await asyncio.to_thread(proc.communicate, "\n", 120)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "expected the script to exit by itself at its end; still running after the "
                "120 s hang guard"
            ) from None
        assert proc.returncode == 0, f"expected exit status 0, got {proc.returncode}: {err[-3000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    await no_episode_left(server, "after the script exited (closed at exit, not left to the sweep)")


def test_placeholders_are_filled() -> None:
    """The substitution table turns every address the docs show into the live server's."""
    code = textwrap.dedent(
        """\
        sandgym serve --backend local --port 8765
        url = "ws://127.0.0.1:8765/v1/env"; other = "http://HOST:8765/openenv"
        """
    )
    assert fill(code, 4321) == textwrap.dedent(
        """\
        sandgym serve --backend local --port 4321
        url = "ws://127.0.0.1:4321/v1/env"; other = "http://127.0.0.1:4321/openenv"
        """
    )


COMPOSE = """\
import json, sys
from pathlib import Path

import verl
from hydra import compose, initialize_config_dir

config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=json.loads(sys.argv[1]))
rollout = cfg.actor_rollout_ref.rollout
print(json.dumps({"mode": rollout.mode, "name": rollout.name,
                  "agent_loops": rollout.agent.agent_loop_config_path,
                  "server_url": cfg.sandgym.server_url, "steps": cfg.trainer.total_training_steps}))
"""


def test_verl_gpu_command_composes_with_verls_config(tmp_path: Path) -> None:
    """The GPU block cannot run here, but every override in it must be a key of verl's released
    trainer config (Hydra composes them, as `verl.trainer.main_ppo` does at its start): a typo
    fails here, not on the GPU machine."""
    venv = REPO / ".venv-verl"
    if not (venv / "bin" / "python").exists():
        pytest.skip(".venv-verl not built (scripts/setup.sh --train builds it)")
    argv = shlex.split(all_blocks()[VERL_GPU_BLOCK].code.replace("\\\n", " "))
    assert argv[:3] == ["python", "-m", "verl.trainer.main_ppo"], f"got {argv[:3]}"
    script = tmp_path / "compose.py"
    script.write_text(COMPOSE)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(script), json.dumps(argv[3:])],
        cwd=tmp_path, env=_env(venv), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"verl's config refused the overrides: {proc.stderr[-3000:]}"
    assert json.loads(proc.stdout.splitlines()[-1]) == {
        "mode": "async",
        "name": "vllm",
        "agent_loops": "agent_loops.yaml",
        "server_url": "ws://HOST:8765/v1/env",
        "steps": 2,
    }


FORGOTTEN_BOTH = """\
import sys

import gymnasium as gym
import sandgym.client
from sandgym.integrations.episode import SyncEpisode

env = gym.make("sandgym/Terminal-v0", server_url="ws://127.0.0.1:{port}/v1/env",
               task_id="builtin/hello-file")
env.reset(seed=0)
episode = SyncEpisode("ws://127.0.0.1:{port}/v1/env")
episode.reset("builtin/hello-file", seed=1)
sys.stdin.readline()
"""


async def test_forgotten_episodes_exit_when_the_server_is_silent(tmp_path: Path) -> None:
    """A server that holds the connection but answers nothing (stopped with SIGSTOP) cannot
    keep a script that forgot its episodes from exiting: each exit hook waits its bound, says
    the episode is left to the server's sweep, and the process ends with status 0."""
    venv = REPO / ".venv"
    port = _free_port()
    server = await asyncio.to_thread(
        subprocess.Popen,
        [str(venv / "bin" / "sandgym"), "serve", "--backend", "null", "--port", str(port)],
        cwd=tmp_path,
        env=_env(venv),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    srv = LiveServer(port, server)
    script = tmp_path / "forgotten.py"
    script.write_text(FORGOTTEN_BOTH.format(port=port))
    proc: subprocess.Popen[str] | None = None
    try:

        def up() -> bool:
            assert server.poll() is None, f"sandgym serve exited with {server.returncode}"
            try:
                return httpx.get(f"{srv.http_url}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(up, 90, 0.2, "sandgym serve --backend null answering /healthz")
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [str(venv / "bin" / "python"), str(script)],
            cwd=tmp_path,
            env=_env(venv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        script_proc = proc
        await wait_until(
            lambda: script_proc.poll() is not None or len(srv.sessions()) == 2,
            120,
            0.1,
            "the script's two episodes open on the server",
        )
        assert proc.poll() is None, f"the script ended early: {proc.communicate()[1][-3000:]}"
        server.send_signal(signal.SIGSTOP)
        try:
            _out, err = await asyncio.to_thread(proc.communicate, "\n", 120)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                "expected the script to exit by itself with the server silent; still running "
                "after the 120 s hang guard"
            ) from None
        assert proc.returncode == 0, f"expected exit status 0, got {proc.returncode}: {err[-3000:]}"
        left = [line for line in err.splitlines() if "sweep" in line or "not confirmed" in line]
        assert len(left) == 2, f"expected both exit hooks to report their bound, got: {err[-3000:]}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        server.send_signal(signal.SIGCONT)
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            # The subject here is the client's exit, checked above. A server stopped and
            # continued once took longer than 60 s to end on SIGTERM under load (2026-12-07, an
            # open question in the session note): it is killed so that it cannot outlive the
            # test, and the stop is logged, not asserted.
            log.warning("the SIGCONT'ed server did not end within 60 s of SIGTERM; killed")
            server.kill()
            server.wait(10)
