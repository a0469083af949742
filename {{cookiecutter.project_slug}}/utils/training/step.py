"""One training step's mechanics: per phase (one optimizer, its network DDP-wrapped on its own), forward and backward
over the micro-batches, unscaling and clipping; then the schedules."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from contextlib import nullcontext
from typing import Optional

import torch

from distributed import collective, no_sync, split_over_ranks
from utils.training.criterion import loss_and_terms
from utils.training.optim import Precision


@dataclasses.dataclass
class Phase:
    """One optimizer's share of a training step, run over the step's micro-batches: ``"model"`` for a one-loss model, one
    per ``Phases.names`` in order for a model with several (a GAN: the discriminator's, then the generator's)."""

    name: str
    network: torch.nn.Module  # the network this optimizer trains
    wrapped: torch.nn.Module  # the network DDP-wrapped: its gradients are all-reduced during this phase's backward only
    optimizer: torch.optim.Optimizer
    scheduler: object
    interval: str  # "step" or "epoch": when the scheduler steps
    monitors: tuple  # SpikeMonitors of its loss and its gradient norm
    guard: Optional["BufferGuard"]  # takes its buffers back when its update is skipped


@dataclasses.dataclass
class PhaseResult:
    """What one phase measured over the step's micro-batches."""

    loss: torch.Tensor  # device scalar: the mean loss, summed over the micro-batches
    grad_norm: torch.Tensor
    metrics: dict  # named device scalars, summed likewise
    compute_time: float  # seconds in forward passes


class BufferGuard:
    """Takes back what a skipped step did to the model's buffers (BatchNorm's running statistics): :meth:`save` before
    the forward (a few KB), :meth:`restore` on a skip."""

    def __init__(self, model: torch.nn.Module):
        self.buffers = list(model.buffers())
        self.saved: list[torch.Tensor] = []

    def save(self) -> None:
        self.saved = [buffer.detach().clone() for buffer in self.buffers]

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, self.saved):
                buffer.copy_(saved)


def one_loss_step(criterion):
    """The training step of a one-loss model (no :class:`model.Phases`): ``criterion(model(batch), batch)`` as ``(loss,
    {term: scalar})``, its terms none or those it returned (:func:`utils.training.criterion.loss_and_terms`)."""
    def step(phase: str, nets: dict, batch: dict):
        return loss_and_terms(criterion(nets[phase](batch), batch))
    return step


@contextlib.contextmanager
def frozen(modules):
    """Parameters of ``modules`` need no gradient inside the block (their earlier flags come back after it): the other
    phases' networks, so that a phase's backward neither computes nor all-reduces their gradients."""
    flags = [(param, param.requires_grad) for module in modules for param in module.parameters()]
    for param, _ in flags:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in flags:
            param.requires_grad_(flag)


def forward_backward(phase: Phase, phases: list, step_fn, micro: list, precision: Precision,
                     grad_clip: Optional[float]) -> PhaseResult:
    """One phase over the step's micro-batches: ``step_fn(phase, nets, batch) -> (loss, {name: scalar})`` forward and
    backward on each, the gradients all-reduced in the last backward only, then unscaling and clipping to ``grad_clip``
    (0 or None: none). The other phases' networks come unwrapped and frozen; fp16 losses share the step's one
    GradScaler (PyTorch's AMP recipe for several optimizers)."""
    device = micro[0][next(k for k, v in micro[0].items() if torch.is_tensor(v))].device
    # CPU seconds on the CPU (ranks sharing cores wait in turns, which is not slower computing), for the straggler check
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    loss_sum, metric_sums, compute_time = torch.zeros((), device=device), {}, 0.0
    nets = {other.name: other.wrapped if other is phase else other.network for other in phases}
    # What a failed collective is named by: the forward talks too (DDP's bucket rebuild and buffer broadcasts).
    forward, backward = (("forward (weight all-gather)", "gradient reduce-scatter (backward)")
                         if split_over_ranks(phase.wrapped) else
                         ("DDP forward (bucket rebuild, buffer broadcast)", "gradient all-reduce (DDP backward)"))
    with frozen([other.network for other in phases if other is not phase]):
        for i, batch in enumerate(micro):
            with no_sync(phase.wrapped) if i < len(micro) - 1 else nullcontext():
                t_compute = clock()
                with collective(forward), precision.autocast():
                    loss, metrics = step_fn(phase.name, nets, batch)
                    loss = loss / len(micro)
                compute_time += clock() - t_compute  # on a GPU: launch time, unless something syncs
                with collective(backward):
                    precision.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
            for name, value in metrics.items():
                metric_sums[name] = metric_sums.get(name, 0.0) + value.detach().float() / len(micro)
    precision.scaler.unscale_(phase.optimizer)  # no-op unless fp16: clipping and the norm need the true gradients
    with collective("gradient norm"):  # split over the ranks: a DTensor, the norm of every rank's shard
        grad_norm = torch.nn.utils.clip_grad_norm_(phase.network.parameters(), grad_clip or math.inf)
        grad_norm = grad_norm.full_tensor() if split_over_ranks(grad_norm) else grad_norm
    return PhaseResult(loss_sum, grad_norm, metric_sums, compute_time)


def step_schedulers(phases: list[Phase], applied: dict, epochs_seen: int, epochs_done: int) -> int:
    """Each phase's scheduler steps per applied update (``"step"``) or per epoch ended in this step (``"epoch"``).
    Returns the epochs now seen."""
    for phase in phases:
        if phase.interval == "step" and applied[phase.name]:
            phase.scheduler.step()
        for _ in range(epochs_done - epochs_seen if phase.interval == "epoch" else 0):
            phase.scheduler.step()  # an epoch ended in this step
    return epochs_done
