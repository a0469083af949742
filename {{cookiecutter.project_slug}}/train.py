"""Train a model of ``model.py`` on one process, one GPU per process, or many machines.

    python train.py --config config.json                              # one process
    python multiproc.py train.py --config config.json                 # one process per GPU (DDP)
    python multiproc.py --nproc-per-node 2 train.py --config config.json --tiny   # CPU smoke run

The loop knows no model: it takes a :class:`model.ModelSpec` from ``model.MODELS``. Each step reads
``grad_accumulation`` micro-batches; DistributedDataParallel all-reduces the gradients (averaged over
ranks) during the last micro-batch's backward, so every replica takes the same optimizer step (with
``train.parallelism=fsdp``, FSDP2 reduce-scatters them and each rank updates its shard). Then one
small all-reduce per step agrees on the loss, on whether it is finite, and on whether a rank was asked to
stop (SIGTERM/SIGUSR1/SIGINT). Only rank 0 writes: progress bar, TensorBoard, ``metrics.jsonl``, checkpoints.

A checkpoint holds everything the next step depends on (weights, optimizer, LR schedule, GradScaler,
step, epoch and position inside it, every rank's RNG states), so ``--resume auto`` continues exactly
where the run stopped; on another number of processes it continues from the same sample of the epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import multiprocessing
import os
import random
import signal
import threading
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader

from distributed import (CollectiveError, all_gather_object, apply_gradient_allreduce, broadcast_buffers,
                         broadcast_object, cleanup, collective, cpu_threads, full_value, init_distributed, no_sync,
                         reduce_tensor, unwrap_model)
from model import MODELS, ModelSpec, config_schemas
from utils.audio_processing import MelSpectrogram
from utils.activation_checkpoint import apply_activation_checkpointing
from utils.checkpoint import (CheckpointError, NamedStates, RunLock, ShardedCheckpointer, TrainState, atomic_write_bytes,
                              capture_rng_state, checkpoint_bytes, durable_write_speed, is_sharded, resume_path,
                              resume_training, save_checkpoint, sharded_train_state, training_checkpoint,
                              world_size_change)
from utils.config import Config, ConfigError, load_config
from utils.data_check import check_corpus, default_cache_file, describe
from utils.data_utils import (DataError, LengthBucketSampler, ResumableDistributedSampler, load_splits,
                              padding_fraction, random_batches)
from utils.ema import EMA
from utils.platforms import (SAGEMAKER_CHECKPOINTS, default_dataset_path, default_output_dir, hyperparameter_argv,
                             tensorboard_dir)
from utils.run_log import BalanceMonitor, RunLog, SpikeMonitor, StepWindow, one_line, one_line_warnings


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss with ``train.on_nonfinite=stop``)."""


class GracePeriod:
    """Whether a checkpoint fits the time the launcher gives the ranks after a stop signal (``multiproc.py
    --stop-timeout``, handed to the ranks as ``MULTIPROC_STOP_TIMEOUT``; without it nothing is checked): said once,
    at start-up from an estimate (the checkpoint's size over the output folder's durable write speed), or else after
    the first save that took longer, with its step, than the grace period."""

    def __init__(self, environ):
        value = environ.get("MULTIPROC_STOP_TIMEOUT", "").strip()
        self.seconds: Optional[float] = float(value) if value else None
        self.warned = False

    def _advice(self, need_s: float) -> str:
        self.warned = True
        return (f"the grace period after a stop signal is {self.seconds:g} s (multiproc.py --stop-timeout): a stop "
                "would be killed before its checkpoint is durable; give --stop-timeout, and the platform's grace period "
                f"above it (Kubernetes: terminationGracePeriodSeconds), more than {need_s:.0f} s")

    def check_estimate(self, nbytes: int, folder: Path) -> Optional[str]:
        """The warning for a checkpoint of ``nbytes`` written into ``folder``, or ``None`` when it fits."""
        if self.seconds is None:
            return None
        speed = durable_write_speed(folder, nbytes)
        save_s = nbytes / speed
        if save_s <= self.seconds:
            return None
        return (f"warning: a checkpoint takes ~{save_s:.1f} s ({nbytes / 1e6:.1f} MB at {speed / 1e6:.0f} MB/s into "
                f"{folder}); " + self._advice(1.5 * save_s + 5))

    def check_save(self, step: int, save_s: float, step_s: float) -> Optional[str]:
        """The warning (once) after a save of ``save_s`` seconds following a step of ``step_s``, or ``None``."""
        if self.seconds is None or self.warned or save_s + step_s <= self.seconds:
            return None
        return (f"warning: step {step}: the checkpoint took {save_s:.1f} s after a step of {step_s:.1f} s; "
                + self._advice(1.5 * (save_s + step_s) + 5))


