"""Optimizers, LR schedules and precision (autocast, the GradScaler): what the loop steps besides the model; the
``optimizer`` section (:class:`OptimizerConfig`)."""

from __future__ import annotations

import functools
import math
from contextlib import nullcontext
from typing import Callable, Literal, NamedTuple, Optional

import torch
from pydantic import Field

from model import ModelSpec
from utils.checkpoint.state import NamedStates
from utils.config import Config, Section
from utils.errors import TrainingError
from utils.training.criterion import loss_and_terms


class OptimizerConfig(Section):
    """The ``optimizer`` section: every optimizer's learning rate and weight decay (a GAN's two alike), and the LR
    schedule over the run, side by side (fairseq2's optimizer and LR-scheduler sections). ``lr`` and ``weight_decay``
    left null take the model's reference values (``ModelSpec.recipe``: ``utils.training.recipe.apply_recipe``); a model
    that schedules its own rate (``Phases.build_scheduler``) refuses ``schedule`` and ``warmup_steps``."""

    lr: Optional[float] = Field(None, gt=0)  # the learning rate; None: the recipe's
    weight_decay: Optional[float] = Field(None, ge=0)  # Adam's L2 penalty (AdamW's decoupled decay); None: the recipe's
    # constant, or cosine to 1% of lr at train.max_steps, after warmup_steps of linear warm-up from lr / warmup_steps
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)


class Precision(NamedTuple):
    """``train.precision`` as the loop uses it (:func:`setup_precision`)."""

    autocast: Callable  # () -> the context manager a forward pass runs under (bf16/fp16 autocast, or a null context)
    scaler: torch.amp.GradScaler  # scales fp16 losses and unscales their gradients; a pass-through elsewhere


def setup_precision(precision: str, device: torch.device) -> Precision:
    """The :class:`Precision` of ``fp32 | tf32 | bf16 | fp16``: TF32 matmuls and convolutions in every mode but fp32,
    the scaler enabled for fp16 only. Source: PyTorch's AMP recipe (``torch.amp``)."""
    allow_tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = nullcontext if dtype is None else functools.partial(torch.autocast, device_type=device.type, dtype=dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    return Precision(autocast, scaler)


def loss_and_grads(model: torch.nn.Module, criterion: Callable, batch: dict, precision: str,
                   device: torch.device) -> tuple[float, torch.Tensor]:
    """The loss and the flattened float32 gradients ``(n_parameters,)`` (None as zeros) of one forward and backward of
    ``model`` on ``batch`` at ``precision``, seed 0 first: what eager and a fast path are compared by."""
    autocast, _ = setup_precision(precision, device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with autocast():
        loss, _ = loss_and_terms(criterion(model(batch), batch))
    loss.backward()
    grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                       for p in model.parameters()])
    return float(loss.detach()), grads


def lr_lambda(optimizer: OptimizerConfig, total: int) -> Callable[[int], float]:
    """Multiplier of the base learning rate at a step of ``total`` (``train.max_steps``): ``optimizer.warmup_steps`` of
    linear warm-up, then ``optimizer.schedule``, constant or cosine to 1%."""
    warmup, cosine = optimizer.warmup_steps, optimizer.schedule == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cosine:
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0
    return factor


def build_optimizers(spec: ModelSpec, model, cfg: Config, device: torch.device) -> dict:
    """``{phase: optimizer}`` from ``Training.build_optimizer``: ``{"model": optimizer}`` for a one-loss model, one per
    ``Phases.names`` otherwise; a :class:`TrainingError` where it returned something else."""
    built, names = spec.training.build_optimizer(model, cfg, device), spec.phase_names
    if not names:
        if not isinstance(built, torch.optim.Optimizer):
            raise TrainingError(f"model '{spec.name}': build_optimizer returned a {type(built).__name__}, not an "
                                "optimizer; a model with several optimizers names them in Training.phases "
                                "(model.Phases: names, networks and train_step)")
        return {"model": built}
    if not isinstance(built, dict) or set(built) != set(names) or \
            not all(isinstance(opt, torch.optim.Optimizer) for opt in built.values()):
        raise TrainingError(f"model '{spec.name}': build_optimizer must return a dict of one optimizer per phase "
                            f"({', '.join(names)}); it returned {type(built).__name__} "
                            f"{sorted(built) if isinstance(built, dict) else ''}")
    return {phase: built[phase] for phase in names}


def build_scheduler(spec: ModelSpec, phase: str, optimizer, cfg: Config) -> tuple:
    """``(LR scheduler, "step" | "epoch")`` of one optimizer: the model's ``Phases.build_scheduler`` (a
    :class:`TrainingError` where it names another interval), or :func:`lr_lambda` stepped every optimizer step."""
    phases = spec.training.phases
    if phases is None or phases.build_scheduler is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg.optimizer, cfg.train.max_steps)), "step"
    scheduler, interval = phases.build_scheduler(phase, optimizer, cfg)
    if interval not in ("step", "epoch"):
        raise TrainingError(f"model '{spec.name}': build_scheduler for '{phase}' must step per 'step' or 'epoch', "
                            f"not {interval!r}")
    return scheduler, interval


def checkpoint_parts(spec: ModelSpec, optimizers: dict, schedulers: dict, scaler) -> dict:
    """What a checkpoint holds besides the model: optimizer, scheduler (several phases: ``{phase: ...}``), scaler."""
    if not spec.phase_names:
        return {"optimizer": optimizers["model"], "scheduler": schedulers["model"][0], "scaler": scaler}
    return {"optimizer": NamedStates(optimizers),
            "scheduler": NamedStates({phase: scheduler for phase, (scheduler, _) in schedulers.items()}),
            "scaler": scaler}
