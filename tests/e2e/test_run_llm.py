"""`sandgym run --agent llm` (issue 35): one episode of the trainer's terminal agent with a model,
through an in-process env server, printed as the trainer's episode record: the model's replies,
the actions parsed from them, what the sandbox answered, the reward the verifier wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_run_llm_plays_model_turns_and_prints_the_record() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sandgym.cli", "run", "--task", "builtin/hello-file",
         "--agent", "llm", "--model", "tiny", "--max-turns", "2", "--max-new-tokens", "16",
         "--backend", "local", "--seed", "3", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert record["agent"] == "llm" and record["task_id"] == "builtin/hello-file"
    assert record["seed"] == 3 and record["backend"] == "local"
    # a random tiny model solves nothing: it used its turns, then the trainer submitted for it
    assert record["termination"] == "turn_limit", record["termination"]
    steps = [s for t in record["trajectories"] for s in t["steps"]]
    # two model turns, then the submit the trainer made for it
    assert [s["done"] for s in steps] == [False, False, True], steps
    assert steps[-1]["action"] == {"kind": "submit"} and steps[-1]["response_text"] == ""
    assert [s["policy_version"] for s in steps[:2]] == [0, 0]
    assert record["reward"] == 0.0
    assert "hello.txt" in record["instruction"]
    assert record["cost"]["commands"] >= 0  # the server's ledger reached the record
