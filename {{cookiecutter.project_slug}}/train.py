"""Train a model of ``model.py`` on one process, one GPU per process, or many machines.

    python train.py --config config.json                              # one process
    python multiproc.py train.py --config config.json                 # one process per GPU (DDP)
    python multiproc.py --nproc-per-node 2 train.py --config config.json --tiny   # CPU smoke run

The loop knows no model: it takes a :class:`model.ModelSpec` from ``model.MODELS``. Each step reads
``grad_accumulation`` micro-batches; DistributedDataParallel all-reduces the gradients (averaged over
ranks) during the last micro-batch's backward, so every replica takes the same optimizer step. Only
rank 0 writes: progress bar, TensorBoard, ``metrics.jsonl`` and checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler
from tqdm import tqdm

from distributed import apply_gradient_allreduce, cleanup, init_distributed, reduce_tensor, unwrap_model
from model import MODELS
from utils.checkpoint import CheckpointError, load_checkpoint, load_model_state, save_checkpoint
from utils.config import SHARED_SECTIONS, Config, ConfigError, load_config
from utils.data_utils import DataError


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


def config_schemas() -> dict[str, type]:
    """Section name -> dataclass, for the shared sections and every registered model."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}


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


def to_device(batch: dict, device: torch.device) -> dict:
    """Move every tensor of a batch dict to ``device`` (non-blocking from pinned memory)."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def make_loader(dataset, spec, cfg: Config, batch_size: int, rank: int, world_size: int, train: bool,
                device: torch.device) -> DataLoader:
    """A DataLoader over this rank's shard (DistributedSampler), with workers and pinned memory on CUDA."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=train,
                                 seed=cfg.train.seed, drop_last=train)
    workers = cfg.data.num_workers
    generator = torch.Generator().manual_seed(cfg.train.seed + rank)  # per-rank seeds for worker RNG
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                      collate_fn=spec.collate_fn, pin_memory=device.type == "cuda", drop_last=train,
                      persistent_workers=workers > 0, prefetch_factor=cfg.data.prefetch_factor if workers else None,
                      generator=generator)