class CommandLineError(ValueError):
    """An argument of ``train.py`` is unknown, missing or malformed (argparse's message, on one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, raised, instead of usage and exit 2
        raise CommandLineError(f"{message} (python train.py --help lists the options)")


def parse_args(argv=None) -> argparse.Namespace:
    """``train.py``'s command line.

    Raises:
        CommandLineError: an unknown, missing or malformed argument (``--help`` still prints and exits 0).
    """
    models = sorted(MODELS)
    parser = _Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config.json", help="JSON config (default: config.json)")
    parser.add_argument("--model", choices=models, default=models[0] if models else None,
                        help=f"which model of model.py to train (default: {models[0] if models else 'none'})")
    parser.add_argument("--dataset-path", help="LJSpeech-layout folder; overrides data.dataset_path (default: "
                                               "SageMaker's SM_CHANNEL_TRAINING when set)")
    parser.add_argument("--output-dir", help="checkpoints, logs, metrics (default: Vertex AI's AIP_CHECKPOINT_DIR, "
                                             f"SageMaker's {SAGEMAKER_CHECKPOINTS}, else output)")
    parser.add_argument("--max-steps", type=int, help="optimizer steps to train; overrides train.max_steps")
    parser.add_argument("--resume", default="auto",
                        help="auto: continue from OUTPUT/checkpoint_last.pt if present; none; or a checkpoint path")
    parser.add_argument("--init-from", metavar="WEIGHTS",
                        help="start from these weights, with a fresh optimizer at step 0 (fine-tuning): a checkpoint "
                             "of this project, or NVIDIA's Tacotron2 or WaveGlow checkpoint, or jik876's HiFi-GAN "
                             "generator; an --output-dir with its own checkpoint resumes that instead")
    parser.add_argument("--tiny", action="store_true", help="apply the config's tiny block (CPU smoke runs)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    # SageMaker passes hyperparameters as --name value: --train.lr 1e-4 is --set train.lr=1e-4, --tiny True is --tiny
    args = parser.parse_args(hyperparameter_argv(sys.argv[1:] if argv is None else argv, ["--tiny"]))
    if args.model is None:
        parser.error("model.py registers no model: add one in models/ (see model.py)")
    args.output_dir = args.output_dir or default_output_dir(os.environ)
    args.dataset_path = args.dataset_path or default_dataset_path(os.environ)
    return args


def load_run_config(args: argparse.Namespace) -> Config:
    """The config file with ``--tiny``, ``--set``, ``--dataset-path`` and ``--max-steps`` applied."""
    overrides = list(args.set)
    if args.dataset_path:
        overrides.append(f"data.dataset_path={args.dataset_path}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    return load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides)


def setup_precision(precision: str, device: torch.device):
    """Return ``(autocast context factory, GradScaler)`` for ``fp32 | tf32 | bf16 | fp16``.

    TF32 matmuls/convolutions are enabled for every mode but fp32. The scaler is enabled for fp16 only
    (elsewhere it passes gradients through unchanged).
    """
    allow_tf32 = precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        autocast = nullcontext
    else:
        def autocast():
            return torch.autocast(device_type=device.type, dtype=dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    return autocast, scaler


def lr_lambda(cfg: Config):
    """Multiplier of the base learning rate at a step: linear warm-up, then constant or cosine to 1%."""
    warmup, total = cfg.train.warmup_steps, cfg.train.max_steps

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.train.lr_schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0
    return factor


def to_device(batch: dict, device: torch.device, prepare: Optional[Callable[[dict], dict]] = None) -> dict:
    """Move every tensor of a batch dict to ``device`` (non-blocking from pinned memory), then apply
    ``prepare`` if given (the model's ``on_device`` hook, from :func:`on_device_hook`)."""
    batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    return batch if prepare is None else prepare(batch)


def on_device_hook(spec: ModelSpec, cfg: Config) -> Optional[Callable[[dict], dict]]:
    """The model's ``ModelSpec.on_device`` bound to ``cfg`` (``batch -> batch``), or None when it has none."""
    return (lambda batch: spec.on_device(batch, cfg)) if spec.on_device is not None else None


def make_loader(dataset, spec: ModelSpec, cfg: Config, batch_size: int, rank: int, world_size: int, train: bool,
                device: torch.device) -> DataLoader:
    """A DataLoader over this rank's shard, with workers and pinned memory on CUDA.

    With ``data.persistent_workers`` the workers live for the whole run (no start-up at every epoch
    boundary); the dataset's epoch reaches them through shared memory (``utils.data_utils.SharedEpoch``),
    and random crops are seeded by seed, epoch and index, which is what makes a resumed run exact.
    """
    if train and cfg.data.batching == "buckets":  # one batch of similar lengths per step (LengthBucketSampler)
        if not callable(getattr(dataset, "lengths", None)):
            raise ConfigError(f"data.batching=buckets: the training dataset ({type(dataset).__name__}) has no "
                              "lengths() method giving each item's length; add one or use data.batching=random")
        batching = dict(batch_sampler=LengthBucketSampler(dataset.lengths(), batch_size, world_size, rank,
                                                          cfg.train.seed, cfg.data.bucket_pool))
    else:
        batching = dict(batch_size=batch_size, drop_last=train, sampler=ResumableDistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=cfg.train.seed, drop_last=train))
    workers = cfg.data.num_workers
    # Its own generator: starting an epoch's workers must not draw from the global RNG that dropout uses,
    # or a run resumed mid-epoch would see other dropout masks than the run that never stopped.
    generator = torch.Generator().manual_seed(cfg.train.seed + rank)
    return DataLoader(dataset, **batching, num_workers=workers,
                      collate_fn=spec.collate_fn, pin_memory=device.type == "cuda",
                      prefetch_factor=cfg.data.prefetch_factor if workers else None, generator=generator,
                      worker_init_fn=ignore_stop_signals if workers else None,
                      persistent_workers=bool(workers) and cfg.data.persistent_workers)


def epoch_order(loader: DataLoader) -> tuple[Any, int]:
    """The loader's sampler that orders its epochs (``set_epoch(epoch, start=k)``, ``num_replicas``) and the
    samples one step of all ranks reads (the global batch, without accumulation)."""
    if isinstance(loader.batch_sampler, LengthBucketSampler):
        return loader.batch_sampler, loader.batch_sampler.batch_size * loader.batch_sampler.num_replicas
    return loader.sampler, loader.batch_size * loader.sampler.num_replicas


def batch_stream(loader: DataLoader, state: TrainState):
    """Endless batches; each epoch reshuffles the shards (``set_epoch``), a resumed one skips what was read.

    Keeps ``state.epoch``, ``state.batch_in_epoch`` and ``state.samples_in_epoch`` (global: every rank's batch)
    up to date, so a checkpoint taken between two batches records exactly where the stream is.
    """
    sampler, global_batch = epoch_order(loader)
    while True:
        sampler.set_epoch(state.epoch, start=state.samples_in_epoch)
        if hasattr(loader.dataset, "set_epoch"):
            loader.dataset.set_epoch(state.epoch)
        with stop_signals_blocked():
            epoch_batches = iter(loader)  # starts the workers
        for batch in epoch_batches:
            state.batch_in_epoch += 1
            state.samples_in_epoch += global_batch
            yield batch
        state.epoch, state.batch_in_epoch, state.samples_in_epoch = state.epoch + 1, 0, 0


def check_output_dir(path: Path) -> None:
    """Create the output folder and make sure it is writable (before any training time is spent)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_test_{time.time_ns()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"output folder {path} is not writable: {err.strerror or err}") from None


def git_commit() -> str | None:
    """The project's git commit, when it is a git checkout (provenance for checkpoints)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
"""What a scheduler or a person sends to stop a run: SIGTERM, SIGUSR1 (SLURM, Kubernetes, torchrun) and SIGINT
(Ctrl-C)."""


class StopRequest:
    """Remembers a stop signal (:data:`STOP_SIGNALS`) instead of dying of it.

    The loop finishes its step, all ranks agree (the flag rides in the per-step all-reduce), rank 0 saves a
    checkpoint, and the run exits cleanly. A repeated signal changes nothing (a launcher may pass on a signal
    the rank also got directly); the third Ctrl-C raises ``KeyboardInterrupt``, which stops the rank at once
    without a checkpoint.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self.interrupts = 0
        if threading.current_thread() is threading.main_thread():  # Ray Train runs train.main in a worker thread:
            for sig in STOP_SIGNALS:                                # Python takes handlers in the main thread only
                signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT:
            self.interrupts += 1
            if self.interrupts >= 3:
                raise KeyboardInterrupt
        self.signal_name = self.signal_name or signal.Signals(signum).name


def end_dataloader_workers() -> list[int]:
    """End the DataLoader workers of this process that are still running; returns the pids it had to kill.

    On an error the loaders' iterators may outlive the loop (held by the exception's traceback), and their
    workers ignore stop signals (:func:`ignore_stop_signals`), so Python's exit, which terminates and then joins
    its child processes, would wait for them forever. A garbage collection first lets PyTorch shut them down
    its own way; any worker still running after that is killed (SIGKILL: it holds nothing worth saving).
    """
    gc.collect()
    killed = []
    for child in multiprocessing.active_children():
        child.join(timeout=0.5)
        if child.is_alive():
            child.kill()
            child.join(timeout=5)
            killed.append(child.pid)
    return killed


def last_checkpoint_path(output_dir: Path) -> Optional[Path]:
    """The ``checkpoint_last`` link of sharded checkpoints or ``OUTPUT/checkpoint_last.pt``, whichever exists
    (the link first), else ``None``."""
    last, link = output_dir / "checkpoint_last.pt", output_dir / "checkpoint_last"
    return link if link.is_dir() else last if last.is_file() else None


def last_checkpoint(output_dir: Path) -> str:
    """:func:`last_checkpoint_path` for error messages, with the folder a link names; else ``"none yet"``."""
    path = last_checkpoint_path(output_dir)
    if path is None:
        return "none yet"
    return f"{path} ({os.readlink(path)})" if path.is_symlink() else str(path)


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a worker leaves stop signals to its rank, which shuts it down.

    A scheduler signals every process of a job, DataLoader workers included; a worker that died of SIGTERM
    would make its rank fail ("DataLoader worker ... is killed by signal") instead of stopping cleanly.
    Signals that arrived before this ran were blocked (:func:`stop_signals_blocked`) and are dropped here.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_blocked():
    """Hold stop signals back (not lost: delivered on leaving) while DataLoader workers are started, so that a
    worker starts with them blocked until :func:`ignore_stop_signals` ignores them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@torch.no_grad()
