"""What a run writes besides checkpoints: progress bar, ``metrics.jsonl``, TensorBoard, anomalies.

Only rank 0 writes; on every other rank :class:`RunLog` is built with ``enabled=False`` and each method does nothing, so
the training loop needs no ``if rank == 0`` around its logging.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import statistics
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

SCALARS = ("loss", "lr", "items_per_s", "step_time_s", "data_time_s", "grad_norm", "fp16_overflows")

PER_RANK = ("memory_gib", "memory_allocated_gib", "stray_gpu_mib", "compute_s", "data_wait_s",
            "collective_wait_s")  # lists in a row, one value per rank (memory_allocated_gib on GPUs only)


def peak_memory_gib(device: torch.device) -> float:
    """This process's peak memory so far, GiB: ``torch.cuda.max_memory_reserved`` on a GPU (what the caching allocator took
    from the device: what another process cannot have), the peak resident set size (``ru_maxrss``) on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_reserved(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def stray_gpu_mib(pid: int, own_gpu: str, processes: dict[str, list[tuple[int, int]]]) -> float:
    """MiB that process ``pid`` holds on GPUs other than its own, in ``processes``: NVML's view of the node, ``{GPU UUID:
    [(pid, bytes used), ...]}`` (UUIDs compared without NVML's ``GPU-`` prefix, ignoring case).

    Anything above zero is a CUDA context on the wrong device: a ``torch.cuda`` call (or a library's) that ran before
    ``torch.cuda.set_device``, the classic "GPU 0 holds extra memory" of one process per rank. ``nan`` when the view
    does not show ``pid`` on ``own_gpu`` at all: NVML inside a container lists the host's process ids, so nothing can be
    said about this process.
    """
    def plain(uuid: str) -> str:
        return uuid.lower().removeprefix("gpu-")

    own = plain(own_gpu)
    if not any(p == pid for gpu, procs in processes.items() if plain(gpu) == own for p, _ in procs):
        return math.nan
    return sum(used for gpu, procs in processes.items() if plain(gpu) != own for p, used in procs if p == pid) / 2**20


@functools.cache
def _nvml():
    """``pynvml`` (package nvidia-ml-py), initialised once per process; None without the package or a driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    return pynvml


def gpu_processes() -> dict[str, list[tuple[int, int]]] | None:
    """NVML's view of this node's GPUs, ``{UUID: [(pid, bytes used), ...]}`` for every GPU of the node (NVML ignores
    ``CUDA_VISIBLE_DEVICES``); None when NVML cannot be read."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        view = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            view[uuid.decode() if isinstance(uuid, bytes) else uuid] = [
                (proc.pid, proc.usedGpuMemory or 0) for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return view
    except nvml.NVMLError:
        return None


def device_memory(device: torch.device) -> dict[str, float]:
    """This process's memory for :class:`BalanceMonitor`: ``memory_gib`` (see :func:`peak_memory_gib`); on a GPU also
    ``memory_allocated_gib`` (peak ``torch.cuda.max_memory_allocated``: tensors alone, without the allocator's cache)
    and ``stray_gpu_mib`` (:func:`stray_gpu_mib`; ``nan`` when NVML cannot tell)."""
    memory = {"memory_gib": peak_memory_gib(device)}
    if device.type == "cuda":
        memory["memory_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        view, own = gpu_processes(), getattr(torch.cuda.get_device_properties(device), "uuid", None)
        memory["stray_gpu_mib"] = math.nan if view is None or own is None else stray_gpu_mib(os.getpid(), str(own), view)
    return memory


class BalanceMonitor:
    """Rank 0's view of the ranks' balance at each log interval; returns warnings, never raises.

    * memory: a rank whose peak memory exceeds the median of the ranks by more than ``memory_share`` (e.g. 0.2: 20%) and
      by more than ``memory_floor_gib`` is named (the classic cause: every rank created a CUDA context on GPU 0);
    * stray GPU memory: a rank that holds memory on a GPU other than its own (``stray_gpu_mib`` above
      ``stray_floor_mib``; read from NVML) is named; when NVML cannot tell (no nvidia-ml-py, no driver access, a
      container's process ids), rank 0 says once that this check is off;
    * straggler: a rank whose compute time per step (its forward passes and losses: the part of a step with no
      collective to wait in once the ranks are in step) exceeds the median of the *other* ranks by more than
      ``straggler_share`` and ``straggler_floor_s``, in ``patience`` log intervals in a row, is named. With
      ``clock="cpu"`` (ranks computing on the CPU) the times are CPU seconds of the rank's process
      (``time.process_time``): ranks that share a machine's cores wait for a core in turns, which lengthens their wall
      time but is not a slower rank; a rank that computes more shows in its CPU seconds. With ``"wall"`` (GPUs) they are
      seconds of wall time.

    The floors keep noise quiet: rank 0 also writes logs and checkpoints, and on a loaded machine tiny models' ranks
    differ by 25% (15 ms of CPU time in a 60 ms step, seen on a 16-core host running 16 test jobs at once) without
    either being a straggler; a straggler costs the job its extra time in every step, 50 ms by default. Each warning is
    repeated at most once per ``repeat`` steps.
    """

    def __init__(self, memory_share: float = 0.2, straggler_share: float = 0.2, patience: int = 3,
                 repeat: int = 500, memory_floor_gib: float = 0.25, straggler_floor_s: float = 0.05,
                 stray_floor_mib: float = 1.0, clock: str = "wall"):
        self.memory_share, self.straggler_share, self.stray_floor_mib = memory_share, straggler_share, stray_floor_mib
        self.clock = clock
        self.memory_floor_gib, self.straggler_floor_s = memory_floor_gib, straggler_floor_s
        self.patience, self.repeat = patience, repeat
        self.slow_streak: dict[int, int] = {}
        self.warned: dict[str, int] = {}

    def check(self, step: int, ranks: list[dict[str, float]]) -> list[str]:
        """``ranks``: per rank ``{"memory_gib", "compute_s", "data_wait_s", "collective_wait_s"}`` and, from
        :func:`device_memory`, optionally ``stray_gpu_mib``."""
        found = []
        stray = [r.get("stray_gpu_mib", 0.0) for r in ranks]
        for rank, mib in enumerate(stray):
            if mib > self.stray_floor_mib:
                found.append((f"stray{rank}", f"rank {rank} holds {mib:.0f} MiB on a GPU that is not its own: a CUDA "
                                              "context on the wrong device (a torch.cuda call before "
                                              "torch.cuda.set_device, in your code or a library's?)"))
        if any(math.isnan(mib) for mib in stray):  # said once: see _once
            found.append(("stray-unknown", "memory held on other GPUs is not checked: NVML cannot be read or does not "
                                           "show this job's processes (install nvidia-ml-py; in a container, the "
                                           "host's process ids)"))
        if len(ranks) < 2:
            return self._once(step, found)
        memory = [r["memory_gib"] for r in ranks]
        middle = statistics.median(memory)
        heavy = max(range(len(ranks)), key=lambda r: memory[r])
        if memory[heavy] > (1 + self.memory_share) * middle and memory[heavy] - middle > self.memory_floor_gib:
            found.append(("memory", f"rank {heavy} holds {memory[heavy]:.2f} GiB at its peak, "
                                    f"{100 * (memory[heavy] / middle - 1):.0f}% above the median {middle:.2f} GiB "
                                    "of the ranks (on GPUs: does every rank set its device before touching CUDA?)"))
        compute = [r["compute_s"] for r in ranks]
        others = [statistics.median(compute[:rank] + compute[rank + 1:]) for rank in range(len(ranks))]
        for rank, value in enumerate(compute):
            slow = value > (1 + self.straggler_share) * others[rank] and value - others[rank] > self.straggler_floor_s
            self.slow_streak[rank] = self.slow_streak.get(rank, 0) + 1 if slow else 0
        slowest = max(range(len(ranks)), key=lambda r: compute[r])
        if self.slow_streak[slowest] >= self.patience:
            what = "CPU seconds" if self.clock == "cpu" else "seconds"
            found.append(("straggler", f"rank {slowest} is a straggler: {compute[slowest]:.3f} {what} of forward "
                                       f"passes per step, {100 * (compute[slowest] / others[slowest] - 1):.0f}% above "
                                       f"the other ranks' median {others[slowest]:.3f}, for "
                                       f"{self.slow_streak[slowest]} log intervals in a row; the other ranks wait for "
                                       "it in every all-reduce (a slower GPU, a throttled node, more work on it?)"))
        return self._once(step, found)

    def _once(self, step: int, found: list[tuple[str, str]]) -> list[str]:
        """The ``(kind, message)`` pairs as warning lines, each kind at most once per ``repeat`` steps (the note that stray
        memory is unchecked only once)."""
        messages = []
        for kind, message in found:
            if kind not in self.warned or (step - self.warned[kind] >= self.repeat and kind != "stray-unknown"):
                self.warned[kind] = step
                messages.append(f"{'note' if kind == 'stray-unknown' else 'warning'}: step {step}: {message}")
        return messages


class StepWindow:
    """Sums over the steps since the last log line; :meth:`row` turns them into one ``metrics.jsonl`` row.

    ``loss`` is averaged over the finite steps only (a skipped step has no loss to average); ``items_per_s`` is items of
    all ranks over rank 0's wall time of the window.
    """

    def __init__(self):
        self.steps = self.good = self.overflows = 0
        self.loss = self.items = self.step_time = self.data_time = self.wait_time = self.compute_time = 0.0
        self.losses: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, loss: float | None, items: float, step_time: float, data_time: float,
            wait_time: float = 0.0, compute_time: float = 0.0, losses: dict | None = None,
            overflows: int = 0) -> None:
        """Record one optimizer step (``loss`` None for a skipped step); times in seconds (``wait_time``: spent in the
        step's blocking all-reduce, waiting for the slowest rank; ``compute_time``: forward passes and losses).
        ``losses``: the step's named losses and metrics of a model with several phases (each averaged over the window's
        steps where it is finite: an fp16 overflow's gradient norm is not a number to average, it is counted in
        ``overflows``); ``overflows``: fp16 optimizer steps the GradScaler skipped."""
        self.steps += 1
        self.overflows += overflows
        if loss is not None:
            self.loss += loss
            self.good += 1
            for name, value in (losses or {}).items():
                finite = math.isfinite(value)
                self.losses[name] = self.losses.get(name, 0.0) + (value if finite else 0.0)
                self.counts[name] = self.counts.get(name, 0) + finite
        self.items += items
        self.step_time += step_time
        self.data_time += data_time
        self.wait_time += wait_time
        self.compute_time += compute_time

    def balance(self, device: torch.device) -> dict[str, float]:
        """This rank's share of the window, per step, for :class:`BalanceMonitor` (seconds; memory in GiB)."""
        steps = max(self.steps, 1)
        return {**device_memory(device), "data_wait_s": self.data_time / steps,
                "collective_wait_s": self.wait_time / steps,
                "compute_s": self.compute_time / steps}

    def row(self, **extra: Any) -> dict[str, Any]:
        """``{loss, losses (several phases only), items_per_s, step_time_s, data_time_s, fp16_overflows, **extra}`` for the
        window (``loss`` NaN if none; a named value that was never finite in the window is ``None``)."""
        named = {"losses": {name: value / self.counts[name] if self.counts[name] else None
                            for name, value in self.losses.items()}} if self.losses else {}
        return {**extra, "loss": self.loss / self.good if self.good else math.nan, **named,
                "items_per_s": self.items / self.step_time if self.step_time else 0.0,
                "step_time_s": self.step_time / self.steps, "data_time_s": self.data_time / self.steps,
                "fp16_overflows": self.overflows}


class RunLog:
    """Rank 0's writer: progress bar, ``metrics.jsonl``, ``val_metrics.jsonl``, ``anomalies.jsonl``, TensorBoard.

    Args:
        output_dir: the run's folder (created by the caller).
        enabled: False on every rank but 0: then nothing is opened or written.
        total_steps / initial_step: for the progress bar (a resumed run starts part-way). data_advice: what the
        data-wait warning tells the user to do (``ModelSpec.data_advice``). tensorboard: the folder of TensorBoard's
        event files (default: ``<output_dir>/tensorboard``).
    """

    DATA_WAIT_SHARE = 0.1
    """The data-wait warning fires when waiting for data takes more than this share of the step ..."""
    DATA_WAIT_WARMUP = 20
    """... after this many steps of the run (worker start-up and the first batches are not the steady state) ..."""
    DATA_WAIT_REPEAT = 500
    """... and again at most once per this many steps."""
    ANOMALY_LINES = 2
    """At most this many anomaly warnings per log interval on the console; the others of the interval are counted in
    one line at its end. Every anomaly, with its batch's utterance ids, is in ``anomalies.jsonl``."""

    def __init__(self, output_dir: Path, enabled: bool, total_steps: int, initial_step: int,
                 data_advice: str = "raise data.num_workers", tensorboard: Optional[str] = None):
        self.output_dir, self.enabled, self.data_advice = Path(output_dir), enabled, data_advice
        self._first_step, self._warned_at = initial_step, None
        self._anomalies_shown = self._anomalies_held = 0
        self.progress = tqdm(total=total_steps, initial=initial_step, disable=not enabled, desc="train",
                             unit="step", dynamic_ncols=True)
        self.writer = self._metrics = None
        if enabled:
            self.writer = SummaryWriter(tensorboard or str(self.output_dir / "tensorboard"))
            self._metrics = open(self.output_dir / "metrics.jsonl", "a")

    def print(self, message: str) -> None:
        """A line on the console that does not break the progress bar."""
        if self.enabled:
            self.progress.write(message)

    def step_done(self) -> None:
        self.progress.update(1)

    def metrics(self, row: dict[str, Any]) -> None:
        """Append a training row; warn when waiting for data takes more than :attr:`DATA_WAIT_SHARE` of the step (past the
        warm-up, rate-limited)."""
        if not self.enabled:
            return
        step = row["step"]
        if self._anomalies_held:
            self.print(f"warning: {self._anomalies_held} more anomalies up to step {step}, listed in "
                       f"{self.output_dir / 'anomalies.jsonl'}")
        self._anomalies_shown = self._anomalies_held = 0
        if (row["data_time_s"] > self.DATA_WAIT_SHARE * row["step_time_s"]
                and step - self._first_step > self.DATA_WAIT_WARMUP
                and (self._warned_at is None or step - self._warned_at >= self.DATA_WAIT_REPEAT)):
            self._warned_at = step
            self.print(f"warning: step {step}: waiting {row['data_time_s']:.3f} s per step for data "
                       f"({100 * row['data_time_s'] / row['step_time_s']:.0f}% of the step): {self.data_advice}")
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        for key in SCALARS:
            if row.get(key) is not None:  # None: a gradient norm that was not finite (a skipped update)
                self.writer.add_scalar(f"train/{key}", row[key], row["step"])
        for key in PER_RANK:
            for rank, value in enumerate(row.get(key, [])):
                self.writer.add_scalar(f"ranks/{key}/rank{rank}", value, row["step"])
        named = {key: value for key, value in row.get("losses", {}).items() if value is not None}
        for key, value in named.items():
            self.writer.add_scalar(f"train/{key}", value, row["step"])
        shown = {key: f"{value:.4g}" for key, value in named.items() if not key.startswith("grad_norm_")}
        self.progress.set_postfix(loss=f"{row['loss']:.4f}", **shown, items_s=f"{row['items_per_s']:.0f}")

    def validation(self, step: int, epoch: int, val_loss: float) -> None:
        if not self.enabled:
            return
        self.writer.add_scalar("val/loss", val_loss, step)
        self._append("val_metrics.jsonl", {"step": step, "epoch": epoch, "val_loss": val_loss})
        self.print(f"step {step}: validation loss {val_loss:.4f}")

    def anomaly(self, step: int, kind: str, message: str, ids: list) -> None:
        """A non-finite or spiking step: a row of ``anomalies.jsonl`` with the utterance ids of its batch (all ranks), and
        a warning line on the console (at most :attr:`ANOMALY_LINES` per log interval)."""
        if not self.enabled:
            return
        self._append("anomalies.jsonl", {"step": step, "kind": kind, "message": message, "ids": ids})
        if self._anomalies_shown >= self.ANOMALY_LINES:
            self._anomalies_held += 1
            return
        self._anomalies_shown += 1
        self.print(f"warning: step {step}: {message}; the batch's {len(ids)} utterance ids are in "
                   f"{self.output_dir / 'anomalies.jsonl'}")

    def _append(self, name: str, row: dict[str, Any]) -> None:
        with open(self.output_dir / name, "a") as handle:
            handle.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self.progress.close()
        if self.enabled:
            self._metrics.close()
            self.writer.close()


def one_line(err: BaseException) -> str:
    """The error's message on one line; for an error re-raised from a DataLoader worker, the original one."""
    lines = [line for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    if any("Original Traceback" in line for line in lines):  # "module.DataError: truncated wav file: ..."
        return lines[-1].split(": ", 1)[-1]
    return lines[0]


@contextlib.contextmanager
def one_line_warnings():
    """Warnings print as one ``warning: ...`` line (not Python's two lines with the source line) while inside."""
    def format_warning(message, category, filename, lineno, line=None) -> str:
        kind = "" if category is UserWarning else f" ({category.__name__})"
        return f"warning: {one_line(Warning(str(message)))}{kind}\n"
    saved, warnings.formatwarning = warnings.formatwarning, format_warning
    try:
        yield
    finally:
        warnings.formatwarning = saved
