"""What one step checks beyond the loop's lines: the ranks' agreement on its numbers (one small all-reduce per phase),
non-finite losses and gradients, loss and gradient-norm spikes (``train.on_nonfinite``, ``train.on_spike``: log, skip
the update, or stop) and runs of skipped updates (``train.max_skips_in_a_row``); weights that are no longer finite are
never saved (``utils/checkpoint/saver.py``). Every verdict is made from all-reduced values, so every rank reaches the same one.
"""

from __future__ import annotations

import collections
import math
import time
from pathlib import Path
from typing import NamedTuple

import torch

from distributed import all_gather_object, reduce_tensor
from utils.checkpoint.names import list_numbered, step_of
from utils.errors import TrainingError
from utils.run_log import RunLog
from utils.train_state import TrainState
from utils.training.step import Phase, PhaseResult


class Agreed(NamedTuple):
    """A phase's numbers as every rank sees them after :func:`agree`, and the seconds this rank waited for them."""

    loss: float
    grad_norm: float
    n_bad: int
    metrics: dict
    counts: list
    wait_s: float


def agree(result: PhaseResult, scaler, world_size: int, device: torch.device, counts: tuple = ()) -> Agreed:
    """One small all-reduce per phase: the mean loss, the mean gradient norm (the same on every rank after DDP's
    all-reduce), how many ranks saw a non-finite loss or gradient norm (fp16 gradient overflows are left to the
    GradScaler), the mean of each named metric, and the sums of ``counts`` (stop requests, items)."""
    t_start = time.perf_counter()
    bad = ~torch.isfinite(result.loss) | (~torch.isfinite(result.grad_norm) & (not scaler.is_enabled()))
    values = torch.stack([result.loss.float(), result.grad_norm.float(), bad.float(),
                          *(torch.as_tensor(v, device=device).float() for v in result.metrics.values()),
                          *(torch.tensor(float(c), device=device) for c in counts)])
    sums = reduce_tensor(values, op="sum").tolist()
    n = len(result.metrics)
    metrics = {name: value / world_size for name, value in zip(result.metrics, sums[3:3 + n])}
    return Agreed(sums[0] / world_size, sums[1] / world_size, int(sums[2]), metrics, [int(c) for c in sums[3 + n:]],
                  time.perf_counter() - t_start)


def spike(loss: float, grad_norm: float, monitors: tuple[SpikeMonitor, SpikeMonitor], of: str = "") -> str | None:
    """What spiked this step (``"loss 9.1 is above 6 (3x the highest of its last 100 steps, 2)"``, the gradient norm
    likewise; ``of``: the phase, ``"loss of generator 9.1 ..."``), or ``None``. Both monitors see every finite step; a
    spike does not enter their windows."""
    found = []
    for name, value, monitor in (("loss", loss, monitors[0]), ("gradient norm", grad_norm, monitors[1])):
        if monitor.is_spike(value):
            found.append(monitor.describe(f"{name}{of}", value))
    return "; ".join(found) or None


def last_good_checkpoint(output_dir: Path, step: int, skips_before: int) -> str:
    """The newest checkpoint of ``output_dir`` (file or sharded folder) to name as good at an anomaly of ``step`` after
    ``skips_before`` updates skipped in a row: a first one may be its batch's fault, so one saved before ``step``; in a
    run of skips from step ``b`` on, the weights after step ``b - 1``'s update are the ones that keep failing (every
    checkpoint since holds them), so one saved before ``b - 1``. Else ``"none kept from before step N"``."""
    before = step - skips_before - (skips_before > 0)
    kept = [path for path in list_numbered(output_dir) if step_of(path) < before]
    return str(kept[-1]) if kept else f"none kept from before step {before}"


def count_skips(state: TrainState, phase: str, skipped: bool, searching: bool, limit: int, step: int, of: str,
                output_dir: Path) -> None:
    """Count a phase's skipped update (non-finite, a skipped spike, an fp16 overflow) in ``state.skipped_updates`` and its
    run of skips in ``state.skips_in_a_row``; an overflow while the GradScaler still searches its scale (``searching``)
    neither extends nor breaks the run.

    Raises:
        TrainingError: ``limit`` (``train.max_skips_in_a_row``; 0: none) updates in a row were skipped: skipping does not
            recover the run, which stops naming the last good checkpoint (:func:`last_good_checkpoint`).
    """
    if skipped:
        state.skipped_updates[phase] = state.skipped_updates.get(phase, 0) + 1
    if not searching:
        state.skips_in_a_row[phase] = state.skips_in_a_row.get(phase, 0) + 1 if skipped else 0
    if limit and (skips := state.skips_in_a_row.get(phase, 0)) >= limit:
        raise TrainingError(f"step {step}: the update{of} was skipped {skips} steps in a row (non-finite loss or "
                            f"gradients, spikes or fp16 overflows; train.max_skips_in_a_row is {limit}): skipping does "
                            "not recover this run (a learning rate too high? broken weights?); last good checkpoint: "
                            f"{last_good_checkpoint(output_dir, step, skips - 1)}")


