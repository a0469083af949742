"""The settings a model cannot honour, refused in one :class:`utils.config.ConfigError` line, never silently ignored:
those the sections' own checks cannot see (they cross sections, or depend on the model), before any process group, data
or model exists (:func:`check_settings`); and what the model itself refuses while it and its datasets are built
(:func:`model_config_errors`)."""

from __future__ import annotations

import contextlib

from model import ModelSpec
from utils.config import Config, ConfigError
from utils.data.corpus import DataError
from utils.run_log import one_line
from utils.training.settings import SHARDING, TrainConfig


def check_settings(spec: ModelSpec, cfg: Config) -> None:
    """Refuse settings that cannot work with this model or would do nothing in the chosen mode.

    Raises:
        ConfigError: one line naming the setting and what to do instead.
    """
    defaults = TrainConfig()
    _check_schedule(spec, cfg, defaults)
    if SHARDING:
        SHARDING.check_activation_checkpointing(spec, cfg)
    if cfg.data.batching == "buckets" and not spec.training.variable_length:
        raise ConfigError(f"data.batching=buckets: model '{spec.name}' trains on items of one length (its "
                          "Training.variable_length is not set), so there is no padding to save; use "
                          "data.batching=random")
    if cfg.data.mel_dir:  # mels read from a folder (a vocoder fine-tuned on Tacotron2's teacher-forced mels)
        _check_mel_dir(spec, cfg)
    if cfg.train.compile and spec.training.optimize_for_training is None:
        raise ConfigError(f"train.compile=true, but model '{spec.name}' has no fast path "
                          "(Training.optimize_for_training)")
    if SHARDING:
        SHARDING.check_parallelism(spec, cfg)


def _check_schedule(spec: ModelSpec, cfg: Config, defaults: TrainConfig) -> None:
    train, phases = cfg.train, spec.training.phases
    if phases is not None and phases.build_scheduler is not None and (
            train.lr_schedule != defaults.lr_schedule or train.warmup_steps != defaults.warmup_steps):
        raise ConfigError(f"train.lr_schedule={train.lr_schedule}, train.warmup_steps={train.warmup_steps}: model "
                          f"'{spec.name}' builds its own LR schedulers (Phases.build_scheduler), which these settings "
                          f"would not change; leave them at {defaults.lr_schedule} and {defaults.warmup_steps}, or "
                          "schedule the learning rate in the model's build_scheduler")


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


@contextlib.contextmanager
def model_config_errors(model_name: str):
    """A plain ValueError from building the model or its datasets is a bad value in the model's config section.

    Raises:
        ConfigError: ``"<model_name> config: <the error, in one line>"``; a ConfigError or DataError passes as it is.
    """
    try:
        yield
    except (ConfigError, DataError):
        raise
    except ValueError as err:
        raise ConfigError(f"{model_name} config: {one_line(err)}") from None
