"""Validation during training: the mean validation loss over every rank's shard, and rank 0's pictures and audio
(``Training.log_validation``), with the EMA weights when the run keeps them (the weights inference uses)."""

from __future__ import annotations

import contextlib

import torch

from distributed import collective, reduce_tensor, sharded_by_fsdp, unwrap_model
from model import ModelSpec
from utils.checkpoint.sharded import load_dcp
from utils.config import Config
from utils.data.loader import to_device
from utils.run import stop_signals_blocked
from utils.training.setup import Run


def validate_run(run: Run, step: int) -> float:
    """:func:`validate` of the run's model (its one DDP-wrapped network, or the whole model of several phases), under its
    EMA weights when it keeps them."""
    model = run.phases[0].net if len(run.phases) == 1 else run.model
    with run.ema.applied() if run.ema is not None else contextlib.nullcontext():  # the weights inference uses
        return validate(model, run.criterion, run.val_loader, run.dist.device, run.autocast, run.spec, run.prepare,
                        step, run.log.writer, run.output_dir, run.dist.is_main, cfg=run.cfg)


@torch.no_grad()
def validate(model, criterion, loader, device, autocast, spec, prepare, step, writer, output_dir, is_main,
             cfg=None) -> float:
    """Mean validation loss over all ranks' shards (summed then all-reduced); rank 0 draws pictures. ``prepare``: the
    model's ``on_device`` hook (:func:`on_device_hook`) or None."""
    model.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)  # (sum of losses, number of batches)
    with stop_signals_blocked():
        batches = iter(loader)  # starts the workers
    for i, batch in enumerate(batches):
        batch = to_device(batch, device, prepare)
        with autocast():
            outputs = model(batch)
            loss = criterion(outputs, batch)
        total += torch.stack([loss.detach().double(), torch.ones((), device=device, dtype=torch.float64)])
        if i == 0 and spec.training.log_validation is not None:
            plain = whole_model(model, spec, cfg, device, is_main)
            if is_main:
                spec.training.log_validation(plain, batch, outputs, step, writer, output_dir, cfg=cfg)
    total = reduce_tensor(total, op="sum")
    model.train()
    return (total[0] / total[1].clamp(min=1)).item()


def whole_model(model, spec: ModelSpec, cfg: Config, device: torch.device, is_main: bool):
    """The model with all its weights on rank 0, for what rank 0 runs alone (validation pictures and audio): the plain
    module under DDP; under FSDP a copy built from the gathered weights (every rank calls this: the gathering is a
    collective; the other ranks get ``None``). Source:
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True, cpu_offload=True)``."""
    plain = unwrap_model(model)
    if not sharded_by_fsdp(plain):
        return plain
    with collective("gathering of the sharded weights"):
        state_dict = load_dcp().state_dict
        options = state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = state_dict.get_model_state_dict(plain, options=options)
    if not is_main:
        return None
    copy = spec.build_model(cfg)
    copy.load_state_dict(weights)
    return copy.to(device).eval()
