"""What one step checks: the ranks' agreement on its numbers (one small all-reduce per phase), non-finite losses and
gradients, loss and gradient-norm spikes, runs of skipped updates; all-reduced, so every rank agrees."""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import torch

from distributed import DistInfo, all_gather_object, reduce_tensor
from utils.checkpoint.names import last_good_checkpoint
from utils.errors import TrainingError
from utils.run_log import RunLog, StepRecord
from utils.train_state import TrainState
from utils.training.step import Phase, PhaseResult


class StepCounts(NamedTuple):
    """What the all-reduce of a step's last phase also sums over the ranks."""

    stop_requests: int  # ranks asked to stop by a signal (SIGTERM, SIGUSR1, SIGINT)
    items: int  # what the step trained on (the model's ``count_items``: utterances, frames)


class PhaseNumbers(NamedTuple):
    """A phase's numbers as every rank sees them after :func:`all_reduce_numbers`."""

    loss: float  # the mean over the ranks
    grad_norm: float  # the mean over the ranks (the same on every rank after DDP's all-reduce)
    nonfinite_ranks: int  # ranks that saw a non-finite loss or gradient norm (fp16 overflows left to the GradScaler)
    metrics: dict  # each named metric's mean over the ranks
    counts: Optional[StepCounts]  # summed over the ranks, when the call carried them (the step's last phase)
    wait_s: float  # this rank's wait for them


def all_reduce_numbers(result: PhaseResult, scaler: torch.amp.GradScaler, dist: DistInfo,
                       counts: Optional[StepCounts] = None) -> PhaseNumbers:
    """One small all-reduce per phase: the mean loss and gradient norm, the ranks that saw either non-finite, the mean
    of each named metric and the sums of ``counts`` where given."""
    t_start = time.perf_counter()
    bad = ~torch.isfinite(result.loss) | (~torch.isfinite(result.grad_norm) & (not scaler.is_enabled()))
    values = torch.stack([result.loss.float(), result.grad_norm.float(), bad.float(),
                          *(torch.as_tensor(v, device=dist.device).float() for v in result.metrics.values()),
                          *(torch.tensor(float(c), device=dist.device) for c in counts or ())])
    sums = reduce_tensor(values, op="sum").tolist()
    n = len(result.metrics)
    metrics = {name: value / dist.world_size for name, value in zip(result.metrics, sums[3:3 + n])}
    summed = StepCounts(*(int(c) for c in sums[3 + n:])) if counts is not None else None
    return PhaseNumbers(sums[0] / dist.world_size, sums[1] / dist.world_size, int(sums[2]), metrics, summed,
                        time.perf_counter() - t_start)


class Verdict(NamedTuple):
    """What becomes of a phase's update (:meth:`Anomalies.check`)."""

    overflow: bool  # fp16 gradients overflowed: the GradScaler skips the update (and lowers its scale)
    skipped: bool  # the update is not applied: an overflow, or an anomaly under the policy ``skip``


@dataclasses.dataclass
class StepOutcome(StepRecord):
    """One optimizer step, filled phase by phase (:meth:`add`): what its metrics row counts (:class:`StepRecord`; its
    ``loss`` is the last phase's, a GAN's generator's; its ``losses`` each phase's named scalars, and with
    ``named_losses`` each phase's loss and gradient norm) and what the loop reads once the phases are done."""

    named_losses: bool = False  # keep each phase's numbers as loss_<phase>, grad_norm_<phase> (several optimizers)
    stop_requested: bool = False  # a rank was asked to stop: the run saves and ends after this step
    grad_norm: float = math.nan  # the last phase's
    applied: dict = dataclasses.field(default_factory=dict)  # phase name -> its update was applied (not skipped)
    any_nonfinite: bool = False  # a phase's loss or gradient norm was not finite on some rank

    def add(self, phase: Phase, result: PhaseResult, numbers: PhaseNumbers, verdict: Verdict) -> None:
        """One phase: what it measured (``result``), its numbers over the ranks, what became of its update."""
        self.compute_time += result.compute_time
        self.wait_time += numbers.wait_s
        self.any_nonfinite |= bool(numbers.nonfinite_ranks)
        self.loss, self.grad_norm = None if self.any_nonfinite else numbers.loss, numbers.grad_norm
        self.overflows += verdict.overflow
        if self.named_losses:
            self.losses.update({f"loss_{phase.name}": numbers.loss, f"grad_norm_{phase.name}": numbers.grad_norm})
        self.losses.update(numbers.metrics)  # the step's named scalars: a GAN's, or the terms a criterion returned
        self.applied[phase.name] = not verdict.skipped
        if numbers.counts is not None:
            self.stop_requested, self.items = bool(numbers.counts.stop_requests), numbers.counts.items