def validate(model, criterion, loader, device, autocast, spec, prepare, step, writer, output_dir, is_main,
             cfg=None) -> float:
    """Mean validation loss over all ranks' shards (summed then all-reduced); rank 0 draws pictures.
    ``prepare``: the model's ``on_device`` hook (:func:`on_device_hook`) or None."""
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
        if i == 0 and spec.log_validation is not None:
            plain = whole_model(model, spec, cfg, device, is_main)
            if is_main:
                spec.log_validation(plain, batch, outputs, step, writer, output_dir, cfg=cfg)
    total = reduce_tensor(total, op="sum")
    model.train()
    return (total[0] / total[1].clamp(min=1)).item()


def whole_model(model, spec: ModelSpec, cfg: Config, device: torch.device, is_main: bool):
    """The model with all its weights on rank 0, for what rank 0 runs alone (validation pictures and audio):
    the plain module under DDP; under FSDP a copy built from the gathered weights (every rank calls this: the
    gathering is a collective; the other ranks get ``None``). Source:
    ``torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True, cpu_offload=True)``."""
    plain = unwrap_model(model)
    if not sharded_by_fsdp(plain):
        return plain
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    with collective("gathering of the sharded weights"):
        weights = get_model_state_dict(plain, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main:
        return None
    copy = spec.build_model(cfg)
    copy.load_state_dict(weights)
    return copy.to(device).eval()


def sharded_by_fsdp(model: torch.nn.Module) -> bool:
    """Whether FSDP2 shards ``model`` or any of its sub-modules (``train.parallelism=fsdp`` on several ranks)."""
    from torch.distributed.fsdp import FSDPModule
    return any(isinstance(module, FSDPModule) for module in model.modules())


def prepare_run(cfg: Config, spec: ModelSpec, output_dir: Path) -> tuple[str, object]:
    """Rank 0's checks before any training time is spent: a writable output folder, then every clip of the
    corpus (:mod:`utils.data_check`). The outcome is ``("error", message)`` or ``("skip", ids to leave out)``,
    which rank 0 broadcasts so that every rank acts on it.

    Bad clips are of two kinds, listed together (first the corpus lines, in file order, then the clips, in
    corpus order): corpus lines that name no usable clip (a malformed line, listed as ``metadata.csv:<line>``;
    a repeated id; an empty transcript; a wav that is missing or a folder: :func:`load_splits` with a ``bad``
    list), and clips that cannot be trained on (unreadable, truncated, too short, silent, a transcript without
    a usable character: :func:`check_corpus`). With ``data.on_bad_clip=skip`` they are listed in
    ``OUTPUT/skipped_clips.txt`` (id, path, reason per line), a warning line says how many and names the first
    20, and their ids are returned for ``data.exclude``; with ``error`` the message names the first 20 and how many
    there are.
    """
    listed: list = []  # the corpus lines load_splits refused (BadClip)
    try:
        check_output_dir(output_dir)
        train_utts, val_utts = load_splits(cfg.data, bad=listed)
    except (ConfigError, DataError) as err:
        return "error", one_line(err)
    text_check = (lambda text: spec.check_text(text, cfg)) if spec.check_text is not None else None
    bad = listed + check_corpus([*train_utts, *val_utts], cfg.audio.sampling_rate,
                                MelSpectrogram.from_config(cfg.audio).min_samples, text_check,
                                cache_file=default_cache_file(cfg.data.dataset_path), progress=True)
    if not bad:
        return "skip", []
    if cfg.data.on_bad_clip == "error":
        return "error", (f"{describe(bad)} (in {cfg.data.dataset_path}); fix or remove them, or set "
                         "data.on_bad_clip=skip to train without them")
    listing = output_dir / "skipped_clips.txt"
    atomic_write_bytes(listing, "".join(f"{c.id}\t{c.path}\t{c.reason}\n" for c in bad).encode())
    print(f"warning: leaving out {len(bad)} bad clip(s), listed in {listing} ({describe(bad)})", file=sys.stderr,
          flush=True)
    return "skip", [clip.id for clip in bad]


def agreed_resume_path(resume: str, output_dir: Path, rank: int):
    """The checkpoint to resume from, decided by rank 0 (:func:`utils.checkpoint.resume_path`); every rank
    must see the same file there (or none), which holds when ``--output-dir`` is one shared folder.

    Raises:
        CheckpointError: on every rank, when rank 0's decision fails or a rank sees another file than rank 0.
    """
    def decide():
        try:
            path, notes = resume_path(resume, output_dir)
        except CheckpointError as err:
            return "error", str(err)
        for note in notes:
            print(note, file=sys.stderr, flush=True)
        return "ok", path
    kind, path = broadcast_object(decide() if rank == 0 else None)
    if kind == "error":
        raise CheckpointError(path)
    looked_at = path if path is not None else output_dir / "checkpoint_last.pt"

    def seen() -> str:
        try:
            stat = looked_at.stat()
        except OSError:
            return "no file"
        return f"{stat.st_size} bytes, modified {stat.st_mtime_ns}"
    views = all_gather_object(seen())
    others = [(r, view) for r, view in enumerate(views) if view != views[0]]
    if others:
        r, view = others[0]
        raise CheckpointError(f"ranks disagree about {looked_at}: rank 0 sees {views[0]}, rank {r} sees {view}; "
                              "--output-dir must be one folder shared by every node (a network file system)")
    return path


@contextlib.contextmanager
def model_config_errors(model_name: str):
    """A plain ValueError from building the model or its datasets is a bad value in the model's config section."""
    try:
        yield
    except (ConfigError, DataError):
        raise
    except ValueError as err:
        raise ConfigError(f"{model_name} config: {one_line(err)}") from None


@dataclasses.dataclass
class Phase:
    """One optimizer's share of a training step. A one-loss model has one phase, ``"model"``; a model with
    several optimizers (``ModelSpec.phases``) has one per optimizer, run in order (a GAN: the discriminator's,
    then the generator's), each over the same micro-batches.

    Attributes:
        name: the optimizer's name (``ModelSpec.phases``), or ``"model"``.
        plain: the network this optimizer trains, unwrapped.
        net: ``plain`` wrapped by :func:`distributed.apply_gradient_allreduce` (DDP: its gradients are
            all-reduced during this phase's backward only).
        optimizer, scheduler: its optimizer and LR scheduler; ``interval``: ``"step"`` or ``"epoch"``, when the
            scheduler steps.
        monitors: spike monitors of its loss and its gradient norm (:class:`utils.run_log.SpikeMonitor`).
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
    """What one phase measured over the step's micro-batches: its loss summed over them (a device scalar, of the
    mean loss), the gradient norm of its network, its named metrics (device scalars, summed likewise) and the
    seconds spent in forward passes."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    metrics: dict
    compute_time: float


