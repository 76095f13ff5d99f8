"""The learner's update step on one rank, as one function: micro-batches, the loss, the gradient
sync, clipping and the optimizer step. `LearnerWorker.train` (sandgym/trainer/learner.py) calls it, and
so does the GPU check (`scripts/gpu_fsdp_check.py`), which therefore measures the trainer's own
step, not a copy of it. torch only (no Ray, no pydantic): the GPU machine has neither.

Steps, for `epochs` optimizer steps over this rank's `samples`:

1. collate the samples (longest first) into micro-batches of `micro_batch_size`, once: the first
   epoch's pass stores the learner's pre-update logprobs in each (compute_loss), which later
   epochs reuse as the TIS / mismatch reference;
2. under fsdp, pad to `num_micro_batches` with zero-loss fillers: every forward/backward is a
   collective all ranks must join;
3. forward/backward each micro-batch under bf16 autocast on GPU (fsdp: each backward
   reduce-scatters its gradients into the sharded .grad);
4. replicate with several ranks: one all-reduce (SUM) of the flattened gradients;
5. global-norm clipping, then the optimizer step (none when `norm` is 0: an empty global batch).
"""

from __future__ import annotations

from typing import Any

from sandgym.trainer import sharding
from sandgym.trainer.algorithms import LossSettings, Sample, collate, compute_loss, merge_stats


def update_step(
    model: Any,
    optimizer: Any,
    samples: list[Sample],
    norm: float,
    settings: LossSettings,
    *,
    pad_id: int,
    device: Any,
    micro_batch_size: int,
    max_grad_norm: float,
    epochs: int = 1,
    world_size: int = 1,
    fsdp: bool = False,
    num_micro_batches: int = 0,
    ref_model: Any = None,
) -> dict[str, float]:
    """One batch on this rank (see the module docstring). `norm` is the global loss normalizer
    (0: the whole batch is empty, no optimizer step). Returns the summed statistics with
    `loss_sum` and `grad_norm` (of the last epoch)."""
    import torch
    import torch.distributed as dist

    totals: dict[str, float] = {}
    mb = micro_batch_size
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if torch.device(device).type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    # longest first: micro-batches of similar length waste less padding
    samples = sorted(samples, key=lambda s: -len(s.input_ids))
    batches = [collate(samples[i : i + mb], pad_id, device) for i in range(0, len(samples), mb)]
    real = len(batches)
    if fsdp and norm > 0:
        filler = Sample([pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0)
        batches += [collate([filler], pad_id, device) for _ in range(num_micro_batches - real)]
    for _epoch in range(epochs):
        optimizer.zero_grad(set_to_none=False)
        for i, batch in enumerate(batches):
            # fsdp: each backward reduce-scatters its gradients into the sharded .grad (sums
            # across micro-batches); holding them unsharded until the last one would cost a
            # full gradient's memory
            with autocast:
                loss, stats = compute_loss(model, batch, settings, norm, ref_model)
            if i >= real:  # a filler: joins the collectives, adds nothing
                loss = loss * 0.0
            else:
                merge_stats(totals, stats)
                totals["loss_sum"] = totals.get("loss_sum", 0.0) + float(loss.detach())
            loss.backward()
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if world_size > 1 and not fsdp:
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n
            del flat
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if norm > 0:
            optimizer.step()
        # else: the global batch is empty; stepping on zero gradients would still move the
        # weights through Adam's momentum, so only the version advances
        totals["grad_norm"] = float(sharding.full(grad_norm))
    return totals
