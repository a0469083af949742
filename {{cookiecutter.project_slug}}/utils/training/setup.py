"""Everything the loop uses, built once per run (:func:`build_run`) in a fixed order, which is part of the behaviour:
every random draw happens where it always did, so a run repeats bit for bit."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader

from distributed import DistInfo, apply_gradient_allreduce, broadcast_object
from model import ModelSpec
from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.checkpoint.published import Weights, load_into, read_weights
from utils.checkpoint.resume import agreed_resume_path, resume_training, world_size_change
from utils.checkpoint.saver import Saver
from utils.checkpoint.sharded import is_sharded
from utils.config import Config, ConfigError
from utils.data.check import prepare_run
from utils.data.corpus import DataError
from utils.data.loader import batch_stream, make_loader, on_device_hook
from utils.data.samplers import LengthBucketSampler, padding_fraction, random_batches
from utils.errors import TrainingError
from utils.launch import tensorboard_dir
from utils.run_log import BalanceMonitor, RunLog
from utils.train_state import TrainState
from utils.training.activation_checkpoint import apply_activation_checkpointing
from utils.training.ema import EMA
from utils.training.guards import Anomalies, SpikeMonitor
from utils.training.optim import build_optimizers, build_scheduler, checkpoint_parts, setup_precision
from utils.training.settings import PROJECT_RECIPE, model_config_errors
from utils.training.step import BufferGuard, Phase, clock_name, one_loss_step


@dataclasses.dataclass
class Run:
    """What the loop in ``train.py`` reads and steps."""

    spec: ModelSpec
    cfg: Config
    dist: DistInfo
    output_dir: Path
    model: torch.nn.Module
    criterion: Callable
    phases: list[Phase]
    autocast: Callable
    scaler: torch.amp.GradScaler
    ema: Optional[EMA]
    state: TrainState
    accumulation: int
    train_loader: DataLoader
    val_loader: DataLoader
    log: RunLog
    saver: Saver
    anomalies: Anomalies
    balance: BalanceMonitor
    batches: Any
    prepare: Optional[Callable]
    step_fn: Callable


def build_run(models: dict[str, ModelSpec], args: argparse.Namespace, cfg: Config, dist: DistInfo) -> Optional[Run]:
    """The run of ``models[args.model]`` once rank 0 holds the output folder: the corpus checked by rank 0, the checkpoint
    to resume, the model (seeded, ``--init-from``, activation checkpointing, FSDP), precision, criterion, EMA, optimizers,
    loaders, the resumed position, the DDP-wrapped phases, the log and the saver. ``models`` is the registry (an
    ``--init-from`` file may hold any model). ``None`` when the checkpoint is at ``train.max_steps`` already (said).

    Raises:
        DataError, ConfigError, CheckpointError, TrainingError: one line each.
    """
    spec, output_dir = models[args.model], Path(args.output_dir)
    kind, found = broadcast_object(prepare_run(cfg, spec, output_dir) if dist.is_main else None)
    if kind == "error":
        raise DataError(found)
    cfg.data.exclude = sorted({*cfg.data.exclude, *found})  # load_splits leaves these out
    checkpoint_path = agreed_resume_path(args.resume, output_dir, dist.rank)
    model = build_model(models, args, cfg, dist, resuming=checkpoint_path is not None)
    autocast, scaler = setup_precision(cfg.train.precision, dist.device)
    criterion = spec.training.build_criterion(cfg)
    prepare_model(spec, model, cfg)
    ema = build_ema(spec, model, cfg)
    optimizers = build_optimizers(spec, model, cfg.section(spec.name), dist.device)
    schedulers = {name: build_scheduler(spec, name, optimizer, cfg) for name, optimizer in optimizers.items()}
    parts = checkpoint_parts(spec, optimizers, schedulers, scaler)
    train_set, val_set, train_loader, val_loader = build_loaders(spec, cfg, dist)
    state, accumulation = TrainState(), cfg.train.grad_accumulation
    if checkpoint_path is not None:
        state, accumulation = resume(spec, checkpoint_path, model, parts, cfg, dist, ema, len(train_set))
    if state.step >= cfg.train.max_steps:
        if dist.is_main:
            print(f"nothing to train: {output_dir} is at step {state.step} and train.max_steps is "
                  f"{cfg.train.max_steps}; to train more, raise it (e.g. --max-steps {2 * cfg.train.max_steps})")
        return None
    if cfg.train.compile:  # the model's fast path (torch.compile'd hot loops); same mathematics as eager
        model = spec.training.optimize_for_training(model, cfg)
    phases = build_phases(spec, model, optimizers, schedulers, cfg)
    log = RunLog(output_dir, enabled=dist.is_main, total_steps=cfg.train.max_steps, initial_step=state.step,
                 data_advice=f"{spec.training.data_advice} (data.num_workers is {cfg.data.num_workers})",
                 tensorboard=tensorboard_dir(os.environ, str(output_dir)))
    if dist.is_main:
        announce(spec, cfg, dist, log, output_dir, train_loader, (len(train_set), len(val_set)), accumulation, ema)
    info = dict(data_seed=cfg.train.seed, model_name=spec.name, config=cfg.to_dict(), train_utterances=len(train_set),
                grad_accumulation=accumulation)
    saver = Saver(cfg, output_dir, dist, model, parts, state, ema, log, info)
    return Run(spec, cfg, dist, output_dir, model, criterion, phases, autocast, scaler, ema, state, accumulation,
               train_loader, val_loader, log, saver, Anomalies(cfg.train, scaler, state, log, output_dir, len(phases)),
               BalanceMonitor(cfg.train.memory_imbalance, cfg.train.straggler_share, clock=clock_name(dist.device)),
               batch_stream(train_loader, state), on_device_hook(spec, cfg),
               spec.training.phases.train_step if spec.training.phases is not None else one_loss_step(criterion))


def build_model(models: dict[str, ModelSpec], args: argparse.Namespace, cfg: Config, dist: DistInfo,
                resuming: bool) -> torch.nn.Module:
    """The model on this rank's device: one seed everywhere for its weights (DDP also broadcasts rank 0's), the weights of
    ``--init-from`` unless the run resumes its own checkpoint, then one seed per rank (dropout, crops)."""
    spec = models[args.model]
    # --init-from's file is read first: a published format may set the sizes its weights have (HiFi-GAN V2, V3).
    weights = init_weights(models, spec, args.init_from, cfg) if args.init_from and not resuming else None
    torch.manual_seed(cfg.train.seed)
    with model_config_errors(spec.name):
        model = spec.build_model(cfg)
    if weights is not None:
        initialise(model, spec, weights, args.init_from, dist.is_main)
    elif args.init_from and dist.is_main:
        print(f"note: --init-from {args.init_from} is not used: {args.output_dir} holds this run's own checkpoint, "
              "which it resumes", file=sys.stderr, flush=True)
    model = model.to(dist.device)
    seed = cfg.train.seed + dist.rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    return model


def init_weights(models: dict[str, ModelSpec], spec: ModelSpec, path: str, cfg: Config) -> Weights:
    """``--init-from``: the weights of a checkpoint of this project, or of one another project published for any model
    of ``models`` (:mod:`utils.checkpoint.published`; ``cfg`` may get the sizes of a published variant), which must be
    of ``spec``'s model (every rank reads the file).

    Raises:
        CheckpointError: the file is unreadable, unsafe, or of another model.
    """
    weights = read_weights(path, models, cfg)
    if weights.model_name != spec.name:
        raise CheckpointError(f"--init-from {path} holds a '{weights.model_name}' model; this run trains "
                              f"'{spec.name}' (--model {weights.model_name}?)")
    return weights


def initialise(model: torch.nn.Module, spec: ModelSpec, weights: Weights, path: str, is_main: bool) -> None:
    """Put the ``--init-from`` ``weights`` (:func:`init_weights`) into the fresh ``model`` of ``spec``.

    Raises:
        CheckpointError: the weights do not fit this run's config (missing, unexpected or misshapen keys, named).
    """
    kept = load_into(model, weights, path)
    if is_main:
        fresh = f"; {', '.join(prefix.rstrip('.') for prefix in kept)} start afresh" if kept else ""
        print(f"initialised {spec.name} from {path}, {weights.source}{fresh}; a fresh optimizer, step 0",
              file=sys.stderr, flush=True)


def prepare_model(spec: ModelSpec, model, cfg: Config) -> None:
    """Activation checkpointing of ``Training.blocks``, then FSDP sharding of each phase's network block by block, then
    its root (torchtitan's order: recomputation inside, sharding outside), in place, before the optimizers exist (FSDP
    replaces the parameters by their shards). What cannot work was refused by :func:`utils.training.settings.check_settings`.

    Raises:
        ConfigError: activation checkpointing of a model whose ``Training.blocks`` returns no block.
    """
    train = cfg.train
    blocks = list(spec.training.blocks(model)) if spec.training.blocks is not None else []
    if train.activation_checkpointing != "none":
        if not blocks:
            raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{spec.name}' "
                              "names no blocks to checkpoint (Training.blocks)")
        apply_activation_checkpointing(blocks, train.activation_checkpointing, train.activation_checkpointing_every)
    if train.parallelism != "fsdp":
        return
    param_dtype = torch.bfloat16 if train.precision == "bf16" else None
    for net in phase_networks(spec, model).values():
        inside = {id(module) for module in net.modules()}
        apply_gradient_allreduce(net, "fsdp", blocks=[block for block in blocks if id(block) in inside],
                                 param_dtype=param_dtype, reshard_after_forward=train.reshard_after_forward)


def build_ema(spec: ModelSpec, model, cfg: Config) -> Optional[EMA]:
    """``train.ema_decay``'s average of the parameters ``Inference.modules`` names (:class:`utils.training.ema.EMA`), or
    ``None`` when the decay is 0.

    Raises:
        ConfigError: the inference modules name no parameter.
    """
    if not cfg.train.ema_decay:
        return None
    try:
        return EMA(model, spec.inference_modules, cfg.train.ema_decay)
    except ValueError as err:
        raise ConfigError(f"train.ema_decay={cfg.train.ema_decay} with model '{spec.name}': {err}") from None


def build_loaders(spec: ModelSpec, cfg: Config, dist: DistInfo) -> tuple:
    """``(train_set, val_set, train_loader, val_loader)`` of this rank's shard.

    Raises:
        DataError: too few training utterances for one batch of every rank.
    """
    with model_config_errors(spec.name):
        train_set, val_set = spec.training.build_datasets(cfg)
    batch_size = cfg.section(spec.name).batch_size
    train_loader = make_loader(train_set, spec, cfg, batch_size, dist.rank, dist.world_size, True, dist.device)
    val_loader = make_loader(val_set, spec, cfg, batch_size, dist.rank, dist.world_size, False, dist.device)
    if len(train_loader) == 0:
        raise DataError(f"{len(train_set)} training utterances are too few for batch_size {batch_size} "
                        f"x {dist.world_size} processes; lower {spec.name}.batch_size or add data")
    return train_set, val_set, train_loader, val_loader


def resume(spec: ModelSpec, path: Path, model, parts: dict, cfg: Config, dist: DistInfo, ema: Optional[EMA],
           train_utterances: int) -> tuple[TrainState, int]:
    """Put the checkpoint at ``path`` back (:func:`utils.checkpoint.resume.resume_training`); returns the position and the
    gradient accumulation that keeps the global batch on another number of processes.

    Raises:
        CheckpointError: a single-file checkpoint for an FSDP run, or what ``resume_training`` raises.
    """
    accumulation, batch_size = cfg.train.grad_accumulation, cfg.section(spec.name).batch_size
    if cfg.train.parallelism == "fsdp" and not is_sharded(path):
        raise CheckpointError(f"{path} is a single-file checkpoint (train.parallelism=ddp); continue "
                              "it with train.parallelism=ddp (a ddp run reads sharded checkpoints too)")
    state, before = resume_training(path, model, parts, spec.name, dist.rank, dist.world_size,
                                    map_location=dist.device, config=cfg.to_dict(),
                                    train_utterances=train_utterances, ema=ema)
    note = None
    if before["config"].get("train", {}).get("grad_accumulation", accumulation) == accumulation:
        accumulation, note = world_size_change(before["world_size"], before["grad_accumulation"], dist.world_size,
                                               batch_size, accumulation)
    # else: the user changed train.grad_accumulation (named in the config warning): theirs, as given
    state.batch_in_epoch = state.samples_in_epoch // (batch_size * dist.world_size)
    if dist.is_main:
        if note:
            print(note, file=sys.stderr, flush=True)
        print(f"resumed from {path} at step {state.step} (epoch {state.epoch}, sample {state.samples_in_epoch} of it)")
    return state, accumulation


def phase_networks(spec: ModelSpec, model) -> dict:
    """``{phase: network}``: ``{"model": model}`` for a one-loss model, else ``Phases.networks``.

    Raises:
        TrainingError: ``Phases.networks`` does not name one network per phase.
    """
    phases = spec.training.phases
    nets = {"model": model} if phases is None else phases.networks(model) if phases.networks is not None else None
    if not isinstance(nets, dict) or set(nets) != set(spec.phase_names or ("model",)):
        raise TrainingError(f"model '{spec.name}': Phases.networks must map each phase "
                            f"({', '.join(spec.phase_names or ('model',))}) to the network it trains")
    return nets


def build_phases(spec: ModelSpec, model, optimizers: dict, schedulers: dict, cfg: Config) -> list[Phase]:
    """One :class:`Phase` per optimizer, each network DDP-wrapped on its own (under FSDP :func:`prepare_model` sharded it).

    Raises:
        TrainingError: ``Phases.networks`` does not name one network per phase.
    """
    nets = phase_networks(spec, model)
    skip = "skip" in (cfg.train.on_nonfinite, cfg.train.on_spike)
    return [Phase(phase, nets[phase], apply_gradient_allreduce(nets[phase]), optimizer, *schedulers[phase],
                  tuple(SpikeMonitor(cfg.train.spike_factor, warmup=cfg.train.spike_warmup) for _ in "ln"),
                  BufferGuard(nets[phase]) if skip else None) for phase, optimizer in optimizers.items()]


def recipe_line(spec: ModelSpec) -> str:
    """The recipe model ``spec`` gets, in one line: the values ``utils.training.settings.apply_recipe`` gives the shared
    settings a config leaves null (``ModelSpec.recipe``, each one it does not name from ``PROJECT_RECIPE``), and whose
    they are, e.g. ``recipe (the project's defaults: gan_vocoder's ModelSpec has none) for the settings config.json
    leaves null: audio.mel_framing=jik876, train.grad_clip=0.0, train.cudnn_benchmark=true``."""
    if not spec.recipe:
        whose = f"the project's defaults: {spec.name}'s ModelSpec has none"
    elif set(PROJECT_RECIPE) <= set(spec.recipe):
        whose = f"{spec.name}'s ModelSpec.recipe"
    else:
        whose = f"{spec.name}'s ModelSpec.recipe, the project's defaults for the rest"
    values = {**PROJECT_RECIPE, **spec.recipe}
    shown = ", ".join(f"{name}={value if isinstance(value, str) else json.dumps(value)}" for name, value in values.items())
    return f"recipe ({whose}) for the settings config.json leaves null: {shown}"


def announce(spec: ModelSpec, cfg: Config, dist: DistInfo, log: RunLog, output_dir: Path, train_loader: DataLoader,
             sizes: tuple[int, int], accumulation: int, ema: Optional[EMA]) -> None:
    """Rank 0: the run's ``config.json`` beside its checkpoints, and its first lines (what trains where, the global batch,
    the recipe the model gets: :func:`recipe_line`, the padding length buckets save)."""
    atomic_write_bytes(output_dir / "config.json", json.dumps(cfg.to_dict(), indent=2).encode())
    device, batch_size = dist.device, cfg.section(spec.name).batch_size
    threads = f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""
    log.print(f"training {spec.name} on {dist.world_size} process(es), device {device}{threads}, precision "
              f"{cfg.train.precision}; {sizes[0]} train / {sizes[1]} val utterances; "
              f"global batch {batch_size * accumulation * dist.world_size}"
              + (f", parallelism {cfg.train.parallelism}" if cfg.train.parallelism == "fsdp" else "")
              + (f"; validation with an EMA of the weights (decay {cfg.train.ema_decay})" if ema is not None else ""))
    log.print(recipe_line(spec))
    if isinstance(train_loader.batch_sampler, LengthBucketSampler):
        lengths = train_loader.batch_sampler.lengths
        bucketed = padding_fraction(train_loader.batch_sampler.epoch_batches(), lengths)
        shuffled = padding_fraction(random_batches(len(lengths), batch_size, cfg.train.seed), lengths)
        log.print(f"batches of similar lengths (data.batching=buckets): {100 * bucketed:.1f}% of a batch is "
                  f"padding, against {100 * shuffled:.1f}% in random batches")
