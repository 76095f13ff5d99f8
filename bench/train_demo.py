"""Training demo: SmolLM2-135M-Instruct, GRPO on CPU, reward on held-out seeds before and after.

    python -m bench.train_demo --out bench/results/train_demo.json

Starts `sandgym serve --backend local` on a free port (unless `--server-url` is given), runs
`trainer/configs/demo.yaml` through the real trainer (Ray rollout actor + learner), evaluates
the greedy policy on the held-out seeds before the first and after the last update, and writes
a JSON record (rewards, throughput, the exact command) plus the reward-curve PNG beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server() -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "envserver.cli", "serve", "--backend", "local", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc, f"ws://127.0.0.1:{port}/v1/env"
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("sandgym serve did not answer /healthz within 120 s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(REPO / "trainer/configs/demo.yaml"))
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--server-url", help="use a running env server instead of starting one")
    parser.add_argument("--run-dir", default="runs/train_demo", help="run directory (fresh)")
    parser.add_argument("--out", help="write the JSON record here (and the PNG beside it)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")


def run(args: argparse.Namespace) -> int:
    from trainer.config import load_config
    from trainer.metrics import read_metrics
    from trainer.plot_cli import plot_run
    from trainer.train import Trainer

    server = None
    url = args.server_url
    if url is None:
        server, url = _start_server()
    try:
        overrides = [f'env.server_urls=["{url}"]', "run.eval_before=true", *args.override]
        cfg = load_config(args.config, overrides)
        run_dir = Path(args.run_dir)
        if run_dir.exists():
            shutil.rmtree(run_dir)  # a demo measures from scratch, never from a resume
        trainer = Trainer(cfg, run_dir)
        try:
            summary = trainer.run()
        finally:
            trainer.shutdown()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    rows = read_metrics(run_dir)
    train = [r for r in rows if "reward/mean" in r]
    learner_tps = [r["learner/tokens_per_s"] for r in train if r.get("learner/tokens_per_s")]
    record: dict[str, Any] = {
        "command": "python -m bench.train_demo " + " ".join(sys.argv[1:]),
        "config": cfg.model_dump(mode="json"),
        "updates": summary["version"],
        "heldout_reward_before": summary.get("eval_before", {}).get("eval/reward_mean"),
        "heldout_reward_after": summary.get("eval_after", {}).get("eval/reward_mean"),
        "heldout_episodes_each": summary.get("eval_before", {}).get("eval/episodes"),
        "train_reward_by_update": [r["reward/mean"] for r in train],
        "episodes": summary["episodes"],
        "terminations": summary["terminations"],
        "wall_s": summary["wall_s"],
        "episodes_per_min": 60.0 * summary["episodes"] / summary["wall_s"],
        "generated_tokens_per_s": summary["generated_tokens"] / summary["wall_s"],
        "learner_tokens_per_s_mean": sum(learner_tps) / len(learner_tps) if learner_tps else None,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
    }
    png = run_dir / "reward.png"
    plot_run(run_dir, png)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        shutil.copy(png, out.with_suffix(".png"))
    print(json.dumps(record) if args.json else json.dumps(record, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