class SpikeMonitor:
    """Flags a spike of one series (a phase's loss or gradient norm): a value above ``high + (factor - 1) * max(|high|,
    high - low)`` of the last ``window`` values (``factor * high`` for a positive series; the other terms keep the rule
    meaningful for WaveGlow's negative loss). Checks start after ``warmup`` values; spikes do not enter the window;
    ``factor <= 0`` disables it. Why the recent highest, not a mean: gradient norms are heavy-tailed. On full-size H100
    runs WaveGlow's norm grew ~40x in 100 steps, then reached 4-7x its median every few dozen steps; "3x the running
    mean" fired 3-23 times in every healthy run, this rule never; a clip of loud noise gave 4-17x the recent highest.
    """

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
        """``"gradient norm 22.5 is above 8.6 (3x the highest of its last 100 steps, 2.87)"``, for a spike just found (the
        window is as the check saw it)."""
        return (f"{name} {value:.4g} is above {self.limit():.4g} ({self.factor:g}x the highest of its last "
                f"{len(self.recent)} steps, {max(self.recent):.4g})")


class Anomalies:
    """The step's verdicts on one phase: a non-finite loss or gradient norm (``train.on_nonfinite``) or a spike
    (``train.on_spike``) is logged to ``anomalies.jsonl`` with every rank's utterance ids, skipped (gradients dropped,
    buffers taken back, counted) or stops the run naming the last good checkpoint."""

    def __init__(self, train_cfg, scaler, state: TrainState, log: RunLog, output_dir, phases: int):
        self.cfg, self.scaler, self.state, self.log, self.output_dir = train_cfg, scaler, state, log, output_dir
        self.several = phases > 1

    def judge(self, step: int, phase: Phase, agreed: Agreed, ids: list) -> tuple[bool, bool]:
        """``(overflow, skipped)`` of ``phase``'s update: an fp16 overflow (the GradScaler skips it), and whether it is
        skipped at all.

        Raises:
            TrainingError: an anomaly with the policy ``stop``.
        """
        loss, grad_norm, n_bad = agreed.loss, agreed.grad_norm, agreed.n_bad
        overflow = self.scaler.is_enabled() and not math.isfinite(grad_norm)  # the GradScaler skips this update
        skipped = overflow
        of = f" of {phase.name}" if self.several else ""
        kind, message = ("nonfinite", f"non-finite loss or gradient norm{of} (loss {loss}, grad norm "
                                      f"{grad_norm})") if n_bad else ("spike", spike(loss, grad_norm, phase.monitors, of))
        if message is None:
            return overflow, skipped
        action = self.cfg.on_nonfinite if kind == "nonfinite" else self.cfg.on_spike
        all_ids = sum(all_gather_object(ids), [])
        good = last_good_checkpoint(self.output_dir, step, self.state.skips_in_a_row.get(phase.name, 0))
        if action == "stop":
            raise TrainingError(f"step {step}: {message}; batch utterances: {', '.join(map(str, all_ids))}; last good "
                                f"checkpoint: {good}")
        if action == "skip":
            phase.optimizer.zero_grad(set_to_none=True)  # nothing to apply: its step is a no-op
            phase.guard.restore()
            self.state.skipped_steps += 1
            skipped = True
            message += f": step skipped ({self.state.skipped_steps} so far)"
        self.log.anomaly(step, kind, f"{message}; last good checkpoint: {good}", all_ids)
        return overflow, skipped

    def count(self, step: int, phase: Phase, overflow: bool, skipped: bool) -> None:
        """After the optimizer's step: count a skipped update (:func:`count_skips`). An fp16 overflow counts towards
        ``train.max_skips_in_a_row`` once the GradScaler's scale is below 1 (the gradients are then not finite unscaled).

        Raises:
            TrainingError: see :func:`count_skips`.
        """
        searching = overflow and skipped and self.scaler.get_scale() >= 1.0
        of = f" of {phase.name}" if self.several else ""
        count_skips(self.state, phase.name, skipped, searching, self.cfg.max_skips_in_a_row, step, of, self.output_dir)
