"""The CPU doors, each played in its partner's own environment (issue 57, item 3): a fresh
virtualenv holding only the partner and the sandgym wheel of this checkout, installed for real
by pip's own resolver (no `--no-deps`), as a user adds sandgym to a trainer's environment:

    pip install 'sandgym-*.whl[EXTRA]' PARTNER==VERSION

VERSION is the release the door was checked with: the pin in constraints/server.txt where it has
one, else the lower bound of the door's extra in pyproject.toml (tests/e2e/test_resolution.py
resolves each beside the partner's newest). TRL's environment is a user's who already has torch:
`torch==2.13.0` (the CPU wheel lying on this disk, MACHINE-NOTES.md) is installed first, because
a plain torch requirement would pull a multi-GB CUDA build; it must stay 2.13.0.

One live server for the module, README's `sandgym serve --backend local` run from the project's
`.venv` (tests/e2e/test_docs_examples.py's fixture). In each partner venv a short script, run
from a tmp dir (so `sandgym` is the installed wheel), plays one episode of `builtin/hello-file`
through the door with the oracle's command and prints the verifier's reward, which must be 1.0:
- OpenEnv: OpenEnv's own `GenericEnvClient` against `/openenv`;
- SkyRL: `skyrl_gym.make("sandgym", ...)`, `init`, `step` with SkyRL's tags;
- TRL: `sandgym_environment(URL)` as `GRPOTrainer` uses an environment factory (trl 1.16.0,
  trl/trainer/grpo_trainer.py): called with no argument, its tools found on the class
  (`inspect.getmembers(..., isfunction)`, public, not `reset`/`get_reward`) and their schemas
  built by transformers' `get_json_schema` (what the chat template gets), `reset(**row)` with the
  dataset row, a tool called by name with keyword arguments, then `get_reward()`. No model.
Each venv must hold the partner at VERSION and none of the server's packages unless the
partner's own dependency tree requires it (named in `DOORS`, checked to be reachable from the
partner's requirements). The server holds no episode after each script has exited.

Run time here (2 cores shared with another suite, pip cache warm; 2026-12-07): 3 passed in
140 s, most of it pip installing (TRL's venv, torch then trl: ~100 s; OpenEnv's ~35 s; SkyRL's
~20 s); the episodes take a few seconds each.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tomllib
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.e2e import test_docs_examples as docs
from tests.e2e.test_resolution import SERVER_ONLY, _norm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]

#: README's `sandgym serve --backend local`, from the project's .venv (one per module)
server = docs.server

TASK = "builtin/hello-file"
#: the oracle's command for TASK (its solution/solve.sh)
ORACLE = "printf 'Hello, world!\\n' > /app/hello.txt"
TORCH = "torch==2.13.0"

OPENENV = f"""
from openenv.core import GenericEnvClient

with GenericEnvClient(base_url="http://127.0.0.1:{{port}}/openenv").sync() as env:
    r = env.reset(task_id="{TASK}", seed=0)
    r = env.step({{"kind": "command", "command": {ORACLE!r}}})
    r = env.step({{"kind": "submit"}})
    print(r.reward, r.done)
"""

SKYRL = f"""
import skyrl_gym
import sandgym.integrations.skyrl  # registers "sandgym"

env = skyrl_gym.make("sandgym", env_config={{"server_url": "ws://127.0.0.1:{{port}}/v1/env",
                                            "max_turns": 5}},
                     extras={{"task_id": "{TASK}", "seed": 0}})
prompt, meta = env.init([{{"role": "user", "content": "Solve the task."}}])
assert "/app/hello.txt" in prompt[-1]["content"], prompt
out = env.step("<bash>" + {ORACLE!r} + "</bash>")
out = env.step("<submit/>")
env.close()
print(out["reward"], out["done"])
"""

TRL = f"""
import inspect

from transformers.utils import get_json_schema

from sandgym.integrations.trl import sandgym_environment

factory = sandgym_environment("ws://127.0.0.1:{{port}}/v1/env")
env = factory()  # GRPOTrainer: one instance per rollout, made with no argument
members = inspect.getmembers(type(env), predicate=inspect.isfunction)
assert any(name == "reset" for name, _ in members) and any(n == "get_reward" for n, _ in members)
tools = {{name: getattr(env, name) for name, _ in members
         if name not in ("reset", "get_reward") and not name.startswith("_")}}
schemas = {{s["function"]["name"]: s for s in map(get_json_schema, tools.values())}}
assert sorted(schemas) == ["read_file", "run", "submit", "write_file"], sorted(schemas)
row = {{"prompt": [{{"role": "user", "content": "Solve the task."}}], "task_id": "{TASK}",
       "seed": 0}}
