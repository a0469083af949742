"""Everything the loop uses, built once per run (:func:`build_run`) in a fixed order, which is part of the behaviour:
every random draw happens where it always did, so a run repeats bit for bit."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from distributed import DistInfo, apply_gradient_allreduce, from_rank0
from model import BatchFrames, ModelSpec, Vocoder
from utils.checkpoint.files import CheckpointError, atomic_write_bytes
from utils.checkpoint.checkpointer import Checkpointer
from utils.checkpoint.names import last_checkpoint_path
from utils.checkpoint.resume import Formats, agreed_resume_path
from utils.checkpoint.state import RngStates
from utils.checkpoint.weights import load_into, read_weights
from utils.config import Config, ConfigError
from utils.data.audio import decoding, vocoder_mismatch
from utils.data.check import prepare_run
from utils.data.corpus import DataError
from utils.data import speakers
from utils.data.loader import OwnOrder, batch_stream, batching_line, make_loader, on_device_hook, replan_note
from utils.errors import TrainingError
from utils.run_log import BalanceMonitor, RunLog, tensorboard_writer
from utils.train_state import TrainState
from utils.training.ema import EMA
from utils.training.guards import Anomalies, SpikeMonitor
from utils.training.optim import Precision, build_optimizers, build_scheduler, checkpoint_parts, setup_precision
from utils.training.checks import model_config_errors
from utils.training.recipe import PROJECT_RECIPE
from utils.training.settings import LoopSettings
from utils.training.step import BufferGuard, Phase, one_loss_step
from utils.training.validate import Validator


class Sharding(Protocol):
    """A model prepared before its optimizers exist (split over the ranks), and gathered whole for rank 0's validation
    pictures."""

    def prepare_model(self, spec: ModelSpec, model: torch.nn.Module, train: Any,
                      networks: Callable[[], dict[str, torch.nn.Module]]) -> None: ...

    def gathered_model(self, plain: torch.nn.Module, spec: ModelSpec, cfg: Config, device: torch.device,
                       is_main: bool) -> Optional[torch.nn.Module]: ...


class OwnCorpus(Protocol):
    """A corpus the core does not read (a part's), checked and batched in place of its layout readers' where
    the ``data`` section names it; each method None where it does not."""

    def checked(self, cfg: Config, spec: ModelSpec, output_dir: Path) -> Optional[tuple[list[str], list[str]]]:
        """Rank 0's check in place of :func:`prepare_run`: the ids to leave out, and the training split's speakers."""

    def loaders(self, spec: ModelSpec, cfg: Config, dist: DistInfo) -> Optional[tuple[DataLoader, DataLoader]]:
        """This rank's training and validation loaders (each ``dataset``: the whole split)."""


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What a run takes of the project's optional parts, each None where the project left its part out: ``parts.py``
    builds it (``parts.PARTS.run``) and ``train.py`` hands it to :func:`build_run`."""

    formats: Formats = Formats()  # the checkpoint formats it resumes and starts from, besides single files
    sharding: Optional[Sharding] = None  # the model's preparation before its optimizers (train.parallelism)
    datasets: Optional[Callable[[ModelSpec, Config], Optional[tuple]]] = None  # (train, val) in place of the model's
    writer: Optional[Callable[..., Any]] = None  # rank 0's run-log writer in place of TensorBoard's alone
    tensorboard_dir: Optional[Callable[[Mapping[str, str], str], str]] = None  # (environ, output_dir) -> the folder
    corpus: Optional[OwnCorpus] = None  # a corpus read in place of the layout readers'


@dataclasses.dataclass(kw_only=True)
class TrainData:
    """This rank's training data as the loop reads it."""

    loader: DataLoader  # this rank's shard of the training set
    batches: Iterator[dict]  # the loader's batches without end, keeping the run's position (:func:`batch_stream`)
    prepare: Optional[Callable[[dict], dict]]  # the model's on_device hook (:func:`on_device_hook`), or None
    accumulation: int  # micro-batches per optimizer step (train.grad_accumulation; on a resume, the global batch's)


@dataclasses.dataclass(kw_only=True)
class Run:
    """What the loop in ``train.py`` reads and steps: the ``train`` section, the position, one phase per optimizer and
    their step function, and the components that hold their own settings."""

    spec: ModelSpec
    train: LoopSettings
    dist: DistInfo
    output_dir: Path
    state: TrainState
    phases: list[Phase]
    step_fn: Callable  # (phase name, {phase: network}, batch) -> (loss, {name: value}): Phases.train_step, or one loss
    precision: Precision
    data: TrainData
    ema: Optional[EMA]
    log: RunLog
    validator: Validator
    checkpointer: Checkpointer
    anomalies: Anomalies
    balance: BalanceMonitor


def build_run(models: dict[str, ModelSpec], args: argparse.Namespace, cfg: Config, dist: DistInfo,
              parts: RunParts, load_vocoder: Callable[..., Vocoder]) -> Optional[Run]:
    """The run of ``models[args.model]`` with what the optional ``parts`` add, once rank 0 holds the output folder;
    ``None`` (said) when the checkpoint is at ``train.max_steps``. ``load_vocoder``: ``inference.load_vocoder``, for
    the model's validation vocoder (:func:`validation_vocoder`). Raises :class:`DataError`, :class:`ConfigError`,
    :class:`CheckpointError`, :class:`TrainingError`."""
    spec, output_dir = models[args.model], Path(args.output_dir)
    vocoder = validation_vocoder(spec, cfg, dist, load_vocoder)  # first: a bad one stops the run before any work
    found, cfg.data.speakers = from_rank0(lambda: checked_corpus(cfg, spec, output_dir, parts.corpus), ConfigError,
                                          DataError)
    cfg.data.exclude = sorted({*cfg.data.exclude, *found})  # load_splits leaves these out
    checkpoint_path = agreed_resume_path(args.resume, output_dir, parts.formats)
    saved = None if checkpoint_path is None else \
        parts.formats.of(checkpoint_path).read(checkpoint_path, dist.device, verify=dist.is_main)
    model, weights_settings, speaker_entries = build_model(models, args, cfg, dist, (checkpoint_path, saved),
                                                           parts.formats)
    precision = setup_precision(cfg.train.precision, dist.device)
    criterion = spec.training.build_criterion(cfg)
    if parts.sharding is not None:  # in place, before the optimizers exist
        parts.sharding.prepare_model(spec, model, cfg.train, lambda: phase_networks(spec, model))
    ema = build_ema(spec, model, cfg.train.ema_decay)
    optimizers = build_optimizers(spec, model, cfg, dist.device)
    schedulers = {name: build_scheduler(spec, name, optimizer, cfg) for name, optimizer in optimizers.items()}
    train_loader, val_loader = build_loaders(spec, cfg, dist, parts.datasets, parts.corpus)
    train_utterances = len(train_loader.dataset)
    state, accumulation, run_ids = TrainState(), cfg.train.grad_accumulation, {}
    states = {"model": model, **checkpoint_parts(spec, optimizers, schedulers, precision.scaler), "position": state,
              "rng": RngStates(dist.rank, dist.world_size), **({"ema": ema} if ema is not None else {})}
    checkpointer = Checkpointer(states, output_dir, dist, cfg.train, parts.formats)
    if saved is not None:  # every part's state, the position too; its tensors go now, not after DDP's buckets are made
        resumed = checkpointer.resume(checkpoint_path, saved, cfg, spec.name, train_utterances)
        accumulation, run_ids, saved = resumed.grad_accumulation, resumed.tracker_runs, None
        if (note := replan_note(train_loader, state, resumed.world_size)) is not None and dist.is_main:
            print(note, file=sys.stderr, flush=True)
    if state.step >= cfg.train.max_steps:
        if dist.is_main:
            print(f"nothing to train: {output_dir} is at step {state.step} and train.max_steps is "
                  f"{cfg.train.max_steps}; to train more, raise it (e.g. --max-steps {2 * cfg.train.max_steps})")
        return None
    if cfg.train.compile:  # the model's fast path (torch.compile'd hot loops); same mathematics as eager
        model = spec.training.optimize_for_training(model, cfg)
    phases = build_phases(spec, model, optimizers, schedulers, cfg.train)
    log = RunLog(output_dir, enabled=dist.is_main, total_steps=cfg.train.max_steps, initial_step=state.step,
                 data_advice=f"{spec.training.data_advice} (data.num_workers is {cfg.data.num_workers})",
                 writer=run_writer(spec, cfg, (output_dir, state.step, run_ids), parts) if dist.is_main else None)
    data = TrainData(loader=train_loader, batches=batch_stream(train_loader, state), prepare=on_device_hook(spec, cfg),
                     accumulation=accumulation)
    if dist.is_main:
        announce(spec, cfg, dist, log, data, len(val_loader.dataset))
    info = dict(data_seed=cfg.train.seed, model_name=spec.name, config=cfg.to_dict(), train_utterances=train_utterances,
                grad_accumulation=accumulation, audio_decoding=decoding(), **speaker_entries,
                **({WEIGHTS_SETTINGS: weights_settings} if weights_settings else {}))
    if parts.writer is not None and dist.is_main:  # the info rank 0 writes: the run ids to continue on a resume
        info["tracker_runs"] = log.writer.run_ids()
    checkpointer.start(log, info)
    validator = Validator(model=phases[0].wrapped if len(phases) == 1 else model,  # a one-loss model's DDP-wrapped network
                          criterion=criterion, loader=val_loader, spec=spec, cfg=cfg, dist=dist,
                          autocast=precision.autocast, prepare=data.prepare, writer=log.writer, output_dir=output_dir,
                          ema=ema, gather=parts.sharding.gathered_model if parts.sharding is not None else None,
                          vocoder=vocoder)
    return Run(spec=spec, train=cfg.train, dist=dist, output_dir=output_dir, state=state, phases=phases,
               step_fn=spec.training.phases.train_step if spec.training.phases is not None else one_loss_step(criterion),
               precision=precision, data=data, ema=ema, log=log, validator=validator, checkpointer=checkpointer,
               anomalies=Anomalies(cfg.train, precision.scaler, state, log, len(phases), checkpointer.suspect),
               balance=BalanceMonitor(cfg.train.memory_imbalance, cfg.train.straggler_share,  # forward_backward's clock:
                                      clock="cpu" if dist.device.type == "cpu" else "wall"))


def validation_vocoder(spec: ModelSpec, cfg: Config, dist: DistInfo, load: Callable[..., Vocoder]) -> Optional[Vocoder]:
    """Rank 0's vocoder of the validation audio: the checkpoint the key ``Training.val_vocoder`` of the model's section
    names, read by ``load`` (``inference.load_vocoder``) onto the run's device, the random streams left as they were;
    ``None`` on the other ranks and where the key is null. Raises, on every rank, a :class:`CheckpointError` naming
    the key: a file that does not load or holds no vocoder, a vocoder of other audio settings than the run's
    (:func:`vocoder_mismatch`)."""
    key = spec.training.val_vocoder
    path = getattr(cfg.section(spec.name), key) if key else None
    if path is None:
        return None
    setting, loaded = f"{spec.name}.{key}", []

    def load_on_rank0() -> None:
        try:
            with torch.random.fork_rng(devices=[]):  # its layers draw their initial weights: not from the run's stream
                vocoder = load(path, dist.device, label="")
        except (CheckpointError, ConfigError) as err:
            raise CheckpointError(f"{setting}: {err}") from None
        if differing := vocoder_mismatch(vocoder.cfg.audio, cfg.audio):
            raise CheckpointError(f"{setting}: {path} is a vocoder of other audio settings than the run's: "
                                  f"{differing}")
        loaded.append(vocoder)
    from_rank0(load_on_rank0, CheckpointError)
    return loaded[0] if loaded else None


def checked_corpus(cfg: Config, spec: ModelSpec, output_dir: Path,
                   corpus: Optional[OwnCorpus] = None) -> tuple[list[str], list[str]]:
    """Rank 0's :func:`prepare_run` (``corpus``'s check where it reads the corpus): the bad clips' ids left out, and
    the training split's speakers, sorted."""
    if corpus is not None and (found := corpus.checked(cfg, spec, output_dir)) is not None:
        return found
    speakers: list[str] = []
    return prepare_run(cfg, spec, output_dir, speakers), speakers


def run_writer(spec: ModelSpec, cfg: Config, where: tuple[Path, int, dict[str, str]], parts: RunParts) -> Any:
    """Rank 0's run-log writer (``where``: the output folder, the step resumed at, the checkpoint's run ids):
    ``parts.writer``'s, else TensorBoard's, in the folder ``parts.tensorboard_dir`` gives, else
    ``<output_dir>/tensorboard``."""
    output_dir, step, run_ids = where
    folder = parts.tensorboard_dir(os.environ, str(output_dir)) if parts.tensorboard_dir else \
        str(output_dir / "tensorboard")
    if parts.writer is not None:
        writer = parts.writer(cfg, spec.name, output_dir, folder, step, run_ids)
        if cfg.train.tracker_log_checkpoint:  # the newest checkpoint when the run ends, file or folder
            writer.checkpoint = functools.partial(last_checkpoint_path, output_dir)
        return writer
    return tensorboard_writer(folder, step)


WEIGHTS_SETTINGS = "weights_settings"
"""The checkpoint entry of the settings a run's first weights set (``{section: {key: value}}``: what a published
format's reader set), set again on a resume: a fine-tuning job restarts with the command that started it."""


def build_model(models: dict[str, ModelSpec], args: argparse.Namespace, cfg: Config, dist: DistInfo,
                checkpoint: tuple[Optional[Path], Optional[dict]],
                formats: Formats) -> tuple[torch.nn.Module, dict[str, dict], dict[str, Any]]:
    """The model on this rank's device, the settings its first weights set in ``cfg`` (:data:`WEIGHTS_SETTINGS`) and
    the speaker map's checkpoint entries (:func:`run_speakers`, which sets ``cfg.data.speakers``): one seed everywhere
    for its weights; those of ``--init-from`` unless the run resumes its own ``checkpoint`` (path and entries, or
    Nones), whose settings come from there; then one seed per rank. A :class:`CheckpointError` for an ``--init-from``
    file unreadable, unsafe, of another model or not fitting; a :class:`ConfigError` for settings that fail the
    config's checks; a :class:`DataError` for a resume with another speaker map."""
    (path, saved), spec, weights, settings = checkpoint, models[args.model], None, {}
    if saved is not None:
        if args.init_from and dist.is_main:
            print(f"note: --init-from {args.init_from} is not used: {args.output_dir} holds this run's own checkpoint, "
                  "which it resumes", file=sys.stderr, flush=True)
        settings = resumed_settings(spec, path, saved, cfg, dist.is_main)
    elif args.init_from:  # read first: a published format may set its sizes in cfg
        before = cfg.to_dict()
        weights = read_weights(args.init_from, models, cfg, formats=formats)  # ours, or a published one
        settings = cfg.changed_since(before)
        if weights.model_name != spec.name:
            raise CheckpointError(f"--init-from {args.init_from} holds a '{weights.model_name}' model; this run trains "
                                  f"'{spec.name}' (--model {weights.model_name}?)")
    speakers = run_speakers(cfg, (path, saved) if saved is not None else (args.init_from, weights), dist.is_main)
    torch.manual_seed(cfg.train.seed)
    with model_config_errors(spec.name):
        model = spec.build_model(cfg)
    if weights is not None:
        grow_rows(model, weights, spec.training.speaker_rows)
        kept = load_into(model, weights, args.init_from)  # prefixes of the weights that start afresh
        if dist.is_main:
            fresh = f"; {', '.join(prefix.rstrip('.') for prefix in kept)} start afresh" if kept else ""
            print(f"initialised {spec.name} from {args.init_from}, {weights.source}{fresh}; a fresh optimizer, step 0",
                  file=sys.stderr, flush=True)
    model = model.to(dist.device)
    seed = cfg.train.seed + dist.rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    return model, settings, speakers


def run_speakers(cfg: Config, source: tuple[Any, Any], is_main: bool) -> dict[str, Any]:
    """``cfg.data.speakers`` (the training split's, sorted) settled with the map of ``source``, ``(path, the
    checkpoint entries it resumes)`` or ``(--init-from, its Weights or None)`` (:func:`utils.data.speakers.settle`:
    verified, or extended as rank 0 says), and its checkpoint entries. A :class:`DataError` for a resume with
    another map."""
    where, found = source
    resume = isinstance(found, dict)
    entries = found if resume else {speakers.ENTRY: found.speakers} if found is not None and found.speakers else {}
    names, inherited, line = speakers.settle(cfg.data.speakers, speakers.saved_map(entries, str(where)), str(where),
                                             resume)
    if line is not None and is_main:
        print(f"note: {line}", file=sys.stderr, flush=True)
    cfg.data.speakers = names
    return {speakers.ENTRY: speakers.as_entry(names), speakers.INHERITED: inherited}


def grow_rows(model: torch.nn.Module, weights: Any, keys: tuple[str, ...]) -> None:
    """Tables of ``weights.state`` named in ``keys`` (a row per speaker: ``Training.speaker_rows``) with fewer rows
    than ``model``'s get its rows past theirs (the new speakers, as the module initialised them), in place."""
    own = model.state_dict()
    for key in keys:
        saved = weights.state.get(key)
        if saved is not None and key in own and saved.dim() == own[key].dim() and saved.size(0) < own[key].size(0) \
                and saved.shape[1:] == own[key].shape[1:]:
            weights.state[key] = torch.cat([saved.to(own[key].dtype), own[key][saved.size(0):].cpu()])


def resumed_settings(spec: ModelSpec, path: Path, saved: Any, cfg: Config, is_main: bool) -> dict[str, dict]:
    """The :data:`WEIGHTS_SETTINGS` of the checkpoint entries ``saved`` (at ``path``) set in ``cfg`` again and
    returned (``{}``: none, or another model), rank 0 naming those that differ from the config's in one line. A
    :class:`ConfigError` naming the checkpoint where they fail the config's checks."""
    if not isinstance(saved, dict) or saved.get("model_name") != spec.name or WEIGHTS_SETTINGS not in saved:
        return {}
    changed = cfg.apply(saved[WEIGHTS_SETTINGS], f"{path}: its {WEIGHTS_SETTINGS}")
    if changed and is_main:
        print(f"note: {path} was trained with settings its first weights (--init-from) set, kept over the config's: "
              + ", ".join(f"{key}={compact(new)} (config: {compact(old)})" for key, old, new in changed),
              file=sys.stderr, flush=True)
    return {name: {key: getattr(cfg.section(name), key) for key in keys}
            for name, keys in saved[WEIGHTS_SETTINGS].items()}


def compact(value: Any) -> str:
    """A setting's value as ``--set`` takes it, without spaces: ``128``, ``[3,7,11]``, ``"text"``."""
    return json.dumps(value, separators=(",", ":"))


def build_ema(spec: ModelSpec, model, decay: float) -> Optional[EMA]:
    """``train.ema_decay``'s (``decay``) average of the parameters ``Inference.modules`` names (:class:`EMA`), or
    ``None`` when the decay is 0; a :class:`ConfigError` where those modules name no parameter."""
    if not decay:
        return None
    try:
        return EMA(model, spec.inference_modules, decay)
    except ValueError as err:
        raise ConfigError(f"train.ema_decay={decay} with model '{spec.name}': {err}") from None


def build_loaders(spec: ModelSpec, cfg: Config, dist: DistInfo, datasets: Optional[Callable[..., Optional[tuple]]] = None,
                  corpus: Optional[OwnCorpus] = None) -> tuple[DataLoader, DataLoader]:
    """The training and the validation loader of this rank's shard (each loader's ``dataset``: the whole split) of
    :func:`model_datasets`, or ``corpus``'s where it reads the corpus; a :class:`DataError` for too few training
    utterances for one batch of every rank."""
    with model_config_errors(spec.name):
        if corpus is not None and (own := corpus.loaders(spec, cfg, dist)) is not None:
            return own
        train_set, val_set = model_datasets(spec, cfg, datasets)
    batch_size = cfg.section(spec.name).batch_size
    train_loader = make_loader(train_set, spec, cfg, dist, train=True)
    val_loader = make_loader(val_set, spec, cfg, dist, train=False)
    if len(train_loader) == 0:
        each, fix = ("one", "add data") if cfg.data.batching == "frames" else \
            (f"batch_size {batch_size}", f"lower {spec.name}.batch_size or add data")
        raise DataError(f"{len(train_set)} training utterances are too few for {each} x {dist.world_size} processes; "
                        f"{fix}")
    return train_loader, val_loader


def model_datasets(spec: ModelSpec, cfg: Config, datasets: Optional[Callable[..., Optional[tuple]]] = None) -> tuple:
    """``(train, val)``: those ``datasets`` (``RunParts.datasets``) gives in place of the model's (a part's:
    ``data.mel_dir``), else the model's ``Training.build_datasets``."""
    found = datasets(spec, cfg) if datasets is not None else None
    return found if found is not None else spec.training.build_datasets(cfg)


def phase_networks(spec: ModelSpec, model) -> dict:
    """``{phase: network}``: ``{"model": model}`` for a one-loss model, else ``Phases.networks``; a
    :class:`TrainingError` where that does not name one network per phase."""
    phases = spec.training.phases
    nets = {"model": model} if phases is None else phases.networks(model) if phases.networks is not None else None
    if not isinstance(nets, dict) or set(nets) != set(spec.phase_names or ("model",)):
        raise TrainingError(f"model '{spec.name}': Phases.networks must map each phase "
                            f"({', '.join(spec.phase_names or ('model',))}) to the network it trains")
    return nets


def build_phases(spec: ModelSpec, model, optimizers: dict, schedulers: dict, train: LoopSettings) -> list[Phase]:
    """One :class:`Phase` per optimizer, each network DDP-wrapped on its own (split over the ranks already: as it is), with the
    ``train`` section's spike and non-finite guards; a :class:`TrainingError` as :func:`phase_networks` raises it."""
    nets = phase_networks(spec, model)
    skip = "skip" in (train.on_nonfinite, train.on_spike)
    return [Phase(phase, nets[phase], apply_gradient_allreduce(nets[phase]), optimizer, *schedulers[phase],
                  tuple(SpikeMonitor(train.spike_factor, warmup=train.spike_warmup) for _ in "ln"),
                  BufferGuard(nets[phase]) if skip else None) for phase, optimizer in optimizers.items()]


def recipe_line(spec: ModelSpec) -> str:
    """What ``apply_recipe`` gives the settings a config leaves null, and whose they are: ``recipe (the project's
    defaults: gan_vocoder's ModelSpec has none) for the settings config.json leaves null: audio.mel_framing=jik876,
    ...``."""
    if not spec.recipe:
        whose = f"the project's defaults: {spec.name}'s ModelSpec has none"
    elif set(PROJECT_RECIPE) <= set(spec.recipe):
        whose = f"{spec.name}'s ModelSpec.recipe"
    else:
        whose = f"{spec.name}'s ModelSpec.recipe, the project's defaults for the rest"
    values = {**PROJECT_RECIPE, **spec.recipe}
    shown = ", ".join(f"{name}={value if isinstance(value, (str, BatchFrames)) else json.dumps(value)}"
                      for name, value in values.items())
    return f"recipe ({whose}) for the settings config.json leaves null: {shown}"


def announce(spec: ModelSpec, cfg: Config, dist: DistInfo, log: RunLog, data: TrainData, val_utterances: int) -> None:
    """Rank 0: the run's ``config.json`` and ``speakers.json`` beside its checkpoints, and its first lines (what
    trains where, the global batch, :func:`recipe_line`, the padding batches by length save: :func:`batching_line`)."""
    atomic_write_bytes(log.output_dir / "config.json", json.dumps(cfg.to_dict(), indent=2).encode())
    atomic_write_bytes(log.output_dir / speakers.SPEAKERS_FILE, speakers.map_bytes(cfg.data.speakers))
    device, batch_size, train_loader = dist.device, cfg.section(spec.name).batch_size, data.loader
    threads = f" ({torch.get_num_threads()} threads)" if device.type == "cpu" else ""
    steps = data.accumulation * dist.world_size  # micro-batches a step
    batch = train_loader.sampler.batch_line(steps) if isinstance(train_loader.sampler, OwnOrder) else \
        f"up to {cfg.data.max_frames * steps} padded mel frames" if cfg.data.batching == "frames" else batch_size * steps
    log.print(f"training {spec.name} on {dist.world_size} process(es), device {device}{threads}, precision "
              f"{cfg.train.precision}; {len(train_loader.dataset)} train / {val_utterances} val utterances; "
              f"global batch {batch}"
              + (f", parallelism {cfg.train.parallelism}" if cfg.train.sharded else "")
              + (f"; validation with an EMA of the weights (decay {cfg.train.ema_decay})" if cfg.train.ema_decay else ""))
    log.print(recipe_line(spec))
    if (line := batching_line(train_loader, batch_size, cfg.train.seed)) is not None:
        log.print(line)