class SpikeMonitor:
    """Flags a spike of one series: a value above ``high + (factor - 1) * max(|high|, high - low)`` of the last
    ``window`` values (``factor * high`` for a positive series; the rest: a flow's negative log-likelihood), after
    ``warmup`` values; spikes do not enter the window; ``factor <= 0`` disables it. The recent highest, not a mean: in
    H100 runs of a flow vocoder "3x the running mean" fired 3-23 times per healthy run, this rule never; loud noise gave
    4-17x."""

    def __init__(self, factor: float, warmup: int = 20, window: int = 100):
        self.factor, self.warmup = factor, warmup
        self.recent: collections.deque[float] = collections.deque(maxlen=window)

    def limit(self) -> float:
        """The value above which the next step is a spike (``inf`` while warming up or when disabled)."""
        if self.factor <= 0 or len(self.recent) < self.warmup:
            return math.inf
        high, low = max(self.recent), min(self.recent)
        return high + (self.factor - 1) * max(abs(high), high - low)

    def is_spike(self, value: float) -> bool:
        """Check ``value`` against :meth:`limit`, then add it to the window unless it is a spike."""
        if value > self.limit():
            return True
        self.recent.append(value)
        return False

    def describe(self, name: str, value: float) -> str:
        """``"gradient norm 22.5 is above 8.6 (3x the highest of its last 100 steps, 2.87)"`` for a spike just found."""
        return (f"{name} {value:.4g} is above {self.limit():.4g} ({self.factor:g}x the highest of its last "
                f"{len(self.recent)} steps, {max(self.recent):.4g})")


class Anomalies:
    """The verdicts on each phase's update: a non-finite loss or gradient norm or a spike is logged to
    ``anomalies.jsonl`` with every rank's utterance ids, skipped, or stops the run naming the last good checkpoint;
    too many skips in a row stop it. ``phases``: how many the model has (several: messages name the phase);
    ``suspect``: ``Checkpointer.suspect``, which every rank calls at a non-finite anomaly and a stop for skips."""

    def __init__(self, train_cfg, scaler, state: TrainState, log: RunLog, phases: int,
                 suspect: Callable[[], Optional[Path]] = lambda: None):
        self.cfg, self.scaler, self.state, self.log, self.suspect = train_cfg, scaler, state, log, suspect
        self.name_phases = phases > 1

    def _of(self, phase: Phase) -> str:
        return f" of {phase.name}" if self.name_phases else ""

    def check(self, step: int, phase: Phase, numbers: PhaseNumbers, ids: list) -> Verdict:
        """The verdict on ``phase``'s update, a skip counted in ``state.skipped_updates`` and its run in
        ``state.skips_in_a_row`` (an fp16 overflow while the GradScaler searches its scale, at 1 or above, neither
        extends nor breaks the run). A :class:`TrainingError` for an anomaly under ``stop``, or
        ``train.max_skips_in_a_row`` (0: none) updates skipped in a row."""
        overflow = self.scaler.is_enabled() and not math.isfinite(numbers.grad_norm)  # the GradScaler skips it
        verdict = Verdict(overflow, skipped=self._anomaly(step, phase, numbers, ids) or overflow)
        state, limit = self.state, self.cfg.max_skips_in_a_row
        if verdict.skipped:
            state.skipped_updates[phase.name] = state.skipped_updates.get(phase.name, 0) + 1
        searching = verdict.overflow and verdict.skipped and self.scaler.get_scale() >= 1.0
        if not searching:
            state.skips_in_a_row[phase.name] = state.skips_in_a_row.get(phase.name, 0) + 1 if verdict.skipped else 0
        if limit and (skips := state.skips_in_a_row.get(phase.name, 0)) >= limit:
            good = last_good_checkpoint(self.log.output_dir, step, skips - 1, self.suspect())
            raise TrainingError(f"step {step}: the update{self._of(phase)} was skipped {skips} steps in a row "
                                "(non-finite loss or gradients, spikes or fp16 overflows; train.max_skips_in_a_row is "
                                f"{limit}): skipping does not recover this run (a learning rate too high? broken "
                                f"weights?); last good checkpoint: {good}")
        return verdict

    def _anomaly(self, step: int, phase: Phase, numbers: PhaseNumbers, ids: list) -> bool:
        """Log, skip or stop (``train.on_nonfinite``, ``train.on_spike``) on an anomaly of ``phase``; whether its update
        is skipped (its gradients dropped, its buffers taken back)."""
        loss, grad_norm, of = numbers.loss, numbers.grad_norm, self._of(phase)
        if numbers.nonfinite_ranks:
            kind, message = "nonfinite", f"non-finite loss or gradient norm{of} (loss {loss}, grad norm {grad_norm})"
        else:  # each monitor checks its value, then says what spiked
            series = (("loss", loss, phase.monitors[0]), ("gradient norm", grad_norm, phase.monitors[1]))
            kind, message = "spike", "; ".join(monitor.describe(f"{name}{of}", value)
                                               for name, value, monitor in series if monitor.is_spike(value))
        if not message:
            return False
        action = self.cfg.on_nonfinite if kind == "nonfinite" else self.cfg.on_spike
        all_ids = sum(all_gather_object(ids), [])
        good = last_good_checkpoint(self.log.output_dir, step, self.state.skips_in_a_row.get(phase.name, 0),
                                    self.suspect() if kind == "nonfinite" else None)
        if action == "stop":
            raise TrainingError(f"step {step}: {message}; batch utterances: {', '.join(map(str, all_ids))}; last good "
                                f"checkpoint: {good}")
        if action == "skip":
            phase.optimizer.zero_grad(set_to_none=True)  # nothing to apply: its step is a no-op
            phase.guard.restore()
            self.state.skipped_steps += 1
            message += f": step skipped ({self.state.skipped_steps} so far)"
        self.log.anomaly(step, kind, f"{message}; last good checkpoint: {good}", all_ids)
        return action == "skip"
