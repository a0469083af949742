"""The loop's settings (:class:`TrainConfig`, the ``train`` section; with the ``audio`` and ``data`` sections, declared
beside the code that reads them, the sections every model shares: :data:`SHARED_SECTIONS`), the shared settings left
null filled with the model's reference recipe (:func:`apply_recipe`), and the settings a model cannot honour, refused
before any process group, data or model exists: a setting is honoured or refused in one line, never silently ignored
(:func:`check_settings`)."""

from __future__ import annotations

import contextlib
from typing import Any, Literal, Optional

from pydantic import Field

from model import ModelSpec
from utils.config import Config, ConfigError, Section
from utils.data.audio import AudioConfig
from utils.data.corpus import DataConfig, DataError
from utils.data.datasets import mel_dir_framing
from utils.framing import UNRESOLVED_FRAMING
from utils.run_log import one_line


class TrainConfig(Section):
    """The ``train`` section: the loop's settings. Intervals are in optimizer steps."""

    seed: int = Field(1234, ge=0, le=2**31 - 1)  # NumPy takes seeds below 2**32, and each rank adds its rank
    precision: Literal["fp32", "tf32", "bf16", "fp16"] = "tf32"  # fp16 uses a GradScaler
    max_steps: int = Field(500000, ge=1)
    grad_accumulation: int = Field(1, ge=1)  # micro-batches per step: batch_size * grad_accumulation * world_size
    grad_clip: Optional[float] = Field(None, ge=0)  # the largest gradient norm; 0: no clipping; None: the recipe's
    # constant, or cosine to 1% at max_steps, after warmup_steps of linear warm-up (a model with its own
    # schedulers, Phases.build_scheduler, refuses both)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    log_interval: int = Field(10, ge=1)
    val_interval: int = Field(1000, ge=1)
    checkpoint_interval: int = Field(1000, ge=1)
    keep_last: int = Field(5, ge=0)  # numbered checkpoints kept; 0: all
    on_nonfinite: Literal["skip", "stop"] = "skip"  # a NaN/inf loss or gradient norm: skip the step, or stop
    # an optimizer whose update was skipped this many steps in a row (non-finite, spike, fp16 overflow) stops the run
    # naming the last good checkpoint; 0: never
    max_skips_in_a_row: int = Field(20, ge=0)
    # a loss or gradient norm above factor x the highest of its last 100 steps (guards.SpikeMonitor, after
    # spike_warmup steps) is a spike, written to anomalies.jsonl with the batch's ids (0: no check); on_spike: log it,
    # skip the step, or stop the run naming the last good checkpoint
    spike_factor: float = Field(3.0, ge=0)
    spike_warmup: int = Field(20, ge=1)
    # a rank whose peak memory (compute time per step, 3 log intervals in a row) is this share above the ranks'
    # median is named in a warning (CPU seconds when the ranks compute on the CPU)
    memory_imbalance: float = Field(0.2, gt=0)
    straggler_share: float = Field(0.2, gt=0)
    on_spike: Literal["log", "skip", "stop"] = "log"
    dist_timeout_s: float = Field(600.0, gt=0)  # seconds a collective waits for a hung rank before the run fails
    cudnn_benchmark: Optional[bool] = None  # cuDNN times its algorithms for each new input shape; None: the recipe's
    # train through the model's fast path (Training.optimize_for_training, e.g. torch.compile with static shapes):
    # the same mathematics as eager; the first steps include compilation (tens of seconds on a GPU)
    compile: bool = False
    # ddp: every rank holds the whole model, gradients and optimizer state; fsdp (FSDP2): each rank 1/world_size of
    # them, per block of Training.blocks (bf16: bf16 compute, fp32 master weights and reduction; sharded checkpoints)
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    reshard_after_forward: bool = True  # fsdp: free a block's gathered weights after its forward
    # none; full: every block of Training.blocks recomputes its forward in the backward instead of keeping its
    # activations; selective: every activation_checkpointing_every-th block
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    activation_checkpointing_every: int = Field(2, ge=1)
    async_checkpoint: bool = False  # fsdp: copy to host memory, write in the background while training goes on
    # an average of the weights inference uses (Inference.modules), ema = decay * ema + (1 - decay) * weights after
    # every real update (training.ema.EMA), for validation and inference; 0: none; typical 0.999 to 0.9999
    ema_decay: float = Field(0.0, ge=0, lt=1)


SHARED_SECTIONS: dict[str, type[Section]] = {"audio": AudioConfig, "data": DataConfig, "train": TrainConfig}
"""The sections of ``config.json`` every model reads, beside one per model (``models.config_schemas``)."""


PROJECT_RECIPE: dict[str, Any] = {"audio.mel_framing": UNRESOLVED_FRAMING, "train.grad_clip": 0.0,
                                  "train.cudnn_benchmark": True}
"""What a shared setting left null takes when the model's ``ModelSpec.recipe`` does not name it."""


def apply_recipe(spec: ModelSpec, cfg: Config) -> Config:
    """Fill the shared settings ``cfg`` leaves null (None) for model ``spec``, in place: ``audio.mel_framing`` from the
    ``data.mel_dir`` folder's record (a vocoder on Tacotron2's mels frames as they were made), else ``spec.recipe``
    (its reference's values), else :data:`PROJECT_RECIPE`. Called once where a run's config is loaded, so checkpoints
    record the values used. Returns ``cfg``."""
    recipe = {**PROJECT_RECIPE, **spec.recipe}
    if cfg.data.mel_dir and (framing := mel_dir_framing(cfg.data.mel_dir)):
        recipe["audio.mel_framing"] = framing
    for name, value in recipe.items():
        section, key = name.split(".")
        if getattr(cfg.section(section), key) is None:
            setattr(cfg.section(section), key, value)
    return cfg


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
