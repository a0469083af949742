"""What a run writes besides checkpoints: progress bar, ``metrics.jsonl``, TensorBoard, anomalies, ranks' balance."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import resource
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm import tqdm

SCALARS = ("loss", "lr", "items_per_s", "step_time_s", "data_time_s", "grad_norm", "fp16_overflows")
PER_RANK = ("memory_gib", "memory_allocated_gib", "stray_gpu_mib", "compute_s", "data_wait_s",
            "collective_wait_s")  # lists in a row, one value per rank (memory_allocated_gib on GPUs only)


class LineStream:
    """A tqdm ``file`` for a non-terminal stream (a pipe, a CI log): each bar refresh a line, erasing writes nothing."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        if text := text.replace("\r", "").rstrip():
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def bar_options(stream=None, leave: bool = True) -> dict[str, Any]:
    """tqdm's ``file``, ``mininterval`` and ``leave`` for ``stream`` (default: stderr): on a terminal redrawn every
    0.1 s; else a :class:`LineStream`, a line at most every 10 s (and at each ``set_postfix``), kept."""
    stream = stream or sys.stderr
    if stream.isatty():
        return {"file": stream, "mininterval": 0.1, "leave": leave}
    return {"file": LineStream(stream), "mininterval": 10, "leave": True}


def stray_gpu_mib(pid: int, own_gpu: str, processes: dict[str, list[tuple[int, int]]]) -> float:
    """MiB process ``pid`` holds on GPUs other than ``own_gpu`` in NVML's view ``processes`` (:func:`gpu_processes`;
    UUIDs with or without ``GPU-``); ``nan`` if it does not show ``pid`` on ``own_gpu`` (a container's NVML)."""
    own = own_gpu.lower().removeprefix("gpu-")
    view = [(gpu.lower().removeprefix("gpu-") == own, procs) for gpu, procs in processes.items()]
    if not any(p == pid for is_own, procs in view if is_own for p, _ in procs):
        return math.nan
    return sum(used for is_own, procs in view if not is_own for p, used in procs if p == pid) / 2**20


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
    """NVML's view of every GPU of the node (not only visible ones): ``{UUID: [(pid, bytes used), ...]}``, or None."""
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
    """This process's peak memory, GiB: ``memory_gib`` (on a GPU ``torch.cuda.max_memory_reserved``; on the CPU the
    peak resident set size); on a GPU also ``memory_allocated_gib`` and ``stray_gpu_mib`` (``nan``: NVML can't tell)."""
    if device.type != "cuda":
        return {"memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # KiB on Linux
    view, own = gpu_processes(), getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return {"memory_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            "memory_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "stray_gpu_mib": math.nan if view is None or own is None else stray_gpu_mib(os.getpid(), str(own), view)}


class BalanceMonitor:
    """Rank 0's warnings about the ranks' balance, each kind at most once per ``repeat`` steps: a rank whose peak
    memory exceeds the ranks' median by ``memory_share`` and :attr:`MEMORY_FLOOR_GIB`; one holding more than
    :attr:`STRAY_FLOOR_MIB` on a GPU not its own (NVML); one whose compute time per step exceeds the *other* ranks'
    median by ``straggler_share`` and :attr:`STRAGGLER_FLOOR_S`, ``patience`` log intervals in a row (``clock="cpu"``:
    CPU seconds, as ranks sharing cores take turns). The floors keep a loaded machine's noise quiet."""

    MEMORY_FLOOR_GIB, STRAGGLER_FLOOR_S, STRAY_FLOOR_MIB = 0.25, 0.05, 1.0

    def __init__(self, memory_share: float = 0.2, straggler_share: float = 0.2, patience: int = 3,
                 repeat: int = 500, clock: str = "wall"):
        self.memory_share, self.straggler_share = memory_share, straggler_share
        self.patience, self.repeat, self.clock = patience, repeat, clock
        self.slow_streak: dict[int, int] = {}  # rank -> log intervals in a row it was slow
        self.warned: dict[str, int] = {}  # warning kind -> the step it was last said

    def check(self, step: int, ranks: list[dict[str, float]]) -> list[str]:
        """The warnings due at ``step``; ``ranks``: each rank's :meth:`StepWindow.balance`."""
        stray = [r.get("stray_gpu_mib", 0.0) for r in ranks]
        found = [(f"stray{rank}", f"rank {rank} holds {mib:.0f} MiB on a GPU that is not its own: a CUDA context on "
                  "the wrong device (a torch.cuda call before torch.cuda.set_device, in your code or a library's?)")
                 for rank, mib in enumerate(stray) if mib > self.STRAY_FLOOR_MIB]
        if any(math.isnan(mib) for mib in stray):
            found.append(("stray-unknown", "memory held on other GPUs is not checked: NVML cannot be read or does not "
                          "show this job's processes (install nvidia-ml-py; in a container, the host's process ids)"))
        if len(ranks) < 2:
            return self._once(step, found)
        memory = [r["memory_gib"] for r in ranks]
        middle = statistics.median(memory)
        heavy = max(range(len(ranks)), key=lambda r: memory[r])
        if memory[heavy] > (1 + self.memory_share) * middle and memory[heavy] - middle > self.MEMORY_FLOOR_GIB:
            found.append(("memory", f"rank {heavy} holds {memory[heavy]:.2f} GiB at its peak, "
                          f"{100 * (memory[heavy] / middle - 1):.0f}% above the median {middle:.2f} GiB of the ranks "
                          "(on GPUs: does every rank set its device before touching CUDA?)"))
        compute = [r["compute_s"] for r in ranks]
        others = [statistics.median(compute[:rank] + compute[rank + 1:]) for rank in range(len(ranks))]
        for rank, value in enumerate(compute):
            slow = value > (1 + self.straggler_share) * others[rank] and value - others[rank] > self.STRAGGLER_FLOOR_S
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
        """The ``(kind, message)`` pairs as lines, each kind at most once per ``repeat`` steps (stray-unknown once)."""
        messages = []
        for kind, message in found:
            if kind not in self.warned or (step - self.warned[kind] >= self.repeat and kind != "stray-unknown"):
                self.warned[kind] = step
                messages.append(f"{'note' if kind == 'stray-unknown' else 'warning'}: step {step}: {message}")
        return messages


@dataclasses.dataclass
class StepRecord:
    """One optimizer step, times in seconds."""

    loss: Optional[float] = None  # the step's loss; None: a rank saw a non-finite value (left out of the average)
    items: float = 0  # what the step trained on, all ranks together (the model's count_items: utterances, frames)
    step_time: float = 0.0
    data_time: float = 0.0  # waiting for the step's batches
    wait_time: float = 0.0  # in the step's blocking all-reduces, waiting for the slowest rank
    compute_time: float = 0.0  # forward passes and losses
    losses: dict = dataclasses.field(default_factory=dict)  # a model's named losses and metrics
    overflows: int = 0  # fp16 optimizer steps the GradScaler skipped (their gradient norm is not finite)


class StepWindow:
    """Sums over the steps since the last log line, for one ``metrics.jsonl`` row (:meth:`row`)."""

    def __init__(self):
        self.steps = self.good = self.overflows = 0
        self.loss = self.items = self.step_time = self.data_time = self.wait_time = self.compute_time = 0.0
        self.losses, self.counts = {}, {}  # per named value: the sum and the number of its finite values

    def add(self, step: StepRecord) -> None:
        """Count one optimizer step (a named value only where it is finite)."""
        self.steps += 1
        if step.loss is not None:
            self.loss += step.loss
            self.good += 1
            for name, value in step.losses.items():
                finite = math.isfinite(value)
                self.losses[name] = self.losses.get(name, 0.0) + (value if finite else 0.0)
                self.counts[name] = self.counts.get(name, 0) + finite
        for name in ("overflows", "items", "step_time", "data_time", "wait_time", "compute_time"):
            setattr(self, name, getattr(self, name) + getattr(step, name))

    def balance(self, device: torch.device) -> dict[str, float]:
        """This rank's share of the window, per step, for :class:`BalanceMonitor` (seconds; memory in GiB)."""
        steps = max(self.steps, 1)
        return {**device_memory(device), "data_wait_s": self.data_time / steps,
                "collective_wait_s": self.wait_time / steps, "compute_s": self.compute_time / steps}

    def row(self, **extra: Any) -> dict[str, Any]:
        """``{**extra, loss, losses, items_per_s, step_time_s, data_time_s, fp16_overflows}``: ``loss`` averaged over
        the steps not skipped (NaN if none), ``items_per_s`` all ranks' items over rank 0's wall time."""
        named = {"losses": {name: value / self.counts[name] if self.counts[name] else None
                            for name, value in self.losses.items()}} if self.losses else {}
        return {**extra, "loss": self.loss / self.good if self.good else math.nan, **named,
                "items_per_s": self.items / self.step_time if self.step_time else 0.0,
                "step_time_s": self.step_time / self.steps, "data_time_s": self.data_time / self.steps,
                "fp16_overflows": self.overflows}


def tensorboard_writer(folder: str, initial_step: int) -> Any:
    """A TensorBoard ``SummaryWriter`` in ``folder``; a run resumed at ``initial_step`` purges the events after it."""
    from torch.utils.tensorboard import SummaryWriter  # here: the launcher and ranks > 0 never write to it

    return SummaryWriter(folder, purge_step=initial_step + 1 if initial_step else None)


class RunLog:
    """Rank 0's writer into ``output_dir`` (created by the caller): progress bar (``total_steps``, from ``initial_step``
    on a resume), ``metrics.jsonl``, ``val_metrics.jsonl``, ``anomalies.jsonl``, ``writer`` (the caller's: TensorBoard's or the
    trackers'; default a :func:`tensorboard_writer` in ``<output_dir>/tensorboard``); their rows after ``initial_step`` (a run resumed from an older checkpoint) are
    removed. With ``enabled=False`` (every other rank) nothing is opened and every method does nothing, so the loop
    needs no ``if rank == 0``. ``data_advice``: what the data-wait warning tells the user to do."""

    # Warn when the data takes more than this share of a step, after the warm-up steps, at most once per repeat steps.
    DATA_WAIT_SHARE, DATA_WAIT_WARMUP, DATA_WAIT_REPEAT = 0.1, 20, 500
    ANOMALY_LINES = 2  # anomaly warnings per log interval on the console; the interval's others: one line at its end

    def __init__(self, output_dir: Path, enabled: bool, total_steps: int, initial_step: int,
                 data_advice: str = "raise data.num_workers", writer: Any = None):
        self.output_dir, self.enabled, self.data_advice = Path(output_dir), enabled, data_advice
        self._first_step, self._warned_at = initial_step, None
        self._anomalies_shown = self._anomalies_held = 0
        self.progress = tqdm(total=total_steps, initial=initial_step, disable=not enabled, desc="train",
                             unit="step", dynamic_ncols=True, **bar_options())
        self.writer = self._metrics = None
        if enabled:
            for name in ("metrics.jsonl", "val_metrics.jsonl", "anomalies.jsonl"):
                if dropped := drop_rows_after(self.output_dir / name, initial_step):
                    self.print(f"note: {name}: {dropped} row(s) after step {initial_step}, the step resumed from, "
                               "removed (those steps are trained again)")
            self.writer = writer or tensorboard_writer(str(self.output_dir / "tensorboard"), initial_step)
            self._metrics = open(self.output_dir / "metrics.jsonl", "a")

    def print(self, message: str) -> None:
        """A line on the console that does not break the progress bar."""
        if self.enabled:
            self.progress.write(message)

    def step_done(self) -> None:
        self.progress.update(1)

    def metrics(self, row: dict[str, Any]) -> None:
        """Append a training row (file, writer, progress bar); say the anomalies held back and a long data wait."""
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
        self.progress.set_postfix({"loss": f"{row['loss']:.4f}", **shown, "items_s": f"{row['items_per_s']:.0f}"})

    def validation(self, step: int, epoch: int, val_loss: float, terms: Optional[dict[str, float]] = None) -> None:
        """A ``val_metrics.jsonl`` row (``step``, ``epoch``, ``val_loss``, and the criterion's ``terms`` under
        ``losses`` where it has any), ``val/loss`` and ``val/<term>`` on the writer, a console line."""
        if not self.enabled:
            return
        self.writer.add_scalar("val/loss", val_loss, step)
        for name, value in (terms or {}).items():
            self.writer.add_scalar(f"val/{name}", value, step)
        self._append("val_metrics.jsonl", {"step": step, "epoch": epoch, "val_loss": val_loss,
                                           **({"losses": terms} if terms else {})})
        self.print(f"step {step}: validation loss {val_loss:.4f}")

    def anomaly(self, step: int, kind: str, message: str, ids: list) -> None:
        """A non-finite or spiking step: a row of ``anomalies.jsonl`` with its batch's utterance ids (all ranks), and a
        warning line (at most :attr:`ANOMALY_LINES` per log interval)."""
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


def drop_rows_after(path: Path, step: int) -> int:
    """Remove the rows of the JSON-lines file ``path`` whose ``step`` is above ``step``, and lines that do not read (a
    write cut short), replacing the file atomically; returns how many went (0: untouched or absent)."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):  # not JSON, not a row, no number
            if line.endswith("\n") and json.loads(line).get("step", 0) <= step:
                kept.append(line)
    if len(kept) < len(lines):
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return len(lines) - len(kept)


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