observation = env.reset(**row)  # appended to the prompt's last user message
assert isinstance(observation, str) and "/app/hello.txt" in observation, observation
tools["run"](**{{"command": {ORACLE!r}}})  # the model's tool call, arguments parsed from JSON
rewards = [e.get_reward() for e in [env]]  # GRPOTrainer's reward source for get_reward
print(rewards[0], sorted(schemas["run"]["function"]["parameters"]["properties"]))
"""


@dataclass(frozen=True)
class Door:
    extra: str
    script: str
    #: the script's last line (the verifier's reward first)
    prints: str
    #: the server's packages the partner's own dependency tree requires (and why)
    partner_needs: frozenset[str] = frozenset()
    #: installed first, as already in the user's environment
    first: tuple[str, ...] = ()


DOORS: dict[str, Door] = {
    # openenv's own server (openenv.core) is FastAPI on uvicorn
    "openenv": Door("openenv", OPENENV, "1.0 True", frozenset({"fastapi", "uvicorn"})),
    "skyrl-gym": Door("skyrl", SKYRL, "1.0 True"),
    # trl -> accelerate -> psutil
    "trl": Door("trl", TRL, "1.0 ['command']", frozenset({"psutil"}), first=(TORCH,)),
}


def checked_version(partner: str, extra: str) -> str:
    """The partner release the door was checked with: constraints/server.txt's pin, else the
    lower bound of the door's extra."""
    for line in (REPO / "constraints" / "server.txt").read_text().splitlines():
        m = re.match(rf"^{re.escape(partner)}==(\S+)", line.strip())
        if m:
            return m.group(1)
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in meta["project"]["optional-dependencies"][extra]]
    bounds = [s.version for r in reqs if _norm(r.name) == partner for s in r.specifier]
    assert len(bounds) == 1, f"expected one version bound on {partner} in [{extra}], got {bounds}"
    return bounds[0]


def pip_install(python: Path, *requirements: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-input", *requirements],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    errors = [ln for ln in proc.stderr.splitlines() if "WARNING: Location" not in ln]
    assert proc.returncode == 0, f"pip install {requirements} failed:\n" + "\n".join(errors[-30:])


#: every distribution in a venv: name -> (version, its requirement strings)
PROBE = """
import importlib.metadata as m, json
print(json.dumps({d.metadata["Name"]: [d.version, d.requires or []] for d in m.distributions()}))
"""


def installed(python: Path) -> dict[str, tuple[str, list[str]]]:
    out = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    return {_norm(k): (v[0], v[1]) for k, v in json.loads(out.stdout).items()}


def required_by(root: str, dists: dict[str, tuple[str, list[str]]]) -> set[str]:
    """The distributions `root`'s requirements reach in this venv (markers and extras honoured)."""
    seen: set[str] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        for text in dists[name][1]:
            req = Requirement(text)
            env = [{**default_environment(), "extra": e} for e in ("", *extras)]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
                continue
            dep = _norm(req.name)
            if dep in dists and (dep, frozenset(req.extras)) not in seen:
                todo.append((dep, frozenset(req.extras)))
            seen.add(dep)
    return seen & set(dists)


@pytest.mark.parametrize("partner", sorted(DOORS))
def test_door_plays_an_episode_in_its_partners_environment(
    partner: str,
    wheel: Path,
    server: docs.LiveServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    door = DOORS[partner]
    version = checked_version(partner, door.extra)
    root = tmp_path_factory.mktemp(f"venv-{partner}")
    venv.EnvBuilder(with_pip=False).create(root)
    python = root / "bin" / "python"
    for requirement in door.first:
        pip_install(python, requirement)
    pip_install(python, f"{wheel}[{door.extra}]", f"{partner}=={version}")

    dists = installed(python)
    assert dists.get(_norm(partner), ("absent",))[0] == version, (
        f"expected {partner} {version} in its venv, found {dists.get(_norm(partner))}"
    )
    assert "sandgym" in dists, f"expected the sandgym wheel in {partner}'s venv: {sorted(dists)}"
    for requirement in door.first:
        name, want = requirement.split("==")
        got = dists.get(name, ("absent",))[0]
        assert got.split("+")[0] == want, (
            f"expected {partner}'s install to keep the user's {requirement}, found {name} {got}"
        )
    server_pkgs = SERVER_ONLY & set(dists)
    assert server_pkgs == door.partner_needs, (
        f"expected exactly the server packages {partner} itself requires "
        f"({sorted(door.partner_needs)}) in its venv, found {sorted(server_pkgs)}"
    )
    unexplained = door.partner_needs - required_by(_norm(partner), dists)
    assert not unexplained, f"{sorted(unexplained)} installed, but not required by {partner}"

    cwd = tmp_path_factory.mktemp(f"user-{partner}")
    where = docs.run_script(
        "import sandgym; print(sandgym.__file__)\n", root, cwd, hang_guard_s=120
    ).strip()
    assert Path(where).is_relative_to(root), (
        f"expected sandgym imported from {partner}'s venv {root}, got {where}"
    )
    out = docs.run_script(
        door.script.replace("{port}", str(server.port)), root, cwd, hang_guard_s=300
    )
    lines = out.strip().splitlines()
    assert lines and lines[-1] == door.prints, (
        f"expected {partner}'s episode to print {door.prints!r} (the verifier's reward first), "
        f"got {lines[-3:]}"
    )
    asyncio.run(docs.no_episode_left(server, f"after {partner}'s script exited"))