class BufferGuard:
    """Takes back what a skipped step did to the model's buffers (BatchNorm's running statistics and batch
    count): a skipped step leaves the model exactly as it was, not only its weights.

    :meth:`save` before the step's forward (one copy of every buffer: a few kilobytes for BatchNorm),
    :meth:`restore` when the step is skipped. Without buffers both do nothing.
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


def next_micro_batches(batches, spec: ModelSpec, accum: int, device: torch.device, prepare=None):
    """The step's ``accum`` micro-batches on the device (``prepare``: the model's ``on_device`` hook, from
    :func:`on_device_hook`), with the items and utterance ids they hold and the seconds spent waiting for them."""
    micro, items, ids, t_data = [], 0, [], time.perf_counter()
    for _ in range(accum):
        batch = next(batches)
        items += spec.count_items(batch)  # on the CPU batch: no device synchronisation
        micro.append(to_device(batch, device, prepare))
        ids += batch.get("ids", [])
    return micro, items, ids, time.perf_counter() - t_data


def one_loss_step(criterion):
    """The training step of a one-loss model (no ``ModelSpec.train_step``): ``criterion(model(batch), batch)``."""
    def step(phase: str, nets: dict, batch: dict):
        return criterion(nets[phase](batch), batch), {}
    return step


@contextlib.contextmanager
def frozen(modules):
    """Parameters of ``modules`` need no gradient inside the block (their earlier flags come back after it): the
    other phases' networks, so that a phase's backward neither computes nor all-reduces their gradients."""
    flags = [(param, param.requires_grad) for module in modules for param in module.parameters()]
    for param, _ in flags:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param, flag in flags:
            param.requires_grad_(flag)


def forward_backward(phase: Phase, phases: list, step_fn, micro: list, scaler, autocast, world_size: int,
                     grad_clip: float) -> PhaseResult:
    """One phase over the step's micro-batches: forward and backward of each, then unscaling and clipping of the
    phase's gradients (no optimizer step yet). ``step_fn(phase, nets, batch) -> (loss, {name: scalar})``.

    The phase's DDP all-reduces (FSDP reduce-scatters) its gradients during the last micro-batch's backward
    only (:func:`distributed.no_sync` before it). ``nets`` gives the other phases' networks unwrapped and frozen (:func:`frozen`). fp16 losses are
    scaled by the one GradScaler of the step, as PyTorch's AMP recipe for several optimizers has it.
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
    """How a rank's compute time is measured for the straggler check (:class:`utils.run_log.BalanceMonitor`): CPU
    seconds of this process on the CPU (ranks sharing a machine's cores wait for one in turns, which is not slower
    computing), wall seconds on a GPU."""
    return time.process_time if device.type == "cpu" else time.perf_counter


def agree(result: PhaseResult, scaler, world_size: int, device: torch.device, counts: tuple = ()):
    """One small all-reduce per phase: the mean loss, the mean gradient norm (the same on every rank after DDP's
    all-reduce), how many ranks saw a non-finite loss or gradient norm (fp16 gradient overflows are left to the
    GradScaler), the mean of each named metric, and the sums of ``counts`` (stop requests, items).

    Returns ``(loss, grad_norm, n_bad, {name: mean}, [sum of each count])``.
    """
    bad = ~torch.isfinite(result.loss) | (~torch.isfinite(result.grad_norm) & (not scaler.is_enabled()))
    values = torch.stack([result.loss.float(), result.grad_norm.float(), bad.float(),
                          *(torch.as_tensor(v, device=device).float() for v in result.metrics.values()),
                          *(torch.tensor(float(c), device=device) for c in counts)])
    sums = reduce_tensor(values, op="sum").tolist()
    n = len(result.metrics)
    metrics = {name: value / world_size for name, value in zip(result.metrics, sums[3:3 + n])}
    return sums[0] / world_size, sums[1] / world_size, int(sums[2]), metrics, [int(c) for c in sums[3 + n:]]


def spike(loss: float, grad_norm: float, monitors: tuple[SpikeMonitor, SpikeMonitor], of: str = "") -> str | None:
    """What spiked this step (``"loss 9.1 is above 6 (3x the highest of its last 100 steps, 2)"``, the gradient norm
    likewise; ``of``: the phase, ``"loss of generator 9.1 ..."``), or ``None``. Both monitors see every finite step;
    a spike does not enter their windows."""
    found = []
    for name, value, monitor in (("loss", loss, monitors[0]), ("gradient norm", grad_norm, monitors[1])):
        if monitor.is_spike(value):
            found.append(monitor.describe(f"{name}{of}", value))
    return "; ".join(found) or None


def main(argv=None) -> int:
    """``python train.py``: 0 when done or stopped cleanly by a signal (130 after Ctrl-C without a launcher),
    1 with one ``ERROR:`` line otherwise. Also the callable entry for a framework that starts the processes and
    their process group itself (Ray Train: ``train.main(["--config", ...])`` in each worker): the existing group is
    used (``RANK``/``LOCAL_RANK`` as the framework sets them) and not destroyed at the end."""
    stop = StopRequest()  # first: a signal from here on stops the run cleanly instead of killing it
    try:
        args = parse_args(argv)
    except CommandLineError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 2
    with one_line_warnings():
        return run(args, stop)


def check_command_line(argv: list[str]) -> Optional[str]:
    """What ``multiproc.py`` asks before it starts any rank: the one line of the first problem of this command line
    found without a process group (arguments, the config and ``--set``, settings the model cannot honour, a corpus
    that is not there), or ``None``. Every rank checks the same again when it starts; found here it is said once,
    within seconds, instead of by every rank after its start-up."""
    try:
        args = parse_args(argv)
        cfg = load_run_config(args)
        check_settings(MODELS[args.model], args.model, cfg)
        load_splits(cfg.data, bad=[])  # the corpus is there and has utterances (its clips are checked by rank 0)
    except (CommandLineError, ConfigError, DataError) as err:
        return one_line(err)
    return None


