"""Settings a model cannot honour, refused before any process group, data or model exists: a setting is honoured or refused
in one line, never silently ignored (:func:`check_settings`)."""

from __future__ import annotations

import contextlib

from model import ModelSpec
from utils.config import Config, ConfigError, TrainConfig
from utils.data.corpus import DataError
from utils.run_log import one_line


@contextlib.contextmanager
def model_config_errors(model_name: str):
    """A plain ValueError from building the model or its datasets is a bad value in the model's config section."""
    try:
        yield
    except (ConfigError, DataError):
        raise
    except ValueError as err:
        raise ConfigError(f"{model_name} config: {one_line(err)}") from None


def check_settings(spec: ModelSpec, cfg: Config) -> None:
    """Refuse settings that cannot work with this model or would do nothing in the chosen mode.

    Raises:
        ConfigError: one line naming the setting and what to do instead.
    """
    defaults = TrainConfig()
    _check_schedule(spec, cfg, defaults)
    _check_activation_checkpointing(spec, cfg, defaults)
    if cfg.data.batching == "buckets" and not spec.training.variable_length:
        raise ConfigError(f"data.batching=buckets: model '{spec.name}' trains on items of one length (its "
                          "Training.variable_length is not set), so there is no padding to save; use "
                          "data.batching=random")
    if cfg.data.mel_dir:  # mels read from a folder (a vocoder fine-tuned on Tacotron2's teacher-forced mels)
        _check_mel_dir(spec, cfg)
    if cfg.train.compile and spec.training.optimize_for_training is None:
        raise ConfigError(f"train.compile=true, but model '{spec.name}' has no fast path "
                          "(Training.optimize_for_training)")
    _check_parallelism(spec, cfg, defaults)


def _check_schedule(spec: ModelSpec, cfg: Config, defaults: TrainConfig) -> None:
    train, phases = cfg.train, spec.training.phases
    if phases is not None and phases.build_scheduler is not None and (
            train.lr_schedule != defaults.lr_schedule or train.warmup_steps != defaults.warmup_steps):
        raise ConfigError(f"train.lr_schedule={train.lr_schedule}, train.warmup_steps={train.warmup_steps}: model "
                          f"'{spec.name}' builds its own LR schedulers (Phases.build_scheduler), which these settings "
                          f"would not change; leave them at {defaults.lr_schedule} and {defaults.warmup_steps}, or "
                          "schedule the learning rate in the model's build_scheduler")


def _check_activation_checkpointing(spec: ModelSpec, cfg: Config, defaults: TrainConfig) -> None:
    train = cfg.train
    if train.activation_checkpointing != "none" and spec.training.blocks is None:
        raise ConfigError(f"train.activation_checkpointing={train.activation_checkpointing}: model '{spec.name}' "
                          "names no blocks to checkpoint (Training.blocks)")
    if train.activation_checkpointing != "selective" and \
            train.activation_checkpointing_every != defaults.activation_checkpointing_every:
        raise ConfigError(f"train.activation_checkpointing_every={train.activation_checkpointing_every} applies to "
                          "train.activation_checkpointing=selective only (it is "
                          f"{train.activation_checkpointing})")


def _check_mel_dir(spec: ModelSpec, cfg: Config) -> None:
    name, mel_dir = spec.name, cfg.data.mel_dir
    if spec.inference is None or spec.inference.vocode is None:
        raise ConfigError(f"data.mel_dir={mel_dir}: model '{name}' is not a vocoder (its spec has no "
                          "Inference.vocode) and does not read mels from a folder; leave data.mel_dir empty")
    model_cfg, hop = cfg.section(name), cfg.audio.hop_length
    if getattr(model_cfg, "mel_on_device", False):
        raise ConfigError(f"data.mel_dir={mel_dir} with {name}.mel_on_device=true: the mels are read from "
                          f"data.mel_dir, not computed from the audio on the device; set {name}.mel_on_device=false "
                          "or data.mel_dir=\"\"")
    segment = getattr(model_cfg, "segment_length", None)
    if isinstance(segment, int) and segment % hop:
        nearest = " or ".join(str(n) for n in (segment // hop * hop, (segment // hop + 1) * hop) if n)
        raise ConfigError(f"{name}.segment_length={segment} is not a multiple of audio.hop_length={hop}: with "
                          f"data.mel_dir audio and mel are cropped together on frame boundaries; use {nearest}")


def _check_parallelism(spec: ModelSpec, cfg: Config, defaults: TrainConfig) -> None:
    train = cfg.train
    if train.parallelism != "fsdp":
        for key, meaning in (("async_checkpoint", "writes sharded checkpoints in the background"),
                             ("reshard_after_forward", "frees a block's gathered weights after its forward")):
            if getattr(train, key) != getattr(defaults, key):
                raise ConfigError(f"train.{key}={str(getattr(train, key)).lower()} does nothing with "
                                  f"train.parallelism={train.parallelism}: it {meaning} under "
                                  "train.parallelism=fsdp only")
        return
    if spec.phase_names:
        raise ConfigError(f"train.parallelism=fsdp with model '{spec.name}', which trains several optimizers "
                          f"({', '.join(spec.phase_names)}): not supported yet (sharded per block, the network frozen "
                          "in the other phase's backward gives other losses than DDP); use train.parallelism=ddp")
    if train.precision == "fp16":
        raise ConfigError("train.precision=fp16 with train.parallelism=fsdp: FSDP2 mixed precision is bf16 "
                          "(set train.precision=bf16; fp16's loss scaling would need one verdict over every shard)")
    if train.compile:
        raise ConfigError("train.compile=true with train.parallelism=fsdp: the models' fast paths compile the "
                          "whole model, which FSDP's per-block hooks break; use one of the two")
