"""A short verl GRPO run whose rollouts are sandgym episodes (sandgym/integrations/verl.py), for a GPU
machine with verl 0.9.1 and vLLM installed in verl's own environment (its transformers pin) and a
sandgym server reachable. Prepared, not yet run: no GPU was lent while it was written.

    python scripts/verl_gpu_check.py --model /path/to/hf-model --server ws://HOST:8765/v1/env \
        [--tasks builtin/hello-file,builtin/count-lines] [--steps 2] [--dry-run]

It writes a train parquet (one row per task: `prompt`, `agent_name` = sandgym_agent,
`extra_info.task_id` / `seed`) and an agent-loop config naming `sandgym.integrations.verl.
SandgymAgentLoop`, then runs `python -m verl.trainer.main_ppo` for `--steps` steps (GRPO, n=2,
one GPU, console logger). `--dry-run` prints the command instead. Pass: the run ends with exit 0
and its console log shows `critic/rewards/mean` for every step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local HF model directory")
    ap.add_argument("--server", default="ws://127.0.0.1:8765/v1/env", help="sandgym server")
    ap.add_argument("--tasks", default="builtin/hello-file,builtin/count-lines")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    import pandas as pd

    work = Path(tempfile.mkdtemp(prefix="sandgym-verl-"))
    rows = [
        {
            "data_source": "sandgym",
            "prompt": [{"role": "user", "content": "Solve the task in the terminal."}],
            "agent_name": "sandgym_agent",
            "extra_info": {"task_id": task, "seed": 0, "index": i},
            "reward_model": {"style": "rule", "ground_truth": ""},
        }
        for i, task in enumerate(args.tasks.split(","))
    ]
    pd.DataFrame(rows).to_parquet(work / "train.parquet")
    (work / "agent_loops.yaml").write_text(
        "- name: sandgym_agent\n  _target_: sandgym.integrations.verl.SandgymAgentLoop\n"
    )
    n_rows = len(rows)
    overrides = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={work / 'train.parquet'}",
        f"data.val_files={work / 'train.parquet'}",
        f"data.train_batch_size={n_rows}",
        "data.max_prompt_length=1024",
        "data.max_response_length=1024",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={args.model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={n_rows}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={work / 'agent_loops.yaml'}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"+sandgym.server_url={args.server}",
        "+sandgym.max_turns=4",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        "trainer.logger=[console]",
    ]
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    print(json.dumps({"workdir": str(work), "command": cmd}), flush=True)
    if args.dry_run:
        return 0
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
