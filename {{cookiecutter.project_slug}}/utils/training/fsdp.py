"""Sharded training: FSDP2 (``train.parallelism=fsdp``) and activation checkpointing, their ``train`` settings and the
settings refused with them. Sources: https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html and
torchtitan's per-block ``fully_shard``."""

from __future__ import annotations

from typing import Any, Callable, Literal, Optional, Sequence

import torch
import torch.distributed as dist
from pydantic import Field
from torch import nn

from distributed import collective, get_world_size, split_over_ranks
from model import ModelSpec
from utils.checkpoint.sharded import broadcast_buffers, load_dcp
from utils.config import Config, ConfigError, Section
from utils.training.activation_checkpoint import apply_activation_checkpointing


class ShardingSettings(Section):
    """The ``train`` keys of sharded training, part of ``TrainConfig``."""

    # ddp: every rank holds the whole model, gradients and optimizer state; fsdp (FSDP2): each rank 1/world_size of
    # them, sharded per block of Training.blocks, and writes sharded checkpoints
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    reshard_after_forward: bool = True  # fsdp: free a block's gathered weights after its forward
    # none; full: every block of Training.blocks recomputes its forward in the backward instead of keeping its
    # activations; selective: every activation_checkpointing_every-th block
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    activation_checkpointing_every: int = Field(2, ge=1)
    async_checkpoint: bool = False  # fsdp: copy to host memory, write in the background while training goes on

    @property
    def sharded(self) -> bool:
        """Whether the run shards its model and writes sharded checkpoints (``parallelism=fsdp``)."""
        return self.parallelism == "fsdp"


def check_activation_checkpointing(spec: ModelSpec, cfg: Config) -> None:
    """Refuse activation checkpointing of a model without ``Training.blocks``, and an interval without ``selective``: a
    ConfigError naming the setting."""
    train, defaults = cfg.train, ShardingSettings()
    if train.activation_checkpointing != "none" and spec.training.blocks is None:
        raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{spec.name}' "
                          "names no blocks to checkpoint (Training.blocks)")
    if train.activation_checkpointing != "selective" and \
            train.activation_checkpointing_every != defaults.activation_checkpointing_every:
        raise ConfigError(f"train.activation_checkpointing_every={train.activation_checkpointing_every} applies to "
                          "train.activation_checkpointing=selective only (it is "
                          f"{train.activation_checkpointing})")


def check_parallelism(spec: ModelSpec, cfg: Config) -> None:
    """Refuse FSDP's settings without FSDP, and FSDP with several optimizers, fp16 or ``train.compile``: a ConfigError
    naming the setting and what to do instead."""
    train, defaults = cfg.train, ShardingSettings()
    if train.parallelism != "fsdp":
        for key, meaning in (("async_checkpoint", "writes sharded checkpoints in the background"),
                             ("reshard_after_forward", "frees a block's gathered weights after its forward")):
            if getattr(train, key) != getattr(defaults, key):
                raise ConfigError(f"train.{key}={str(getattr(train, key)).lower()} does nothing with "
                                  f"train.parallelism={train.parallelism}: it {meaning} under "
                                  "train.parallelism=fsdp only")
        return
    if spec.phase_names:
        raise ConfigError(f"train.parallelism=fsdp with model '{spec.name}', which trains several optimizers "
                          f"({', '.join(spec.phase_names)}): not supported yet (sharded per block, the network frozen "
                          "in the other phase's backward gives other losses than DDP); use train.parallelism=ddp")
    if train.precision == "fp16":
        raise ConfigError("train.precision=fp16 with train.parallelism=fsdp: FSDP2 mixed precision is bf16 "
                          "(set train.precision=bf16; fp16's loss scaling would need one verdict over every shard)")
    if train.compile:
        raise ConfigError("train.compile=true with train.parallelism=fsdp: the models' fast paths compile the "
                          "whole model, which FSDP's per-block hooks break; use one of the two")


