"""The learner: data-parallel torch workers (Ray actors) that turn samples into updates.

Two strategies (`learner.strategy`):

- `replicate` (default): each `LearnerWorker` holds a full copy of the policy and its AdamW state;
  gradients are all-reduced by hand once per step.
- `fsdp`: the policy is sharded with torch FSDP2 (`sandgym/trainer/sharding.py`: `fully_shard` per
  transformer block, then the root). Each worker holds 1/N of every parameter, of its gradient
  and of the AdamW moments; forward/backward all-gather a block at a time and reduce-scatter its
  gradients. This is the strategy for models larger than one worker's memory.

A step (`train`), the same for both:

1. every worker gets a shard of the batch's samples and the batch's *global* loss normalizer
   (see `algorithms.aggregation_norm`), so shard losses add up to the single-worker loss;
2. it runs forward/backward over micro-batches, accumulating gradients (under fsdp every worker
   runs the same number of micro-batches, padded with zero-loss ones, because each forward and
   backward is a collective);
3. gradient sync (SUM): replicate all-reduces the flattened gradients once over
   torch.distributed (gloo on CPU, NCCL on GPU); fsdp reduce-scatters each micro-batch's
   gradients during its backward into the sharded gradients (no full gradient is ever held);
   then gradient clipping (global norm) and an optimizer step on what each worker holds.

On GPU the forward runs under bf16 autocast (master weights stay fp32; fsdp also all-gathers in
bf16). Checkpoints: replicate writes a HF checkpoint + optimizer from rank 0; fsdp writes a
sharded torch.distributed.checkpoint (each rank its own shards, `dcp/`) plus the config and
tokenizer. `LearnerGroup` is the driver-side handle: it starts the actors, wires the process
group, shards batches, and hands full weights (with their version) to the rollout engines:
rank 0's replica, or under fsdp the shards gathered into rank 0's CPU memory for that push only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from sandgym.trainer import sharding
from sandgym.trainer.algorithms import (
    LossSettings,
    Sample,
    aggregation_norm,
    merge_stats,
)
from sandgym.trainer.config import TrainConfig
from sandgym.trainer.engines.weight_files import load_weights
from sandgym.trainer.lora import adapter_state_dict, apply_lora, load_adapter_state
from sandgym.trainer.models import load_model, load_tokenizer
from sandgym.trainer.priority import normal_priority
from sandgym.trainer.update import update_step

log = logging.getLogger(__name__)


def loss_settings(cfg: TrainConfig) -> LossSettings:
    a = cfg.algorithm
    return LossSettings(
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        kl_coef=a.kl_coef,
        entropy_coef=a.entropy_coef,
        aggregation=a.loss_aggregation,
        max_tokens=a.max_tokens_norm,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        top_k=cfg.sampling.top_k,
        tis=cfg.tis_enabled,
        tis_cap=a.tis_cap,
        engine_logprobs=cfg.engine.logprobs,
    )


class LearnerWorker:
    """One data-parallel rank (a Ray actor; also usable in-process with world_size 1)."""

    def __init__(self, config_dict: dict[str, Any], rank: int, world_size: int) -> None:
        normal_priority()  # not Ray's nice 15 (sandgym/trainer/priority.py)
        self.config = TrainConfig.model_validate(config_dict)
        self.rank = rank
        self.world_size = world_size
        self.version = 0
        self.model: Any = None

    def address(self) -> tuple[str, int]:
        """Host and a free port for the process group's rendezvous (asked of rank 0)."""
        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception as exc:  # fine on one node; on several the rendezvous cannot work
            log.warning("no node address from ray (%r): rendezvous on 127.0.0.1", exc)
            host = "127.0.0.1"
        with socket.socket() as s:
            s.bind(("", 0))
            return host, int(s.getsockname()[1])

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        cfg = self.config
        self.device = torch.device(
            f"cuda:{torch.cuda.current_device()}" if cfg.learner.device == "cuda" else "cpu"
        )
        self.fsdp = cfg.learner.strategy == "fsdp"
        if self.world_size > 1 or self.fsdp:
            dist.init_process_group(
                backend="nccl" if cfg.learner.device == "cuda" else "gloo",
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
            )
        torch.manual_seed(cfg.run.seed)
        self.tokenizer = load_tokenizer(cfg.model)
        if self.fsdp:
            # rank 0 loads the weights on CPU, the others build the model on the meta device;
            # each rank allocates only its shards on the device, filled from rank 0's copy
            self.model = sharding.load_sharded_model(
                lambda: load_model(cfg.model), self.device, self.device.type == "cuda"
            )
            if cfg.learner.gradient_checkpointing:
                self.model.gradient_checkpointing_enable()
        else:
            self.model = load_model(cfg.model).to(self.device)
        full_params = sum(p.numel() for p in self.model.parameters())
        if (
            cfg.learner.lora_rank > 0
        ):  # adapters only: base weights frozen (sandgym/trainer/lora.py)
            self.model = apply_lora(self.model, cfg.learner)
        if cfg.learner.gradient_checkpointing and not self.fsdp:
            self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref_model = None
        if cfg.algorithm.kl_coef > 0:
            self.ref_model = (
                sharding.load_sharded_model(lambda: load_model(cfg.model), self.device, frozen=True)
                if self.fsdp
                else load_model(cfg.model).to(self.device)
            ).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=cfg.learner.lr,
            weight_decay=cfg.learner.weight_decay,
        )
        if self.world_size > 1 and not self.fsdp:
            # identical start even if initialisation differed somewhere
            for p in self.model.parameters():
                dist.broadcast(p.data, src=0)
        self.loss_settings = loss_settings(cfg)
        return {
            "rank": self.rank,
            "params": full_params,
            "local_params": sharding.local_numel(self.model),
        }

    def shard_info(self) -> dict[str, int]:
        """Elements this rank holds vs the full model: parameters, gradients, optimizer state."""
        import torch

        params = list(self.model.parameters())
        return {
            "rank": self.rank,
            "full_params": sum(p.numel() for p in params),
            "local_params": sharding.local_numel(self.model),
            "local_grads": sum(
                sharding.local_tensor(p.grad).numel() for p in params if p.grad is not None
            ),
            "full_optimizer": sum(
                v.numel()
                for st in self.optimizer.state.values()
                for v in st.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0
            ),
            "local_optimizer": sharding.optimizer_local_numel(self.optimizer),
        }

    # -- the update step ---------------------------------------------------------------------
    def train(
        self, samples: list[Sample], norm: float, num_micro_batches: int = 0
    ) -> dict[str, float]:
        """One batch: `epochs_per_batch` optimizer steps over this rank's shard (`norm` is the
        global loss normalizer; 0 means the whole batch is empty and no step is taken).
        Under fsdp, `num_micro_batches` (the most any rank has) pads this rank's micro-batches
        with zero-loss ones: every forward/backward is a collective all ranks must join. The
        step itself is `sandgym.trainer.update.update_step` (the GPU check runs the same function)."""

        cfg = self.config.learner
        totals = update_step(
            self.model,
            self.optimizer,
            samples,
            norm,
            self.loss_settings,
            pad_id=int(self.tokenizer.pad_token_id),
            device=self.device,
            micro_batch_size=cfg.micro_batch_size,
            max_grad_norm=cfg.max_grad_norm,
            epochs=cfg.epochs_per_batch,
            world_size=self.world_size,
            fsdp=self.fsdp,
            num_micro_batches=num_micro_batches,
            ref_model=self.ref_model,
        )
        self.version += 1
        totals["version"] = float(self.version)
        return totals

    # -- weights, checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What rollout engines load: the full weights, or the adapters alone under LoRA.
        Under fsdp every rank must call it: the shards are gathered into rank 0's CPU memory
        (the other ranks return {})."""
        if self.config.learner.lora_rank > 0:
            return adapter_state_dict(self.model)
        if self.fsdp:
            return sharding.full_state_dict(self.model)
        return {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}

    def push_weights(self, out_dir: str) -> str | None:
        """fsdp: the full weights written to `out_dir` as safetensors files, gathered one tensor
        at a time (`sharding.write_full_weights`: rank 0 never holds the whole model; measured
        by scripts/fsdp_push_memory.py). Every rank must call it; rank 0 returns the path."""
        info = sharding.write_full_weights(self.model, out_dir)
        return out_dir if info is not None else None

    def weights_checksum(self) -> list[float]:
        """Per-parameter sums (float64) of the full weights, for tests that compare replicas
        (under fsdp every rank must call it)."""
        return [float(sharding.full(p.detach()).double().sum()) for p in self.model.parameters()]

    def save_checkpoint(self, path: str) -> str:
        import torch

        out = Path(path)
        if self.fsdp:
            return self._save_sharded(out)
        if self.rank == 0:
            tmp = out.with_name(out.name + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "version": self.version},
                tmp / "trainer_state.pt",
            )
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
            (out.parent / "latest.json").write_text(
                json.dumps({"path": str(out), "version": self.version})
            )
        return str(out)

    def load_checkpoint(self, path: str) -> int:
        import torch
        from safetensors.torch import load_file

        p = Path(path)
        sharded = (p / "dcp").is_dir()
        if sharded != self.fsdp:
            raise RuntimeError(
                f"checkpoint {p} was written by learner.strategy "
                f"{'fsdp' if sharded else 'replicate'}; this run uses {self.config.learner.strategy}"
            )
        if self.fsdp:
            sharding.load_sharded(self.model, self.optimizer, str(p / "dcp"))
            self.version = int(json.loads((p / "trainer_state.json").read_text())["version"])
            return self.version
        if self.config.learner.lora_rank > 0:  # peft's save_pretrained wrote the adapter alone
            load_adapter_state(self.model, load_file(str(p / "adapter_model.safetensors")))
            state = torch.load(p / "trainer_state.pt", map_location=self.device, weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.version = int(state["version"])
            return self.version
        # save_pretrained shards a large model (model-0000K-of-0000N + index): read either form

        weights = load_weights(p)
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        # tied embeddings are saved once; anything else missing is a real mismatch
        missing = [m for m in missing if "lm_head" not in m]
        if missing or unexpected:
            raise RuntimeError(
                f"checkpoint {p} does not fit the model: missing {missing}, unexpected {unexpected}"
            )
        state = torch.load(p / "trainer_state.pt", map_location=self.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        return self.version

    def _save_sharded(self, out: Path) -> str:
        """fsdp: every rank writes its own shards of weights and AdamW state into `dcp/`
        (torch.distributed.checkpoint; a shared filesystem across nodes); rank 0 adds the model
        config, tokenizer and version, then publishes the directory atomically."""
        import torch.distributed as dist

        tmp = out.with_name(out.name + ".tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        sharding.save_sharded(self.model, self.optimizer, str(tmp / "dcp"))
        if self.rank == 0:
            self.model.config.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            (tmp / "trainer_state.json").write_text(
                json.dumps({"version": self.version, "strategy": "fsdp"})
            )
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
            (out.parent / "latest.json").write_text(
                json.dumps({"path": str(out), "version": self.version})
            )
        dist.barrier()
        return str(out)


def latest_checkpoint(run_dir: Path) -> tuple[str, int] | None:
    f = Path(run_dir) / "checkpoints" / "latest.json"
    if not f.exists():
        return None
    data = json.loads(f.read_text())
    return str(data["path"]), int(data["version"])


def shard_samples(samples: list[Sample], world_size: int) -> list[list[Sample]]:
    """Balance shards by token count (greedy, longest first)."""
    shards: list[list[Sample]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for s in sorted(samples, key=lambda s: -len(s.input_ids)):
        i = loads.index(min(loads))
        shards[i].append(s)
        loads[i] += len(s.input_ids)
    return shards


class LearnerGroup:
    """Driver-side handle on the data-parallel learner actors."""

    def __init__(self, config: TrainConfig) -> None:
        import ray

        self.config = config
        n = config.learner.num_workers
        gpus = 1 if config.learner.device == "cuda" else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpus)(LearnerWorker)
        cfg = config.model_dump()
        self.workers: list[Any] = [actor.remote(cfg, rank, n) for rank in range(n)]
        addr, port = ray.get(self.workers[0].address.remote())
        self.info = ray.get([w.setup.remote(addr, port) for w in self.workers])
        self.loss_settings = loss_settings(config)
        self.version = 0

    def train(self, samples: list[Sample]) -> dict[str, float]:
        import ray

        # norm 0 tells the workers the global batch is empty (no optimizer step)
        norm = aggregation_norm(samples, self.loss_settings) if samples else 0.0
        shards = shard_samples(samples, len(self.workers))
        mb = self.config.learner.micro_batch_size
        n_mb = max(-(-len(s) // mb) for s in shards)
        results = ray.get(
            [
                w.train.remote(shard, norm, n_mb)
                for w, shard in zip(self.workers, shards, strict=True)
            ]
        )
        out: dict[str, float] = {}
        for r in results:
            merge_stats(out, r)
        out["grad_norm"] = results[0]["grad_norm"]
        out["version"] = results[0]["version"]
        self.version = int(results[0]["version"])
        return out

    def state_dict_ref(self, weights_dir: str | None = None) -> Any:
        """An object ref to what rollout workers load: rank 0's full weights (replicate, LoRA
        adapters), or under fsdp the path of a safetensors directory every rank wrote into
        (gathered one tensor at a time; `weights_dir`, default a temporary directory, must be
        readable by the rollout workers: a shared filesystem across nodes)."""
        if self.config.learner.strategy == "fsdp" and self.config.learner.lora_rank == 0:
            if weights_dir is None:
                import tempfile

                weights_dir = tempfile.mkdtemp(prefix="sandgym-push-") + "/weights"
            return [w.push_weights.remote(weights_dir) for w in self.workers][0]
        if self.config.learner.strategy == "fsdp":
            return [w.state_dict.remote() for w in self.workers][0]
        return self.workers[0].state_dict.remote()

    def shard_info(self) -> list[dict[str, int]]:
        import ray

        return ray.get([w.shard_info.remote() for w in self.workers])

    def checksums(self) -> list[list[float]]:
        import ray

        return ray.get([w.weights_checksum.remote() for w in self.workers])

    def save(self, path: str) -> None:
        import ray

        ray.get([w.save_checkpoint.remote(path) for w in self.workers])

    def load(self, path: str) -> int:
        import ray

        versions = ray.get([w.load_checkpoint.remote(path) for w in self.workers])
        self.version = int(versions[0])
        return self.version

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