def check_output_dir(path: Path) -> None:
    """Create the output folder and make sure it is writable (before any training time is spent)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write_test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"output folder {path} is not writable: {err.strerror}") from None


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


def main(argv=None) -> int:
    args = parse_args(argv)
    dist = init_distributed()
    try:
        train(args, dist)
    except (ConfigError, DataError, CheckpointError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    finally:
        cleanup()
    return 0


def train(args: argparse.Namespace, dist) -> None:
    rank, world_size, device = dist.rank, dist.world_size, dist.device
    is_main = rank == 0
    overrides = list(args.set)
    if args.dataset_path:
        overrides.append(f"data.dataset_path={args.dataset_path}")
    if args.max_steps is not None:
        overrides.append(f"train.max_steps={args.max_steps}")
    cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides)
    spec = MODELS[args.model]
    model_cfg = cfg.section(args.model)
    output_dir = Path(args.output_dir)
    if is_main:
        check_output_dir(output_dir)

    # Same seed everywhere for the weights (DDP also broadcasts rank 0's), then one seed per rank.
    torch.manual_seed(cfg.train.seed)
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

    step, epoch = 0, 0
    resume_path = output_dir / "checkpoint_last.pt" if args.resume == "auto" else None
    if args.resume not in ("auto", "none"):
        resume_path = Path(args.resume)
        if not resume_path.is_file():
            raise CheckpointError(f"--resume {args.resume}: no such checkpoint")
    if resume_path is not None and resume_path.is_file():
        state = load_checkpoint(resume_path, map_location=device)
        if state.get("model_name") != args.model:
            raise CheckpointError(f"{resume_path} holds a '{state.get('model_name')}' model, not '{args.model}'")
        load_model_state(model, state["model"], str(resume_path))
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        step, epoch = state["step"], state["epoch"]
        if is_main:
            print(f"resumed from {resume_path} at step {step}")

    model = apply_gradient_allreduce(model)
    train_set, val_set = spec.build_datasets(cfg)
    train_loader = make_loader(train_set, spec, cfg, model_cfg.batch_size, rank, world_size, True, device)
    val_loader = make_loader(val_set, spec, cfg, model_cfg.batch_size, rank, world_size, False, device)
    if len(train_loader) == 0:
        raise DataError(f"{len(train_set)} training utterances are too few for batch_size {model_cfg.batch_size} "
                        f"x {world_size} processes; lower {args.model}.batch_size or add data")

    writer = metrics = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(output_dir / "tensorboard"))
        metrics = open(output_dir / "metrics.jsonl", "a")
        (output_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        print(f"training {args.model} on {world_size} process(es), device {device}, precision "
              f"{cfg.train.precision}; {len(train_set)} train / {len(val_set)} val utterances; "
              f"global batch {model_cfg.batch_size * cfg.train.grad_accumulation * world_size}")

    def batches():
        """Endless (epoch, batch) stream; each epoch reshuffles the shards (sampler.set_epoch)."""
        nonlocal epoch
        while True:
            train_loader.sampler.set_epoch(epoch)
            for batch in train_loader:
                yield epoch, batch
            epoch += 1

    def checkpoint():
        state = {"model": unwrap_model(model).state_dict(), "optimizer": optimizer.state_dict(),
                 "scaler": scaler.state_dict(), "step": step, "epoch": epoch, "model_name": args.model,
                 "config": cfg.to_dict(), "torch_version": str(torch.__version__)}
        return save_checkpoint(output_dir, state, step, cfg.train.keep_last)

    accum = cfg.train.grad_accumulation
    stream = batches()
    progress = tqdm(total=cfg.train.max_steps, initial=step, disable=not is_main, desc="train", unit="step",
                    dynamic_ncols=True)
    window = {"loss": torch.zeros((), device=device), "items": 0, "steps": 0, "step_time": 0.0, "data_time": 0.0}
    model.train()
    while step < cfg.train.max_steps:
        t_start = time.perf_counter()
        data_time = 0.0
        for micro in range(accum):
            t_data = time.perf_counter()
            _, batch = next(stream)
            data_time += time.perf_counter() - t_data
            batch = to_device(batch, device)
            last = micro == accum - 1
            # Skip the gradient all-reduce on all but the last micro-batch of the step.
            sync = nullcontext() if last or world_size == 1 else model.no_sync()
            with sync:
                with autocast():
                    outputs = model(batch)
                    loss = criterion(outputs, batch) / accum
                scaler.scale(loss).backward()
            window["loss"] += loss.detach().float()
            window["items"] += spec.count_items(batch)
        if cfg.train.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if device.type == "cuda" and step % cfg.train.log_interval == 0:
            torch.cuda.synchronize()
        window["steps"] += 1
        window["step_time"] += time.perf_counter() - t_start
        window["data_time"] += data_time
        progress.update(1)

        if step % cfg.train.log_interval == 0 or step == cfg.train.max_steps:
            stats = reduce_tensor(torch.stack([window["loss"] / window["steps"],
                                               torch.tensor(float(window["items"]), device=device)]), op="sum")
            loss_mean = stats[0].item() / world_size
            step_time = window["step_time"] / window["steps"]
            row = {"step": step, "epoch": epoch, "loss": loss_mean, "lr": optimizer.param_groups[0]["lr"],
                   "items_per_s": stats[1].item() / window["step_time"], "step_time_s": step_time,
                   "data_time_s": window["data_time"] / window["steps"]}
            if is_main:
                if not math.isfinite(loss_mean):
                    progress.write(f"warning: non-finite loss {loss_mean} at step {step}")
                if row["data_time_s"] > 0.1 * step_time:
                    progress.write(f"warning: step {step}: waiting {row['data_time_s']:.3f}s per step for data "
                                   f"({100 * row['data_time_s'] / step_time:.0f}% of the step); raise "
                                   "data.num_workers or cache mels (scripts/preprocess.py)")
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                for key in ("loss", "lr", "items_per_s", "step_time_s", "data_time_s"):
                    writer.add_scalar(f"train/{key}", row[key], step)
                progress.set_postfix(loss=f"{loss_mean:.4f}", items_s=f"{row['items_per_s']:.0f}")
            window = {"loss": torch.zeros((), device=device), "items": 0, "steps": 0, "step_time": 0.0,
                      "data_time": 0.0}

        if step % cfg.train.val_interval == 0 or step == cfg.train.max_steps:
            val_loss = validate(model, criterion, val_loader, device, autocast, spec, step, writer, output_dir,
                                is_main)
            if is_main:
                writer.add_scalar("val/loss", val_loss, step)
                with open(output_dir / "val_metrics.jsonl", "a") as handle:
                    handle.write(json.dumps({"step": step, "epoch": epoch, "val_loss": val_loss}) + "\n")
                progress.write(f"step {step}: validation loss {val_loss:.4f}")

        if is_main and (step % cfg.train.checkpoint_interval == 0 or step == cfg.train.max_steps):
            path = checkpoint()
            progress.write(f"step {step}: saved {path}")

    progress.close()
    if is_main:
        metrics.close()
        writer.close()
        print(f"done: {step} steps; checkpoint {output_dir / 'checkpoint_last.pt'}")


if __name__ == "__main__":
    sys.exit(main())
