"""The shared settings a config leaves null (None), filled with the model's reference recipe (:func:`apply_recipe`)."""

from __future__ import annotations

from typing import Any

from model import ModelSpec
from utils.config import Config
from utils.framing import UNRESOLVED_FRAMING
from utils.training.settings import MEL_DIR

PROJECT_RECIPE: dict[str, Any] = {"audio.mel_framing": UNRESOLVED_FRAMING, "train.grad_clip": 0.0,
                                  "train.cudnn_benchmark": True}
"""What a shared setting left null takes when the model's ``ModelSpec.recipe`` does not name it."""


def apply_recipe(spec: ModelSpec, cfg: Config) -> Config:
    """Fill the shared settings ``cfg`` leaves null for model ``spec``, in place (checkpoints record the values used):
    ``audio.mel_framing`` from the ``data.mel_dir`` folder's record (a vocoder on Tacotron2's mels frames as they were
    made), else ``spec.recipe`` (its reference's values), else :data:`PROJECT_RECIPE`. Returns ``cfg``."""
    recipe = {**PROJECT_RECIPE, **spec.recipe}
    if MEL_DIR and cfg.data.mel_dir and (framing := MEL_DIR.mel_dir_framing(cfg.data.mel_dir)):
        recipe["audio.mel_framing"] = framing
    for name, value in recipe.items():
        section, key = name.split(".")
        if getattr(cfg.section(section), key) is None:
            setattr(cfg.section(section), key, value)
    return cfg