def run(args: argparse.Namespace, stop: "StopRequest") -> int:
    """:func:`main` once the arguments are read: config, process group, training, and the exit status."""
    try:
        cfg = load_run_config(args)  # before the process group: a bad config fails alone, fast
        check_settings(MODELS[args.model], args.model, cfg)
    except ConfigError as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    # A process group made by the caller (Ray Train's workers) is used as it is, and left to the caller at the end.
    caller_group = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:
        dist = init_distributed(timeout_s=cfg.train.dist_timeout_s)
    except (ValueError, RuntimeError) as err:  # launcher variables, a GPU that is not there, the rendezvous
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    if "OMP_NUM_THREADS" not in os.environ:  # the user's choice, or the launcher's (1 per rank), stands
        torch.set_num_threads(cpu_threads(int(os.environ.get("LOCAL_WORLD_SIZE") or 1)))
    try:
        train(args, cfg, dist, stop)
    except KeyboardInterrupt:
        print(f"ERROR: rank {dist.rank}: interrupted (Ctrl-C three times): stopped without saving; "
              f"{Path(args.output_dir) / 'checkpoint_last.pt'} is the last checkpoint", file=sys.stderr)
        return 130
    except CollectiveError as err:  # its message names the rank, the collective and the timeout
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    except (ConfigError, DataError, CheckpointError, TrainingError) as err:
        print(f"ERROR: rank {dist.rank}: {one_line(err)}", file=sys.stderr)
        return 1
    except torch.distributed.DistBackendError as err:
        print(f"ERROR: rank {dist.rank}: a collective failed or timed out after {cfg.train.dist_timeout_s:.0f} s "
              f"(another rank hung or died): {one_line(err)}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a bug in model or data code, a full disk...: end the rank, never hang
        traceback.print_exc()  # the user's own code: where it failed matters
        print(f"ERROR: rank {dist.rank}: {type(err).__name__}: {one_line(err)} (traceback above); last "
              f"checkpoint: {last_checkpoint(Path(args.output_dir))}", file=sys.stderr, flush=True)
        return 1
    finally:
        end_dataloader_workers()
        if not caller_group:
            cleanup()
    under_launcher = "TORCHELASTIC_RUN_ID" in os.environ  # a launcher restarts ranks that exit non-zero
    return 130 if stop.signal_name == "SIGINT" and not under_launcher else 0


def check_settings(spec: ModelSpec, name: str, cfg: Config) -> None:
    """Refuse, before any process group, data or model exists, settings that cannot work with this model or would do
    nothing in the chosen mode (a setting is honoured or refused, never silently ignored).

    Raises:
        ConfigError: one line naming the setting and what to do instead.
    """
    train = cfg.train
    defaults = {field.name: field.default for field in dataclasses.fields(type(train))}
    if spec.build_scheduler is not None and (train.lr_schedule != defaults["lr_schedule"]
                                             or train.warmup_steps != defaults["warmup_steps"]):
        raise ConfigError(f"train.lr_schedule={train.lr_schedule}, train.warmup_steps={train.warmup_steps}: model "
                          f"'{name}' builds its own LR schedulers (ModelSpec.build_scheduler), which these settings "
                          f"would not change; leave them at {defaults['lr_schedule']} and {defaults['warmup_steps']}, or "
                          "schedule the learning rate in the model's build_scheduler")
    if train.activation_checkpointing != "none" and spec.blocks is None:
        raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{name}' names no "
                          "blocks to checkpoint (ModelSpec.blocks)")
    if train.activation_checkpointing != "selective" and \
            train.activation_checkpointing_every != defaults["activation_checkpointing_every"]:
        raise ConfigError(f"train.activation_checkpointing_every={train.activation_checkpointing_every} applies to "
                          "train.activation_checkpointing=selective only (it is "
                          f"{train.activation_checkpointing})")
    if cfg.data.batching == "buckets" and not spec.variable_length:
        raise ConfigError(f"data.batching=buckets: model '{name}' trains on items of one length (its ModelSpec does "
                          "not set variable_length), so there is no padding to save; use data.batching=random")
    if cfg.data.mel_dir:  # mels read from a folder (a vocoder fine-tuned on Tacotron2's teacher-forced mels)
        if spec.vocode is None:
            raise ConfigError(f"data.mel_dir={cfg.data.mel_dir}: model '{name}' is not a vocoder (its ModelSpec has no "
                              "vocode) and does not read mels from a folder; leave data.mel_dir empty")
        model_cfg, hop = cfg.section(name), cfg.audio.hop_length
        if getattr(model_cfg, "mel_on_device", False):
            raise ConfigError(f"data.mel_dir={cfg.data.mel_dir} with {name}.mel_on_device=true: the mels are read from "
                              f"data.mel_dir, not computed from the audio on the device; set {name}.mel_on_device=false "
                              "or data.mel_dir=\"\"")
        segment = getattr(model_cfg, "segment_length", None)
        if isinstance(segment, int) and segment % hop:
            nearest = " or ".join(str(n) for n in (segment // hop * hop, (segment // hop + 1) * hop) if n)
            raise ConfigError(f"{name}.segment_length={segment} is not a multiple of audio.hop_length={hop}: with "
                              f"data.mel_dir audio and mel are cropped together on frame boundaries; use {nearest}")
    if train.compile and spec.optimize_for_training is None:
        raise ConfigError(f"train.compile=true, but model '{name}' has no fast path "
                          "(ModelSpec.optimize_for_training)")
    if train.parallelism != "fsdp":
        for key, meaning in (("async_checkpoint", "writes sharded checkpoints in the background"),
                             ("reshard_after_forward", "frees a block's gathered weights after its forward")):
            if getattr(train, key) != defaults[key]:
                raise ConfigError(f"train.{key}={str(getattr(train, key)).lower()} does nothing with "
                                  f"train.parallelism={train.parallelism}: it {meaning} under "
                                  "train.parallelism=fsdp only")
        return
    if spec.phases:
        raise ConfigError(f"train.parallelism=fsdp with model '{name}', which trains several optimizers "
                          f"({', '.join(spec.phases)}): not supported yet (sharded per block, the network frozen "
                          "in the other phase's backward gives other losses than DDP); use train.parallelism=ddp")
    if train.precision == "fp16":
        raise ConfigError("train.precision=fp16 with train.parallelism=fsdp: FSDP2 mixed precision is bf16 "
                          "(set train.precision=bf16; fp16's loss scaling would need one verdict over every shard)")
    if train.compile:
        raise ConfigError("train.compile=true with train.parallelism=fsdp: the models' fast paths compile the "
                          "whole model, which FSDP's per-block hooks break; use one of the two")


def epochs_done(state: TrainState, loader: DataLoader) -> int:
    """Epochs read to the end: the current one counts once its last batch is read, i.e. when fewer samples than
    one global batch are left of it (the loop's position moves to the next epoch only when the next batch is
    asked for)."""
    left = len(loader.dataset) - state.samples_in_epoch
    return state.epoch + (left < epoch_order(loader)[1])


def build_optimizers(spec: ModelSpec, name: str, model, model_cfg, device: torch.device) -> dict:
    """``{phase: optimizer}`` from ``ModelSpec.build_optimizer``: ``{"model": optimizer}`` for a one-loss model,
    one per ``ModelSpec.phases`` name otherwise.

    Raises:
        TrainingError: it returned something else (e.g. a dict from a model that declares no phases).
    """
    built = spec.build_optimizer(model, model_cfg, device)
    if not spec.phases:
        if not isinstance(built, torch.optim.Optimizer):
            raise TrainingError(f"model '{name}': build_optimizer returned a {type(built).__name__}, not an optimizer; "
                                "a model with several optimizers names them in ModelSpec.phases, with networks "
                                "and train_step")
        return {"model": built}
    if not isinstance(built, dict) or set(built) != set(spec.phases) or \
            not all(isinstance(opt, torch.optim.Optimizer) for opt in built.values()):
        raise TrainingError(f"model '{name}': build_optimizer must return a dict of one optimizer per phase "
                            f"({', '.join(spec.phases)}); it returned {type(built).__name__} "
                            f"{sorted(built) if isinstance(built, dict) else ''}")
    return {phase: built[phase] for phase in spec.phases}


def build_scheduler(spec: ModelSpec, name: str, phase: str, optimizer, cfg: Config) -> tuple:
    """``(LR scheduler, "step" | "epoch")`` of one optimizer: the model's ``ModelSpec.build_scheduler``, or the
    ``train.lr_schedule`` multiplier (:func:`lr_lambda`) stepped every optimizer step.

    Raises:
        TrainingError: the model's scheduler names another interval.
    """
    if spec.build_scheduler is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg)), "step"
    scheduler, interval = spec.build_scheduler(phase, optimizer, cfg)
    if interval not in ("step", "epoch"):
        raise TrainingError(f"model '{name}': build_scheduler for '{phase}' must step per 'step' or 'epoch', "
                            f"not {interval!r}")
    return scheduler, interval


def build_ema(spec: ModelSpec, name: str, model, cfg: Config) -> Optional[EMA]:
    """``train.ema_decay``'s moving average of the weights of ``ModelSpec.inference_modules`` (:class:`utils.ema.EMA`)
    of the plain or FSDP-sharded ``model``, or ``None`` when the decay is 0.

    Raises:
        ConfigError: the model's ``inference_modules`` name no parameter.
    """
    if not cfg.train.ema_decay:
        return None
    try:
        return EMA(model, spec.inference_modules, cfg.train.ema_decay)
    except ValueError as err:
        raise ConfigError(f"train.ema_decay={cfg.train.ema_decay} with model '{name}': {err}") from None


