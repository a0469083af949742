"""One training step's mechanics beyond the loop's lines: the phases (one per optimizer), forward and backward over the
accumulated micro-batches with the gradient all-reduce on the last one, unscaling and clipping.

A one-loss model has one phase, ``"model"``; a model with several optimizers (:class:`model.Phases`: a GAN's
discriminator, then generator) has one per optimizer, each over the same micro-batches, its network wrapped for the
all-reduce on its own (DDP) so that a phase's backward all-reduces no other network's gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from contextlib import nullcontext
from typing import Callable, Optional

import torch

from distributed import collective, full_value, no_sync


@dataclasses.dataclass
class Phase:
    """One optimizer's share of a training step. A one-loss model has one phase, ``"model"``; a model with several
    optimizers (:class:`model.Phases`) has one per optimizer, run in order (a GAN: the discriminator's, then the
    generator's), each over the same micro-batches.

    Attributes:
        name: the optimizer's name (``Phases.names``), or ``"model"``.
        plain: the network this optimizer trains, unwrapped.
        net: ``plain`` wrapped by :func:`distributed.apply_gradient_allreduce` (DDP: its gradients are all-reduced
            during this phase's backward only).
        optimizer, scheduler: its optimizer and LR scheduler; ``interval``: ``"step"`` or ``"epoch"``, when the
            scheduler steps.
        monitors: spike monitors of its loss and its gradient norm (:class:`utils.training.guards.SpikeMonitor`).
        guard: takes back its buffers when its update is skipped (:class:`BufferGuard`), or ``None``.
    """

    name: str
    plain: torch.nn.Module
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    interval: str
    monitors: tuple
    guard: Optional["BufferGuard"]


@dataclasses.dataclass
class PhaseResult:
    """What one phase measured over the step's micro-batches: its loss summed over them (a device scalar, of the mean
    loss), the gradient norm of its network, its named metrics (device scalars, summed likewise) and the seconds spent
    in forward passes."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    metrics: dict
    compute_time: float


class BufferGuard:
    """Takes back what a skipped step did to the model's buffers (BatchNorm's running statistics and batch count): a
    skipped step leaves the model exactly as it was, not only its weights.

    :meth:`save` before the step's forward (one copy of every buffer: a few kilobytes for BatchNorm), :meth:`restore`
    when the step is skipped. Without buffers both do nothing.
    """

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
    """The training step of a one-loss model (no :class:`model.Phases`): ``criterion(model(batch), batch)``."""
    def step(phase: str, nets: dict, batch: dict):
        return criterion(nets[phase](batch), batch), {}
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


def forward_backward(phase: Phase, phases: list, step_fn, micro: list, scaler, autocast,
                     grad_clip: float) -> PhaseResult:
    """One phase over the step's micro-batches: forward and backward of each, then unscaling and clipping of the phase's
    gradients (no optimizer step yet). ``step_fn(phase, nets, batch) -> (loss, {name: scalar})``.

    The phase's DDP all-reduces (FSDP reduce-scatters) its gradients during the last micro-batch's backward only
    (:func:`distributed.no_sync` before it). ``nets`` gives the other phases' networks unwrapped and frozen
    (:func:`frozen`). fp16 losses are scaled by the one GradScaler of the step, as PyTorch's AMP recipe for several
    optimizers has it.
    """
    device = micro[0][next(k for k, v in micro[0].items() if torch.is_tensor(v))].device
    clock = compute_clock(device)
    loss_sum, metric_sums, compute_time = torch.zeros((), device=device), {}, 0.0
    nets = {other.name: other.net if other is phase else other.plain for other in phases}
    with frozen([other.plain for other in phases if other is not phase]):
        for i, batch in enumerate(micro):
            with no_sync(phase.net) if i < len(micro) - 1 else nullcontext():
                t_compute = clock()
                # DDP's forward may talk too (its bucket rebuild at the second step, buffer broadcasts).
                with collective("DDP forward (bucket rebuild, buffer broadcast)"), autocast():
                    loss, metrics = step_fn(phase.name, nets, batch)
                    loss = loss / len(micro)
                compute_time += clock() - t_compute  # on a GPU: launch time, unless something syncs
                with collective("gradient all-reduce (DDP backward)"):
                    scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
            for name, value in metrics.items():
                metric_sums[name] = metric_sums.get(name, 0.0) + value.detach().float() / len(micro)
    scaler.unscale_(phase.optimizer)  # no-op unless fp16: clipping and the norm need the true gradients
    with collective("gradient norm (FSDP: of the shards)"):  # FSDP: a DTensor, the norm of every rank's shard
        grad_norm = full_value(torch.nn.utils.clip_grad_norm_(phase.plain.parameters(), grad_clip or math.inf))
    return PhaseResult(loss_sum, grad_norm, metric_sums, compute_time)


def clock_name(device: torch.device) -> str:
    """``"cpu"`` or ``"wall"``: what :func:`compute_clock` measures on ``device``."""
    return "cpu" if compute_clock(device) is time.process_time else "wall"


def compute_clock(device: torch.device) -> Callable[[], float]:
    """How a rank's compute time is measured for the straggler check (:class:`utils.run_log.BalanceMonitor`): CPU seconds
    of this process on the CPU (ranks sharing a machine's cores wait for one in turns, which is not slower computing),
    wall seconds on a GPU."""
    return time.process_time if device.type == "cpu" else time.perf_counter


@dataclasses.dataclass
class StepTally:
    """What one step's phases leave for its log line: forward seconds (``compute_time``), seconds waiting in the
    agreement's all-reduce (``wait_time``), the named losses of a model with several phases (``loss_<phase>``,
    ``grad_norm_<phase>`` and its metrics), whether a rank saw a non-finite value, fp16 overflows, and which phases'
    updates were applied (``stepped``: their schedules advance)."""

    compute_time: float = 0.0
    wait_time: float = 0.0
    losses: dict = dataclasses.field(default_factory=dict)
    any_bad: bool = False
    overflows: int = 0
    stepped: dict = dataclasses.field(default_factory=dict)

    def add(self, phase: Phase, several: bool, result: PhaseResult, agreed, overflow: bool, skipped: bool) -> None:
        """One phase: what it measured (``result``) and what the ranks agreed on (:class:`utils.training.guards.Agreed`).
        """
        loss, grad_norm, n_bad, metrics = agreed.loss, agreed.grad_norm, agreed.n_bad, agreed.metrics
        self.compute_time += result.compute_time
        self.wait_time += agreed.wait_s
        self.any_bad |= bool(n_bad)
        self.overflows += overflow
        if several:
            self.losses.update({f"loss_{phase.name}": loss, f"grad_norm_{phase.name}": grad_norm, **metrics})
        self.stepped[phase.name] = not skipped


def step_schedulers(phases: list[Phase], stepped: dict, epochs_seen: int, epochs_done: int) -> int:
    """After the step's optimizer steps: each phase's scheduler steps per applied update (``"step"``; a skipped update does
    not advance its schedule) or per epoch ended in this step (``"epoch"``); gradients are dropped. Returns the epochs
    now seen."""
    for phase in phases:
        if phase.interval == "step" and stepped[phase.name]:
            phase.scheduler.step()
        for _ in range(epochs_done - epochs_seen if phase.interval == "epoch" else 0):
            phase.scheduler.step()  # an epoch ended in this step
        phase.optimizer.zero_grad(set_to_none=True)
    return epochs_done
