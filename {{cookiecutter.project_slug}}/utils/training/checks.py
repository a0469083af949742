"""Settings a model cannot honour, refused as one :class:`ConfigError` line: before any process group, data or model
exists (:func:`check_settings`), and while the model and datasets are built (:func:`model_config_errors`)."""

from __future__ import annotations

import contextlib
from typing import Callable, Mapping, Sequence

from model import ModelSpec, adam
from utils.config import MOVED, Config, ConfigError
from utils.data.corpus import DataError
from utils.run_log import one_line
from utils.training.optim import OptimizerConfig


def check_settings(spec: ModelSpec, cfg: Config, checks: Sequence[Callable[[ModelSpec, Config], None]]) -> None:
    """Refuse settings that cannot work with this model or would do nothing in the chosen mode: a :class:`ConfigError`
    naming the setting and what to do instead; then ``checks``, those of the project's optional parts
    (``parts.PARTS.checks``), each raising one."""
    train, optimizer, defaults, phases = cfg.train, cfg.optimizer, OptimizerConfig(), spec.training.phases
    if phases is not None and phases.build_scheduler is not None and (
            optimizer.schedule != defaults.schedule or optimizer.warmup_steps != defaults.warmup_steps):
        raise ConfigError(f"optimizer.schedule={optimizer.schedule}, optimizer.warmup_steps={optimizer.warmup_steps}: "
                          f"model '{spec.name}' builds its own LR schedulers (Phases.build_scheduler), which these "
                          f"settings would not change; leave them at {defaults.schedule} and {defaults.warmup_steps}, "
                          "or schedule the learning rate in the model's build_scheduler")
    if cfg.data.batching != "random" and not spec.training.variable_length:
        raise ConfigError(f"data.batching={cfg.data.batching}: model '{spec.name}' trains on items of one length (its "
                          "Training.variable_length is not set), so there is no padding to save; use "
                          "data.batching=random")
    if train.compile and spec.training.optimize_for_training is None:
        raise ConfigError(f"train.compile=true, but model '{spec.name}' has no fast path "
                          "(Training.optimize_for_training)")
    check_rate_not_in_section(spec)
    for check in checks:
        check(spec, cfg)


def check_rate_not_in_section(spec: ModelSpec) -> None:
    """Refuse a model's section that declares a key an earlier version gave every model's (``learning_rate``,
    ``weight_decay``: ``utils.config.MOVED``) where the default optimizer, which reads the ``optimizer`` section, would
    leave it unread (a model of one's own written for that version): a :class:`ConfigError` naming each and its new
    key."""
    fields = getattr(spec.config_cls, "model_fields", {})
    unread = [f"{spec.name}.{old[2:]} (now {new})" for old, new in MOVED.items() if old[2:] in fields and old[:2] == "*."]
    if unread and spec.training.build_optimizer is adam:
        raise ConfigError(f"{', '.join(unread)}: model '{spec.name}' declares it in its section, which the default "
                          "optimizer does not read since it moved (see CHANGELOG); take it out of the section and give "
                          "the model's own value in its ModelSpec.recipe")


def check_val_vocoder(spec: ModelSpec, cfg: Config, models: Mapping[str, ModelSpec]) -> None:
    """Refuse a vocoder checkpoint for the validation audio (the key of the model's section ``Training.val_vocoder``
    names) where the registry ``models`` holds no vocoder (``Inference.vocode``) to load it as: a
    :class:`ConfigError`."""
    key = spec.training.val_vocoder
    path = getattr(cfg.section(spec.name), key) if key else None
    if path is not None and not any(other.inference is not None and other.inference.vocode is not None
                                    for other in models.values()):
        raise ConfigError(f"{spec.name}.{key}={path}: this project has no vocoder model to load it as (models: "
                          f"{', '.join(models)}); leave it null for Griffin-Lim's validation audio")


@contextlib.contextmanager
def model_config_errors(model_name: str):
    """A ValueError from building the model or its datasets is a bad value in the model's config section: a
    :class:`ConfigError` ``"<model_name> config: <the error, in one line>"`` (a ConfigError or DataError passes)."""
    try:
        yield
    except (ConfigError, DataError):
        raise
    except ValueError as err:
        raise ConfigError(f"{model_name} config: {one_line(err)}") from None
