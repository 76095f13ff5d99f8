"""FSDP2 sharding of the policy (`learner.strategy: fsdp`), torch-only helpers.

The learner's `fsdp` strategy shards every transformer block, then the root module (embeddings,
final norm, LM head), with torch's FSDP2 `fully_shard`: each rank keeps 1/world_size of every
parameter (a `DTensor` sharded on dim 0), its gradient and, because the optimizer is built over
those DTensors, its AdamW moments. A forward all-gathers one block at a time and frees it again;
backward reduce-scatters each block's gradients. Nothing here keeps a full replica: full weights
exist only transiently on rank 0's CPU when `load_sharded_model` loads the policy (the other
ranks build it on the meta device and receive only their shards). Weights for the rollout
engines are gathered one tensor at a time and written to files (`write_full_weights`), so rank 0
never holds more than one file's worth.

This module imports nothing but torch (and transformers' models are duck-typed), so that
`scripts/gpu_fsdp_check.py` can use it on a machine without Ray or pydantic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sandgym.trainer.engines.weight_files import write_weights


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks: modules whose class the model lists as `_no_split_modules`
    (LlamaDecoderLayer, Qwen2DecoderLayer, ...), else `model.model.layers`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        inner = getattr(model, "model", None)
        blocks = list(getattr(inner, "layers", []) or [])
    if not blocks:
        raise ValueError(f"cannot find the transformer blocks of {type(model).__name__} to shard")
    return blocks


def shard_model(
    model: Any, device_type: str = "cpu", mixed_precision: bool = False, frozen: bool = False
) -> Any:
    """Apply FSDP2 to `model` in place: one `fully_shard` per block plus the root.

    The process group must already be initialised. Gradients are reduced with SUM (divide factor
    1): the learner's loss is already divided by the *global* normalizer, so the ranks'
    gradients add up to the single-process gradient, as with the replicate strategy.
    `mixed_precision` (GPU): blocks compute in bf16 (all-gathers move bf16), gradients are
    reduced in fp32, master weights and AdamW state stay fp32. `frozen` (a reference model that
    only runs forwards): the root reshards after its forward too (by default FSDP2 keeps the
    root's parameters gathered until backward, which a frozen model never runs)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    for block in decoder_layers(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs, reshard_after_forward=True if frozen else None)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            # a plain SUM collective (gloo has no PREMUL_SUM; NCCL's SUM is zero-copy); older
            # torch (before 2.8) lacks the switch and uses PREMUL_SUM(1), which NCCL has
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)
    return model


def local_tensor(t: Any) -> Any:
    """This rank's part of `t` (a DTensor's local shard; a plain tensor itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def local_numel(model: Any) -> int:
    """Parameter elements held by this rank (tied parameters counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += local_tensor(p).numel()
    return total


def optimizer_local_numel(optimizer: Any) -> int:
    """Optimizer-state elements (AdamW moments) held by this rank."""
    total = 0
    for state in optimizer.state.values():
        for v in state.values():
            if hasattr(v, "numel") and getattr(v, "dim", lambda: 0)() > 0:
                total += local_tensor(v).numel()
    return total


def full_state_dict(model: Any) -> dict[str, Any]:
    """The full weights on rank 0's CPU (an empty dict on other ranks). Every rank must call it
    (the shards are all-gathered one parameter at a time and offloaded to CPU)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def write_full_weights(
    model: Any, out_dir: str, max_shard_bytes: int = 256 * 1024 * 1024
) -> dict[str, int] | None:
    """The full weights written by rank 0 as a safetensors directory (sandgym/trainer/engines/
    weight_files.py), gathered one tensor at a time: rank 0 holds at most one shard of
    `max_shard_bytes` plus the tensor being gathered, whatever the model's size (the rollout
    engines read the directory: a shared filesystem across nodes). Every rank must call it
    (each tensor's all-gather is a collective); rank 0 returns the writer's counts, the others
    None. Replaces `full_state_dict` for weight pushes, which held every tensor at once."""
    import torch.distributed as dist

    state = model.state_dict()  # this rank's shards (DTensors): nothing gathered yet
    rank0 = dist.get_rank() == 0

    def gathered() -> Any:
        for name, t in state.items():
            whole = full(t.detach())
            if rank0:
                yield name, whole.to("cpu")
            del whole

    if rank0:
        return write_weights(gathered(), out_dir, max_shard_bytes)
    for _ in gathered():
        pass
    return None


def save_sharded(model: Any, optimizer: Any, path: str) -> None:
    """Each rank writes its own shards of the weights and the optimizer state (torch.distributed
    .checkpoint); no rank gathers anything. Every rank must call it; `path` must be one
    directory every rank can reach (a shared filesystem across nodes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def load_sharded(model: Any, optimizer: Any, path: str) -> None:
    """Read a `save_sharded` checkpoint into this rank's shards (DCP reshards if the world size
    changed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


def full(t: Any) -> Any:
    """The whole tensor: a DTensor all-gathered (a collective: every rank must call it), a plain
    tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def load_sharded_model(
    load_full: Callable[[], Any], device: Any, mixed_precision: bool = False, frozen: bool = False
) -> Any:
    """The policy, sharded, without a full copy on every rank: rank 0 runs `load_full()` (the
    model on CPU); the other ranks build the same architecture on the meta device from rank 0's
    config (no memory); all shard it, allocate their shards on `device`, and rank 0's weights
    are broadcast into them one tensor at a time (`set_model_state_dict(broadcast_from_rank0)`).
    Buffers outside the state dict (rotary frequencies) are broadcast from rank 0 as well."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoModelForCausalLM

    rank = dist.get_rank()
    full = load_full() if rank == 0 else None
    box: list[Any] = [(full.config, next(full.parameters()).dtype) if full is not None else None]
    dist.broadcast_object_list(box, src=0)
    config, dtype = box[0]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    shard_model(model, device.type, mixed_precision=mixed_precision, frozen=frozen)
    model.to_empty(device=device)
    set_model_state_dict(
        model,
        full.state_dict() if full is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    source = dict(full.named_buffers()) if full is not None else {}
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if full is not None:
                buf.copy_(source[name].to(buf.device))
            dist.broadcast(buf, src=0)
    del full, source
    return model