def checkpoint_parts(spec: ModelSpec, optimizers: dict, schedulers: dict, scaler) -> dict:
    """The stateful objects a checkpoint holds besides the model (:data:`utils.checkpoint.STATEFUL_PARTS`): the
    optimizer and its scheduler, or for several phases ``{phase: ...}`` of each (:class:`NamedStates`)."""
    if not spec.phases:
        return {"optimizer": optimizers["model"], "scheduler": schedulers["model"][0], "scaler": scaler}
    return {"optimizer": NamedStates(optimizers),
            "scheduler": NamedStates({phase: scheduler for phase, (scheduler, _) in schedulers.items()}),
            "scaler": scaler}


def phase_networks(spec: ModelSpec, name: str, model) -> dict:
    """``{phase: network}``: ``{"model": model}`` for a one-loss model, else ``ModelSpec.networks``.

    Raises:
        TrainingError: ``ModelSpec.networks`` does not name one network per phase.
    """
    nets = {"model": model} if not spec.phases else spec.networks(model) if spec.networks is not None else None
    if not isinstance(nets, dict) or set(nets) != set(spec.phases or ("model",)):
        raise TrainingError(f"model '{name}': ModelSpec.networks must map each phase "
                            f"({', '.join(spec.phases or ('model',))}) to the network it trains")
    return nets


def prepare_model(spec: ModelSpec, name: str, model, cfg: Config) -> None:
    """What ``train.activation_checkpointing`` and ``train.parallelism=fsdp`` do to the model, in place, before
    its optimizers are built (FSDP replaces the parameters by their shards): checkpoint the chosen blocks of
    ``ModelSpec.blocks``, then shard each phase's network, block by block, then its root (the order torchtitan
    uses: recomputation inside, sharding outside).

    The combinations that cannot work were refused earlier (:func:`check_settings`).

    Raises:
        ConfigError: activation checkpointing of a model whose ``ModelSpec.blocks`` returns no block.
    """
    train = cfg.train
    blocks = list(spec.blocks(model)) if spec.blocks is not None else []
    if train.activation_checkpointing != "none":
        if not blocks:
            raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{name}' "
                              "names no blocks to checkpoint (ModelSpec.blocks)")
        apply_activation_checkpointing(blocks, train.activation_checkpointing, train.activation_checkpointing_every)
    if train.parallelism != "fsdp":
        return
    param_dtype = torch.bfloat16 if train.precision == "bf16" else None
    for net in phase_networks(spec, name, model).values():
        inside = {id(module) for module in net.modules()}
        apply_gradient_allreduce(net, "fsdp", blocks=[block for block in blocks if id(block) in inside],
                                 param_dtype=param_dtype, reshard_after_forward=train.reshard_after_forward)


def build_phases(spec: ModelSpec, name: str, model, optimizers: dict, schedulers: dict, cfg: Config) -> list:
    """One :class:`Phase` per optimizer, each network wrapped for the gradient all-reduce on its own (DDP; under
    FSDP, :func:`prepare_model` has sharded it already).

    Raises:
        TrainingError: ``ModelSpec.networks`` does not name one network per phase.
    """
    nets = phase_networks(spec, name, model)
    skip = "skip" in (cfg.train.on_nonfinite, cfg.train.on_spike)
    return [Phase(phase, nets[phase], apply_gradient_allreduce(nets[phase]), optimizer, *schedulers[phase],
                  tuple(SpikeMonitor(cfg.train.spike_factor, warmup=cfg.train.spike_warmup) for _ in "ln"),
                  BufferGuard(nets[phase]) if skip else None) for phase, optimizer in optimizers.items()]


def train(args: argparse.Namespace, cfg: Config, dist, stop: StopRequest) -> None:
    """The run: rank 0 holds the output folder (:class:`utils.checkpoint.RunLock`) while :func:`train_in` trains. A
    folder this run created and left empty (it failed before writing anything) is removed again."""
    output_dir = Path(args.output_dir)
    lock = RunLock(output_dir) if dist.is_main else None
    created = dist.is_main and not output_dir.exists()
    try:
        kind, found = broadcast_object(take_output_dir(output_dir, lock) if dist.is_main else None)
        if kind == "error":
            raise CheckpointError(found)
        train_in(args, cfg, dist, stop, output_dir)
    finally:
        if lock is not None:
            lock.release()
        if created and output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()


def take_output_dir(output_dir: Path, lock: RunLock) -> tuple[str, Optional[str]]:
    """Rank 0: create the output folder and hold its :class:`utils.checkpoint.RunLock` (one run per folder).
    Returns ``("ok", None)`` or ``("error", message)``, which rank 0 broadcasts."""
    try:
        check_output_dir(output_dir)
        note = lock.acquire()
    except (ConfigError, CheckpointError) as err:
        return "error", one_line(err)
    if note:
        print(note, file=sys.stderr, flush=True)
    return "ok", None


