"""The shared settings a config leaves null (None), filled with the model's reference recipe (:func:`apply_recipe`)."""

from __future__ import annotations

from typing import Any, Optional

from model import BatchFrames, ModelSpec
from utils.config import Config
from utils.framing import UNRESOLVED_FRAMING

PROJECT_RECIPE: dict[str, Any] = {"audio.mel_framing": UNRESOLVED_FRAMING, "train.grad_clip": 0.0,
                                  "train.cudnn_benchmark": True, "optimizer.lr": 1e-3, "optimizer.weight_decay": 0.0,
                                  "data.batching": "random", "data.max_frames": 0, "train.ema_decay": 0.0}
"""What a shared setting left null takes when the model's ``ModelSpec.recipe`` does not name it."""


def apply_recipe(spec: ModelSpec, cfg: Config, data_framing: Optional[str] = None) -> Config:
    """Fill the shared settings ``cfg`` leaves null for model ``spec``, in place (checkpoints record the values used):
    ``audio.mel_framing`` from ``data_framing``, the framing the training data records of its mels (a vocoder on a text
    model's mels frames as they were made: ``parts.PARTS.data_framing``), else ``spec.recipe`` (its reference's
    values), else :data:`PROJECT_RECIPE`; a :class:`BatchFrames` is its frames times the model section's ``batch_size``.
    Returns ``cfg``."""
    recipe = {**PROJECT_RECIPE, **spec.recipe, **({"audio.mel_framing": data_framing} if data_framing else {})}
    for name, value in recipe.items():
        section, key = name.split(".")
        if getattr(cfg.section(section), key) is None:
            if isinstance(value, BatchFrames):
                value = value.frames * cfg.section(spec.name).batch_size
            setattr(cfg.section(section), key, value)
    return cfg
