"""Train a model of ``model.py`` on one process, one GPU per process, or many machines.

    python train.py --config config.json                              # one process
    python multiproc.py train.py --config config.json                 # one process per GPU (DDP)
    python multiproc.py --nproc-per-node 2 train.py --config config.json --tiny   # CPU smoke run

The loop knows no model: it takes a :class:`model.ModelSpec` from ``model.MODELS``. Each step reads
``grad_accumulation`` micro-batches; DistributedDataParallel all-reduces the gradients (averaged over
ranks) during the last micro-batch's backward, so every replica takes the same optimizer step. Then one
small all-reduce per step agrees on the loss, on whether it is finite, and on whether a rank was asked to
stop (SIGTERM/SIGUSR1). Only rank 0 writes: progress bar, TensorBoard, ``metrics.jsonl``, checkpoints.

A checkpoint holds everything the next step depends on (weights, optimizer, LR schedule, GradScaler,
step, epoch and position inside it, every rank's RNG states), so ``--resume auto`` continues exactly
where the run stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from distributed import (CollectiveError, all_gather_object, apply_gradient_allreduce, cleanup, collective,
                         init_distributed, reduce_tensor, unwrap_model)
from model import MODELS
from utils.checkpoint import (CheckpointError, atomic_write_bytes, capture_rng_state, load_checkpoint,
                              load_model_state, restore_rng_state, save_checkpoint)
from utils.config import SHARED_SECTIONS, Config, ConfigError, load_config
from utils.data_utils import DataError, ResumableDistributedSampler
from utils.run_log import LossMonitor, RunLog, StepWindow, one_line


class TrainingError(RuntimeError):
    """The run cannot go on (e.g. a non-finite loss with ``train.on_nonfinite=stop``)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="config.json", help="JSON config (default: config.json)")
    parser.add_argument("--model", choices=sorted(MODELS), default=next(iter(MODELS)),
                        help=f"which model of model.py to train (default: {next(iter(MODELS))})")
    parser.add_argument("--dataset-path", help="LJSpeech-layout folder; overrides data.dataset_path")
    parser.add_argument("--output-dir", default="output", help="checkpoints, logs, metrics (default: output)")
    parser.add_argument("--max-steps", type=int, help="optimizer steps to train; overrides train.max_steps")
    parser.add_argument("--resume", default="auto",
                        help="auto: continue from OUTPUT/checkpoint_last.pt if present; none; or a checkpoint path")
    parser.add_argument("--tiny", action="store_true", help="apply the config's tiny block (CPU smoke runs)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    return parser.parse_args(argv)


def load_run_config(args: argparse.Namespace) -> Config:
    """The config file with ``--tiny``, ``--set``, ``--dataset-path`` and ``--max-steps`` applied."""
    overrides = list(args.set)
    if args.dataset_path:
        overrides.append(f"data.dataset_path={args.dataset_path}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    schemas = {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
    return load_config(args.config, schemas, tiny=args.tiny, overrides=overrides)


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


def to_device(batch: dict, device: torch.device) -> dict:
    """Move every tensor of a batch dict to ``device`` (non-blocking from pinned memory)."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def make_loader(dataset, spec, cfg: Config, batch_size: int, rank: int, world_size: int, train: bool,
                device: torch.device) -> DataLoader:
    """A DataLoader over this rank's shard, with workers and pinned memory on CUDA.

    Workers are not persistent: each epoch starts them anew with the dataset's current epoch (random
    crops are seeded by seed, epoch and index, which is what makes a resumed run exact).
    """
    sampler = ResumableDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=train,
                                          seed=cfg.train.seed, drop_last=train)
    workers = cfg.data.num_workers
    # Its own generator: starting an epoch's workers must not draw from the global RNG that dropout uses,
    # or a run resumed mid-epoch would see other dropout masks than the run that never stopped.
    generator = torch.Generator().manual_seed(cfg.train.seed + rank)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      collate_fn=spec.collate_fn, pin_memory=device.type == "cuda", drop_last=train,
                      prefetch_factor=cfg.data.prefetch_factor if workers else None, generator=generator)


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


class StopRequest:
    """Remembers a SIGTERM or SIGUSR1 (what SLURM and Kubernetes send before preemption).

    The loop finishes its step, all ranks agree (the flag rides in the per-step all-reduce), rank 0
    saves a checkpoint, and the run exits cleanly.
    """

    def __init__(self):
        self.signal_name: str | None = None
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name


@torch.no_grad()
def validate(model, criterion, loader, device, autocast, spec, step, writer, output_dir, is_main) -> float:
    """Mean validation loss over all ranks' shards (summed then all-reduced); rank 0 draws pictures."""
    model.eval()
    total = torch.zeros(2, device=device, dtype=torch.float64)  # (sum of losses, number of batches)
    for i, batch in enumerate(loader):
        batch = to_device(batch, device)
        with autocast():
            outputs = model(batch)
            loss = criterion(outputs, batch)
        total += torch.stack([loss.detach().double(), torch.ones((), device=device, dtype=torch.float64)])
        if i == 0 and is_main and spec.log_validation is not None:
            spec.log_validation(unwrap_model(model), batch, outputs, step, writer, output_dir)
    total = reduce_tensor(total, op="sum")
    model.train()
    return (total[0] / total[1].clamp(min=1)).item()


@contextlib.contextmanager
def model_config_errors(model_name: str):
    """A plain ValueError from building the model or its datasets is a bad value in the model's config section."""
    try:
        yield
    except (ConfigError, DataError):
        raise
    except ValueError as err:
        raise ConfigError(f"{model_name} config: {one_line(err)}") from None


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_run_config(args)  # before the process group: a bad config fails alone, fast
    except ConfigError as err:
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    try:
        dist = init_distributed(timeout_s=cfg.train.dist_timeout_s)
    except (ValueError, RuntimeError) as err:  # launcher variables, a GPU that is not there, the rendezvous
        print(f"ERROR: {one_line(err)}", file=sys.stderr)
        return 1
    try:
        train(args, cfg, dist)
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
    finally:
        cleanup()
    return 0


def train(args: argparse.Namespace, cfg: Config, dist) -> None:
    rank, world_size, device = dist.rank, dist.world_size, dist.device
    is_main = rank == 0
    spec = MODELS[args.model]
    model_cfg = cfg.section(args.model)
    output_dir = Path(args.output_dir)
    if is_main:
        check_output_dir(output_dir)
    stop = StopRequest()

    # Same seed everywhere for the weights (DDP also broadcasts rank 0's), then one seed per rank.
    torch.manual_seed(cfg.train.seed)
    with model_config_errors(args.model):
        model = spec.build_model(cfg).to(device)
    seed = cfg.train.seed + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    autocast, scaler = setup_precision(cfg.train.precision, device)
    criterion = spec.build_criterion(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=model_cfg.learning_rate,
                                 weight_decay=model_cfg.weight_decay, fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))

    with model_config_errors(args.model):
        train_set, val_set = spec.build_datasets(cfg)
    train_loader = make_loader(train_set, spec, cfg, model_cfg.batch_size, rank, world_size, True, device)
    val_loader = make_loader(val_set, spec, cfg, model_cfg.batch_size, rank, world_size, False, device)
    if len(train_loader) == 0:
        raise DataError(f"{len(train_set)} training utterances are too few for batch_size {model_cfg.batch_size} "
                        f"x {world_size} processes; lower {args.model}.batch_size or add data")

    # --- resume -------------------------------------------------------------------------------
    step, epoch, batch_in_epoch, skipped_steps = 0, 0, 0, 0
    resume_path = output_dir / "checkpoint_last.pt" if args.resume == "auto" else None
    if args.resume == "none" and (output_dir / "checkpoint_last.pt").exists():
        raise ConfigError(f"{output_dir} already holds checkpoint_last.pt, which --resume none would overwrite; "
                          "continue it with --resume auto, or start afresh in another --output-dir")
    if args.resume not in ("auto", "none"):
        resume_path = Path(args.resume)
        if not resume_path.is_file():
            raise CheckpointError(f"--resume {args.resume}: no such checkpoint")
    if resume_path is not None and resume_path.is_file():
        state = load_checkpoint(resume_path, map_location=device)
        if state.get("model_name") != args.model:
            raise CheckpointError(f"{resume_path} holds a '{state.get('model_name')}' model, not '{args.model}'")
        load_model_state(model, state["model"], str(resume_path))
        missing = [k for k in ("optimizer", "scheduler", "scaler", "step", "epoch", "batch_in_epoch", "rng")
                   if k not in state]
        if missing:
            raise CheckpointError(f"{resume_path} is not a training checkpoint of train.py (it has no "
                                  f"{', '.join(missing)}); --resume needs one written by train.py")
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        skipped_steps = state.get("skipped_steps", 0)
        if len(state["rng"]) == world_size:
            restore_rng_state(state["rng"][rank])
        elif is_main:
            print(f"warning: {resume_path} was written by {len(state['rng'])} processes, this run has "
                  f"{world_size}: random streams restart, so the run will not repeat the original exactly")
        if is_main:
            print(f"resumed from {resume_path} at step {step} (epoch {epoch}, batch {batch_in_epoch})")

    if cfg.train.compile:  # the model's fast path (torch.compile'd hot loops); same mathematics as eager
        if spec.optimize_for_training is None:
            raise ConfigError(f"train.compile=true, but model '{args.model}' has no fast path "
                              "(ModelSpec.optimize_for_training in model.py)")
        model = spec.optimize_for_training(model, cfg)
    model = apply_gradient_allreduce(model)
    log = RunLog(output_dir, enabled=is_main, total_steps=cfg.train.max_steps, initial_step=step)
    if is_main:
        atomic_write_bytes(output_dir / "config.json", json.dumps(cfg.to_dict(), indent=2).encode())
        log.print(f"training {args.model} on {world_size} process(es), device {device}, precision "
                  f"{cfg.train.precision}; {len(train_set)} train / {len(val_set)} val utterances; "
                  f"global batch {model_cfg.batch_size * cfg.train.grad_accumulation * world_size}")

    def batches():
        """Endless batch stream; each epoch reshuffles the shards (set_epoch), a resumed one skips ahead."""
        nonlocal epoch, batch_in_epoch
        while True:
            train_loader.sampler.set_epoch(epoch, start=batch_in_epoch * model_cfg.batch_size)
            if hasattr(train_set, "set_epoch"):
                train_set.set_epoch(epoch)
            for batch in train_loader:
                batch_in_epoch += 1
                yield batch
            epoch, batch_in_epoch = epoch + 1, 0

    def checkpoint() -> None:
        """Every rank hands its RNG states to rank 0, which writes the checkpoint."""
        rng = all_gather_object(capture_rng_state())
        if is_main:
            state = {"model": unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": step,
                     "epoch": epoch, "batch_in_epoch": batch_in_epoch, "skipped_steps": skipped_steps,
                     "rng": rng, "data_seed": cfg.train.seed, "model_name": args.model, "config": cfg.to_dict(),
                     "torch_version": str(torch.__version__), "git_commit": git_commit()}
            log.print(f"step {step}: saved {save_checkpoint(output_dir, state, step, cfg.train.keep_last)}")

    stream = batches()
    accum = cfg.train.grad_accumulation
    window, monitor = StepWindow(), LossMonitor(cfg.train.spike_factor)
    model.train()
    try:
        while step < cfg.train.max_steps:
            t_start = time.perf_counter()
            data_time, step_loss, items, ids = 0.0, torch.zeros((), device=device), 0, []
            for micro in range(accum):
                t_data = time.perf_counter()
                batch = to_device(next(stream), device)
                data_time += time.perf_counter() - t_data
                ids += batch.get("ids", [])
                # DDP all-reduces the gradients during the last micro-batch's backward only.
                sync = nullcontext() if micro == accum - 1 or world_size == 1 else model.no_sync()
                with sync:
                    with autocast():
                        loss = criterion(model(batch), batch) / accum
                    with collective("gradient all-reduce (DDP backward)"):
                        scaler.scale(loss).backward()
                step_loss += loss.detach().float()
                items += spec.count_items(batch)
            scaler.unscale_(optimizer)  # no-op unless fp16: clipping and the norm need the true gradients
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip or math.inf)

            # One small all-reduce: the loss, "not finite here", "stop asked here", and the items.
            # fp16 gradient overflows are left to the GradScaler, which skips the step and rescales.
            bad = ~torch.isfinite(step_loss) | (~torch.isfinite(grad_norm) & (not scaler.is_enabled()))
            flags = [step_loss, bad.float(), torch.tensor(float(stop.signal_name is not None)), torch.tensor(items)]
            total, n_bad, n_stop, items = reduce_tensor(torch.stack([f.to(device).float() for f in flags]),
                                                        op="sum").tolist()
            loss_mean = total / world_size
            step += 1
            if n_bad:
                all_ids = sum(all_gather_object(ids), [])
                message = f"non-finite loss or gradient norm (loss {loss_mean}, grad norm {grad_norm.item()})"
                if cfg.train.on_nonfinite == "stop":
                    last = output_dir / "checkpoint_last.pt"
                    raise TrainingError(f"step {step}: {message}; batch utterances: {', '.join(map(str, all_ids))}"
                                        f"; last good checkpoint: {last if last.exists() else 'none yet'}")
                optimizer.zero_grad(set_to_none=True)  # nothing to apply: the optimizer step below is a no-op
                skipped_steps += 1
                log.anomaly(step, "nonfinite", f"{message}: step skipped ({skipped_steps} so far)", all_ids)
            elif monitor.is_spike(loss_mean):
                log.anomaly(step, "spike", f"loss {loss_mean:.4f} is above {cfg.train.spike_factor}x its running "
                                           f"mean {monitor.mean:.4f}", sum(all_gather_object(ids), []))
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            window.add(None if n_bad else loss_mean, items, time.perf_counter() - t_start, data_time)
            log.step_done()

            if step % cfg.train.log_interval == 0 or step == cfg.train.max_steps:
                log.metrics(window.row(step=step, epoch=epoch, lr=optimizer.param_groups[0]["lr"],
                                       grad_norm=grad_norm.item(), skipped_steps=skipped_steps))
                window = StepWindow()
            if step % cfg.train.val_interval == 0 or step == cfg.train.max_steps:
                val_loss = validate(model, criterion, val_loader, device, autocast, spec, step, log.writer,
                                    output_dir, is_main)
                log.validation(step, epoch, val_loss)
            if n_stop or step % cfg.train.checkpoint_interval == 0 or step == cfg.train.max_steps:
                checkpoint()
            if n_stop:
                log.print(f"stopped at step {step} on {stop.signal_name or 'another rank’s signal'}; resume with "
                          f"the same command (--resume auto reads {output_dir / 'checkpoint_last.pt'})")
                return
    finally:
        log.close()  # also on an error, so that its ERROR line starts a line of its own
    if is_main:
        print(f"done: {step} steps; checkpoint {output_dir / 'checkpoint_last.pt'}")


if __name__ == "__main__":
    sys.exit(main())