def train_in(args: argparse.Namespace, cfg: Config, dist, stop: StopRequest, output_dir: Path) -> None:
    """The run, once rank 0 holds the output folder: checks, model, data, resume, then the loop."""
    rank, world_size, device, is_main = dist.rank, dist.world_size, dist.device, dist.is_main
    spec, model_cfg = MODELS[args.model], cfg.section(args.model)
    kind, found = broadcast_object(prepare_run(cfg, spec, output_dir) if is_main else None)
    if kind == "error":
        raise DataError(found)
    cfg.data.exclude = sorted({*cfg.data.exclude, *found})  # load_splits leaves these out

    checkpoint_path = agreed_resume_path(args.resume, output_dir, rank)
    # Same seed everywhere for the weights (DDP also broadcasts rank 0's), then one seed per rank.
    torch.manual_seed(cfg.train.seed)
    with model_config_errors(args.model):
        model = spec.build_model(cfg)
    if args.init_from and checkpoint_path is None:
        initialise(model, args, cfg, is_main)
    elif args.init_from and is_main:
        print(f"note: --init-from {args.init_from} is not used: {output_dir} holds this run's own checkpoint, which it "
              "resumes", file=sys.stderr, flush=True)
    model = model.to(device)
    seed = cfg.train.seed + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    autocast, scaler = setup_precision(cfg.train.precision, device)
    criterion = spec.build_criterion(cfg)
    prepare_model(spec, args.model, model, cfg)
    ema = build_ema(spec, args.model, model, cfg)
    optimizers = build_optimizers(spec, args.model, model, model_cfg, device)
    schedulers = {name: build_scheduler(spec, args.model, name, optimizer, cfg) for name, optimizer in optimizers.items()}
    parts = checkpoint_parts(spec, optimizers, schedulers, scaler)

    with model_config_errors(args.model):
        train_set, val_set = spec.build_datasets(cfg)
    batch_size = model_cfg.batch_size
    train_loader = make_loader(train_set, spec, cfg, batch_size, rank, world_size, True, device)
    val_loader = make_loader(val_set, spec, cfg, batch_size, rank, world_size, False, device)
    if len(train_loader) == 0:
        raise DataError(f"{len(train_set)} training utterances are too few for batch_size {batch_size} "
                        f"x {world_size} processes; lower {args.model}.batch_size or add data")

    state, accumulation = TrainState(), cfg.train.grad_accumulation
    sharded = cfg.train.parallelism == "fsdp"
    if checkpoint_path is not None:
        if sharded and not is_sharded(checkpoint_path):
            raise CheckpointError(f"{checkpoint_path} is a single-file checkpoint (train.parallelism=ddp); continue "
                                  "it with train.parallelism=ddp (a ddp run reads sharded checkpoints too)")
        state, before = resume_training(checkpoint_path, model, parts, args.model, rank, world_size,
                                        map_location=device, config=cfg.to_dict(), train_utterances=len(train_set),
                                        ema=ema)
        if before["config"].get("train", {}).get("grad_accumulation", accumulation) == accumulation:
            accumulation, note = world_size_change(before["world_size"], before["grad_accumulation"], world_size,
                                                   batch_size, accumulation)
        else:  # the user changed train.grad_accumulation (named in the config warning): theirs, as given
            note = None
        state.batch_in_epoch = state.samples_in_epoch // (batch_size * world_size)
        if is_main:
            if note:
                print(note, file=sys.stderr, flush=True)
            print(f"resumed from {checkpoint_path} at step {state.step} (epoch {state.epoch}, "
                  f"sample {state.samples_in_epoch} of it)")
    if state.step >= cfg.train.max_steps:
        if is_main:
            print(f"nothing to train: {output_dir} is at step {state.step} and train.max_steps is "
                  f"{cfg.train.max_steps}; to train more, raise it (e.g. --max-steps {2 * cfg.train.max_steps})")
        return

    if cfg.train.compile:  # the model's fast path (torch.compile'd hot loops); same mathematics as eager
        model = spec.optimize_for_training(model, cfg)
    phases = build_phases(spec, args.model, model, optimizers, schedulers, cfg)
    log = RunLog(output_dir, enabled=is_main, total_steps=cfg.train.max_steps, initial_step=state.step,
                 data_advice=f"{spec.data_advice} (data.num_workers is {cfg.data.num_workers})",
                 tensorboard=tensorboard_dir(os.environ, str(output_dir)))
    if is_main:
        atomic_write_bytes(output_dir / "config.json", json.dumps(cfg.to_dict(), indent=2).encode())
        threads = f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""
        log.print(f"training {args.model} on {world_size} process(es), device {device}{threads}, precision "
                  f"{cfg.train.precision}; {len(train_set)} train / {len(val_set)} val utterances; "
                  f"global batch {batch_size * accumulation * world_size}"
                  + (f", parallelism {cfg.train.parallelism}" if sharded else "")
                  + (f"; validation with an EMA of the weights (decay {cfg.train.ema_decay})" if ema is not None else ""))
        if isinstance(train_loader.batch_sampler, LengthBucketSampler):
            lengths = train_loader.batch_sampler.lengths
            bucketed = padding_fraction(train_loader.batch_sampler.epoch_batches(), lengths)
            shuffled = padding_fraction(random_batches(len(lengths), batch_size, cfg.train.seed), lengths)
            log.print(f"batches of similar lengths (data.batching=buckets): {100 * bucketed:.1f}% of a batch is "
                      f"padding, against {100 * shuffled:.1f}% in random batches")
    checkpointer = ShardedCheckpointer(output_dir, rank, cfg.train.async_checkpoint, cfg.train.keep_last,
                                       cfg.train.dist_timeout_s) if sharded else None
    grace = GracePeriod(os.environ)
    if is_main:  # under FSDP every rank writes its own shards, in parallel
        nbytes = checkpoint_bytes([unwrap_model(model)], averages=int(ema is not None)) // (world_size if sharded else 1)
        if (warning := grace.check_estimate(nbytes, output_dir)) is not None:
            log.print(warning)

    def checkpoint() -> None:
        """Every rank hands its RNG states to rank 0, which writes the checkpoint (FSDP: every rank its shards). Weights
        holding NaN or inf are never saved: the last checkpoint stays the last good one, and no good one is pruned."""
        broken = nonfinite_weight(unwrap_model(model))
        if reduce_tensor(torch.tensor([float(broken is not None)], device=device), op="sum").item():
            raise TrainingError(f"step {state.step}: the weights are not finite ({broken or 'on another rank'}): not "
                                f"saved; last good checkpoint: {last_checkpoint(output_dir)}")
        rng = all_gather_object(capture_rng_state())
        info = dict(data_seed=cfg.train.seed, model_name=args.model, config=cfg.to_dict(),
                    train_utterances=len(train_set), grad_accumulation=accumulation,
                    torch_version=str(torch.__version__), git_commit=git_commit() if is_main else None)
        if ema is not None and sharded:  # every rank writes its shards of the averages beside the weights'
            info["ema_saved"] = True
        elif ema is not None:
            info["ema"] = ema.state_dict()
        if sharded:
            broadcast_buffers(model)  # rank 0's running statistics, whichever rank's copy DCP writes
            optimizer = parts["optimizer"]
            with collective("sharded checkpoint save"):
                path = checkpointer.save(state.step, model, list(optimizer.values()) if isinstance(
                    optimizer, NamedStates) else [optimizer], sharded_train_state(parts, state, rng, **info)
                    if is_main else None, extra={"ema": ema.state_dict()} if ema is not None else None)
            log.print(f"step {state.step}: " + (f"saving {path} in the background" if checkpointer.async_save
                                                 else f"saved {path}"))
        elif is_main:
            saved = training_checkpoint(model, parts, state, rng, **info)
            log.print(f"step {state.step}: saved {save_checkpoint(output_dir, saved, state.step, cfg.train.keep_last)}")

    batches = batch_stream(train_loader, state)
    prepare = on_device_hook(spec, cfg)
    step_fn = spec.train_step or one_loss_step(criterion)
    window = StepWindow()
    balance = BalanceMonitor(cfg.train.memory_imbalance, cfg.train.straggler_share, clock=clock_name(device))
    epochs_seen = epochs_done(state, train_loader)
    model.train()
    try:
        while state.step < cfg.train.max_steps:
            t_start = time.perf_counter()
            micro, items, ids, data_time = next_micro_batches(batches, spec, accumulation, device, prepare)
            step = state.step + 1
            compute_time = wait_time = 0.0
            losses, any_bad, overflows, stepped = {}, False, 0, {}
            for phase in phases:
                if phase.guard is not None:
                    phase.guard.save()
                result = forward_backward(phase, phases, step_fn, micro, scaler, autocast, world_size,
                                          cfg.train.grad_clip)
                compute_time += result.compute_time
                t_agree = time.perf_counter()
                counts = (stop.signal_name is not None, items) if phase is phases[-1] else ()
                loss, grad_norm, n_bad, metrics, counted = agree(result, scaler, world_size, device, counts)
                wait_time += time.perf_counter() - t_agree  # mostly waiting for the slowest rank
                any_bad |= bool(n_bad)
                overflow = scaler.is_enabled() and not math.isfinite(grad_norm)  # the GradScaler skips this update
                overflows += overflow
                skipped = overflow
                if len(phases) > 1:
                    losses.update({f"loss_{phase.name}": loss, f"grad_norm_{phase.name}": grad_norm, **metrics})
                # Every rank reaches the same verdict: it is made from all-reduced values only.
                of = f" of {phase.name}" if len(phases) > 1 else ""
                kind, message = ("nonfinite", f"non-finite loss or gradient norm{of} (loss {loss}, grad norm "
                                              f"{grad_norm})") if n_bad else ("spike", spike(loss, grad_norm,
                                                                                             phase.monitors, of))
                if message is not None:
                    action = cfg.train.on_nonfinite if kind == "nonfinite" else cfg.train.on_spike
                    all_ids = sum(all_gather_object(ids), [])
                    if action == "stop":
                        raise TrainingError(f"step {step}: {message}; batch utterances: "
                                            f"{', '.join(map(str, all_ids))}; last good checkpoint: "
                                            f"{last_checkpoint(output_dir)}")
                    if action == "skip":
                        phase.optimizer.zero_grad(set_to_none=True)  # nothing to apply: its step is a no-op
                        phase.guard.restore()
                        state.skipped_steps += 1
                        skipped = True
                        message += f": step skipped ({state.skipped_steps} so far)"
                    log.anomaly(step, kind, f"{message}; last good checkpoint: {last_checkpoint(output_dir)}",
                                all_ids)
                scaler.step(phase.optimizer)  # before the next phase's forward: it sees the updated network
                stepped[phase.name] = not skipped
                if ema is not None and not skipped:  # after a real update only (not a skip, not an fp16 overflow)
                    ema.update(phase.net)
                # An fp16 overflow is the GradScaler searching its scale, until that falls below 1: from then on the
                # gradients are not finite even unscaled, and the skip counts towards train.max_skips_in_a_row.
                searching = overflow and skipped and scaler.get_scale() >= 1.0
                count_skips(state, phase.name, skipped, searching, cfg.train.max_skips_in_a_row, step, of,
                            last_checkpoint(output_dir))
            n_stop, items = counted
            scaler.update()  # once per step, after every optimizer (PyTorch's AMP recipe)
            done_epochs = epochs_done(state, train_loader)
            for phase in phases:
                if phase.interval == "step" and stepped[phase.name]:  # a skipped update does not advance its schedule
                    phase.scheduler.step()
                for _ in range(done_epochs - epochs_seen if phase.interval == "epoch" else 0):
                    phase.scheduler.step()  # an epoch ended in this step
                phase.optimizer.zero_grad(set_to_none=True)
            epochs_seen = done_epochs
            state.step = step
            step_s = time.perf_counter() - t_start
            window.add(None if any_bad else loss, items, step_s, data_time, wait_time, compute_time, losses=losses,
                       overflows=overflows)
            log.step_done()

            last_step = step == cfg.train.max_steps
            if step % cfg.train.log_interval == 0 or last_step:
                ranks = all_gather_object(window.balance(device))  # one small exchange per log interval
                for warning in (balance.check(step, ranks) if is_main else []):
                    log.print(warning)
                log.metrics(window.row(step=step, epoch=state.epoch, lr=phases[-1].optimizer.param_groups[0]["lr"],
                                       grad_norm=grad_norm if math.isfinite(grad_norm) else None,
                                       skipped_steps=state.skipped_steps, skipped_updates=dict(state.skipped_updates),
                                       **{key: [r[key] for r in ranks] for key in ranks[0]}))
                window = StepWindow()
            if step % cfg.train.val_interval == 0 or last_step:
                with ema.applied() if ema is not None else contextlib.nullcontext():  # the weights inference uses
                    val_loss = validate(phases[0].net if len(phases) == 1 else model, criterion, val_loader, device,
                                        autocast, spec, prepare, step, log.writer, output_dir, is_main, cfg=cfg)
                log.validation(step, state.epoch, val_loss)
            if checkpointer is not None and (done := checkpointer.poll()) is not None:
                log.print(f"step {step}: saved {done} (written in the background)")
            if n_stop or step % cfg.train.checkpoint_interval == 0 or last_step:
                t_save = time.perf_counter()
                checkpoint()
                if is_main and (warning := grace.check_save(step, time.perf_counter() - t_save, step_s)) is not None:
                    log.print(warning)
            if n_stop:
                finish_checkpoint(checkpointer, log)
                log.print(f"stopped at step {step} on {stop.signal_name or 'another rank’s signal'}; resume with "
                          f"the same command (--resume auto reads {last_checkpoint_path(output_dir)})")
                return
        finish_checkpoint(checkpointer, log)
    finally:
        if checkpointer is not None and checkpointer.pending is not None:  # an error: still finish the last save
            try:
                finish_checkpoint(checkpointer, log)
            except (CheckpointError, CollectiveError) as err:
                log.print(f"warning: the background checkpoint save did not finish ({one_line(err)}); the previous "
                          "checkpoint is intact")
        log.close()  # also on an error, so that its ERROR line starts a line of its own
    if is_main:
        print(f"done: {state.step} steps; checkpoint {last_checkpoint_path(output_dir)}")