def prepare_model(spec: ModelSpec, model: nn.Module, train: Any,
                  networks: Callable[[], dict[str, nn.Module]]) -> None:
    """Activation checkpointing of ``Training.blocks``, then FSDP sharding of each phase's network (``networks()``:
    ``{phase: network}``) block by block, then its root (torchtitan's order), in place, before the optimizers exist,
    as the ``train`` section (:class:`ShardingSettings`' keys and ``precision``) says. Raises ConfigError for activation
    checkpointing of a model whose ``Training.blocks`` returns no block."""
    blocks = list(spec.training.blocks(model)) if spec.training.blocks is not None else []
    if train.activation_checkpointing != "none":
        if not blocks:
            raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{spec.name}' "
                              "names no blocks to checkpoint (Training.blocks)")
        apply_activation_checkpointing(blocks, train.activation_checkpointing, train.activation_checkpointing_every)
    if train.parallelism != "fsdp":
        return
    param_dtype = torch.bfloat16 if train.precision == "bf16" else None
    for net in networks().values():
        inside = {id(module) for module in net.modules()}
        shard_model(net, blocks=[block for block in blocks if id(block) in inside], param_dtype=param_dtype,
                    reshard_after_forward=train.reshard_after_forward)


def shard_model(model: nn.Module, blocks: Sequence[nn.Module] = (), param_dtype: Optional[torch.dtype] = None,
                reshard_after_forward: bool = True) -> nn.Module:
    """FSDP2's ``fully_shard`` on each of ``blocks`` (sub-modules of ``model`` in forward order), then on ``model``, in
    place: each rank keeps ``1 / world_size`` of every parameter, gradient and optimizer state; a block's full
    parameters exist while it runs (``reshard_after_forward=False``: until its backward); after ``backward()`` each rank
    holds its shard of the gradient of the mean loss over all ranks. ``param_dtype`` (e.g. bf16) computes in that dtype
    with fp32 master weights, reduction and outputs. Rank 0's weights are broadcast first, its buffers before every
    forward, as DDP does. Returns ``model`` (unchanged with world size 1 or when sharded already); a ValueError for a
    block that is not part of ``model``."""
    if split_over_ranks(model) or get_world_size() == 1:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # costly: distributed.split_over_ranks
    inside = {id(module) for module in model.modules()}
    if stray := [type(block).__name__ for block in blocks if id(block) not in inside]:
        raise ValueError(f"shard_model: blocks not inside the model: {', '.join(stray)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    _broadcast_initial_weights(model)
    mesh = dist.device_mesh.init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                  output_dtype=torch.float32 if param_dtype is not None else None)
    if param_dtype is not None:
        # BatchNorm keeps fp32 weights beside its fp32 running statistics (bf16 weights with them do not run).
        full = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                fully_shard(module, mesh=mesh, mp_policy=full, reshard_after_forward=reshard_after_forward)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # With blocks, the root keeps its gathered parameters after forward: the backward would regather them at once.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and not blocks)
    if any(True for _ in model.buffers()):  # BatchNorm's running statistics: rank 0's, as DDP's broadcast_buffers
        model.register_forward_pre_hook(lambda module, args: broadcast_buffers(module))
    return model


def _broadcast_initial_weights(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank, made contiguous first (as DDP at construction)."""
    with collective("broadcast of rank 0's initial weights"), torch.no_grad():
        for param in model.parameters():
            if not param.is_contiguous():  # e.g. a transposed QR factor; FSDP shards along dim 0 of a dense layout
                param.data = param.data.contiguous()
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)


def gathered_model(plain: nn.Module, spec: ModelSpec, cfg: Config, device: torch.device,
                   is_main: bool) -> Optional[nn.Module]:
    """A copy of the sharded ``plain`` from its gathered weights on rank 0, ``None`` on the others (every rank calls
    it). Source: DCP's ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``."""
    with collective("gathering of the sharded weights"):
        state_dict = load_dcp().state_dict
        options = state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = state_dict.get_model_state_dict(plain, options=options)
    if not is_main:
        return None
    copy = spec.build_model(cfg)
    copy.load_state_dict(weights)
    return copy.to(device).eval()
