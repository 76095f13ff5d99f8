"""Learner throughput against a bare torch loop, and the rollout engine's generation speed.

    python -m lab.bench.learner --out lab/bench/results/learner.json

In one process, on one model and one batch:

- `learner`: `sandgym.trainer.learner.LearnerWorker.train` (world size 1, the trainer's own update:
  collate, PPO-clipped loss over micro-batches, gradient clipping, AdamW step);
- `bare`: a plain torch loop doing the same work by hand: the same model class and weights, the
  same micro-batches, forward, log-softmax of the targets, the policy-gradient loss, backward,
  `clip_grad_norm_`, AdamW step;
- `engine`: `sandgym.trainer.engines` hf engine generating `--gen-tokens` new tokens for a batch of
  prompts (generated tokens per second).

The two training loops alternate step by step (after one warm-up step each), so a change in the
machine's load falls on both; the record has every step's time. Tokens per second count the
batch's real (unpadded) tokens. Old logprobs are the model's own (ratio 1), so no token is
clipped and both loops differentiate the same function.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sandgym.trainer.algorithms import Sample, aggregation_norm, collate, token_logprobs_and_entropy
from sandgym.trainer.config import load_config
from sandgym.trainer.engines import create_engine
from sandgym.trainer.engines.base import SamplingParams
from sandgym.trainer.learner import LearnerWorker
from sandgym.trainer.models import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def make_samples(
    vocab: int, n: int, length: int, seed: int
) -> list[Any]:  # list[sandgym.trainer.algorithms.Sample]
    """`n` sequences of `length` random tokens; the second half carries loss, advantages +-1."""

    rng = random.Random(seed)
    out = []
    for i in range(n):
        ids = [rng.randrange(10, vocab) for _ in range(length)]
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        out.append(Sample(ids, mask, [0.0] * length, 1.0 if i % 2 == 0 else -1.0))
    return out


def set_old_logprobs(model: Any, samples: list[Any], pad: int) -> None:
    """Old logprobs = the model's current ones (ratio 1: nothing clipped)."""
    import torch

    with torch.no_grad():
        for s in samples:
            b = collate([s], pad, torch.device("cpu"))
            lp, _ = token_logprobs_and_entropy(
                model, b["input_ids"], b["attention_mask"], entropy_grad=False
            )
            s.old_logprobs = [float(x) for x in lp[0]]


class BareLoop:
    """The same update written as a plain torch loop."""

    def __init__(self, model: Any, lr: float, weight_decay: float, max_grad_norm: float) -> None:
        import torch

        self.model = model
        self.model.train()
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm

    def step(self, samples: list[Any], micro: int, pad: int) -> float:
        import torch

        norm = float(sum(sum(s.loss_mask) for s in samples))
        self.opt.zero_grad(set_to_none=False)
        total = 0.0
        samples = sorted(samples, key=lambda s: -len(s.input_ids))
        for i in range(0, len(samples), micro):
            chunk = samples[i : i + micro]
            width = max(len(s.input_ids) for s in chunk)
            ids = torch.tensor([s.input_ids + [pad] * (width - len(s.input_ids)) for s in chunk])
            att = torch.tensor(
                [[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in chunk]
            )
            mask = torch.tensor(
                [s.loss_mask + [0] * (width - len(s.loss_mask)) for s in chunk], dtype=torch.float32
            )[:, 1:]
            adv = torch.tensor([s.advantage for s in chunk]).unsqueeze(1)
            logits = self.model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            # d/dθ of the PPO surrogate at ratio 1 equals d/dθ of (A * logp)
            loss = -(adv * lp * mask).sum() / norm
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        return total


def engine_throughput(cfg: Any, n: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    tok = load_tokenizer(cfg.model)
    engine = create_engine(
        "hf",
        model=load_model(cfg.model),
        eos_token_ids=[],  # never stop early: exactly new_tokens per prompt
        pad_token_id=tok.pad_token_id,
        max_batch_size=n,
    )
    rng = random.Random(1)
    prompts = [[rng.randrange(10, len(tok)) for _ in range(prompt_len)] for _ in range(n)]
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    engine.generate([p[:8] for p in prompts[:2]], SamplingParams(max_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    gens = engine.generate(prompts, params)
    wall = time.perf_counter() - t0
    generated = sum(len(g.token_ids) for g in gens)
    return {
        "batch": n,
        "prompt_tokens": prompt_len,
        "generated_tokens": generated,
        "wall_s": wall,
        "generated_tokens_per_s": generated / wall,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    over = [
        f"model.source={args.model}",
        f"learner.micro_batch_size={args.micro_batch}",
        "sampling.temperature=1.0",  # the bare loop takes logprobs at T=1 too
    ]
    cfg = load_config(REPO / "sandgym/trainer/configs/demo.yaml", [*over, *args.override])
    worker = LearnerWorker(cfg.model_dump(mode="json"), 0, 1)
    info = worker.setup("127.0.0.1", 0)
    pad = int(worker.tokenizer.pad_token_id)
    vocab = int(worker.model.config.vocab_size)
    samples = make_samples(vocab, args.batch, args.seq_len, seed=0)
    set_old_logprobs(worker.model, samples, pad)
    bare = BareLoop(
        load_model(cfg.model), cfg.learner.lr, cfg.learner.weight_decay, cfg.learner.max_grad_norm
    )
    tokens = sum(len(s.input_ids) for s in samples)
    norm = aggregation_norm(samples, worker.loss_settings)
    times: dict[str, list[float]] = {"learner": [], "bare": []}
    for step in range(args.steps + 1):  # step 0 warms up both
        for name in ("learner", "bare"):
            t0 = time.perf_counter()
            if name == "learner":
                worker.train(samples, norm)
            else:
                bare.step(samples, args.micro_batch, pad)
            if step > 0:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    record: dict[str, Any] = {
        "model": args.model,
        "params": info["params"],
        "batch": {
            "sequences": args.batch,
            "seq_len": args.seq_len,
            "micro_batch": args.micro_batch,
        },
        "tokens_per_step": tokens,
        "step_s": times,
        "learner_tokens_per_s": tokens / med["learner"],
        "bare_tokens_per_s": tokens / med["bare"],
        "learner_vs_bare": med["bare"] / med["learner"],
        "threads": args.threads,
        "load_average_1m": os.getloadavg()[0],
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "command": "python -m lab.bench.learner " + " ".join(sys.argv[1:]),
    }
    del worker, bare
    record["engine"] = engine_throughput(cfg, args.gen_batch, args.gen_prompt, args.gen_tokens)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="model source (smollm2 or tiny)")
    p.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps of each loop")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--gen-batch", type=int, default=8)
    p.add_argument("--gen-prompt", type=int, default=128)
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--out")
    args = p.parse_args()
    record = run(args)
    text = json.dumps(record, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