def initialise(model: torch.nn.Module, args: argparse.Namespace, cfg: Config, is_main: bool) -> None:
    """``--init-from``: the weights of a checkpoint of this project or of a published one
    (:mod:`utils.published`) into the freshly built ``model`` (every rank reads the file).

    Raises:
        CheckpointError: the file is unreadable, of another model, or does not fit this run's config.
    """
    from utils.checkpoint import load_sharded_model
    from utils.published import load_into, read_weights

    weights = read_weights(args.init_from, MODELS, cfg)
    if weights.model_name != args.model:
        raise CheckpointError(f"--init-from {args.init_from} holds a '{weights.model_name}' model; this run trains "
                              f"'{args.model}' (--model {weights.model_name}?)")
    if is_sharded(args.init_from):
        load_sharded_model(args.init_from, model)
        kept = []
    else:
        kept = load_into(model, weights, args.init_from)
    if is_main:
        fresh = f"; {', '.join(prefix.rstrip('.') for prefix in kept)} start afresh" if kept else ""
        print(f"initialised {args.model} from {args.init_from}, {weights.source}{fresh}; a fresh optimizer, step 0",
              file=sys.stderr, flush=True)


def nonfinite_weight(model: torch.nn.Module) -> Optional[str]:
    """The name of the first floating-point parameter or buffer of ``model`` holding NaN or inf (this rank's shard of
    it under FSDP), or ``None``. One device synchronisation."""
    from torch.distributed.tensor import DTensor

    named = [(name, tensor.to_local() if isinstance(tensor, DTensor) else tensor)
             for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_floating_point()]
    if not named:
        return None
    finite = torch.stack([torch.isfinite(tensor.detach()).all() for _, tensor in named]).cpu()
    return None if bool(finite.all()) else named[int((~finite).nonzero()[0])][0]


def count_skips(state: TrainState, phase: str, skipped: bool, searching: bool, limit: int, step: int, of: str,
                last: str) -> None:
    """Count a phase's skipped update (a non-finite loss or gradient, a spike skipped by policy, an fp16 overflow the
    GradScaler skipped) in ``state.skipped_updates`` and its run of skips in ``state.skips_in_a_row``; an overflow
    while the GradScaler is still searching its scale (``searching``) neither extends nor breaks that run.

    Raises:
        TrainingError: ``limit`` (``train.max_skips_in_a_row``; 0: none) updates in a row were skipped: the run does not
            recover by skipping (a learning rate far too high, weights already broken), so it stops naming the last
            good checkpoint.
    """
    if skipped:
        state.skipped_updates[phase] = state.skipped_updates.get(phase, 0) + 1
    if not searching:
        state.skips_in_a_row[phase] = state.skips_in_a_row.get(phase, 0) + 1 if skipped else 0
    if limit and state.skips_in_a_row.get(phase, 0) >= limit:
        raise TrainingError(f"step {step}: the update{of} was skipped {state.skips_in_a_row[phase]} steps in a row "
                            "(non-finite loss or gradients, spikes or fp16 overflows; train.max_skips_in_a_row is "
                            f"{limit}): skipping does not recover this run (a learning rate too high? broken weights?); "
                            f"last good checkpoint: {last}")


def finish_checkpoint(checkpointer: Optional[ShardedCheckpointer], log: RunLog) -> None:
    """Wait for a checkpoint being written in the background (``train.async_checkpoint``) and complete it: a run
    never ends with half a checkpoint."""
    if checkpointer is not None and checkpointer.pending is not None:
        with collective("background checkpoint save"):
            done = checkpointer.wait()
        log.print(f"saved {done} (written in the background)")


if __name__ == "__main__":
    sys.exit(main())
