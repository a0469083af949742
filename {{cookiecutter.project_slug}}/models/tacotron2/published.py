"""NVIDIA's Tacotron2 checkpoints (``tacotron2_statedict.pt``; its ``train.py`` checkpoints), read into this model."""

from __future__ import annotations

import re
from typing import Any

from utils.checkpoint.published import Weights
from utils.config import Config


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """NVIDIA/tacotron2's checkpoints (``{"state_dict", "iteration", "optimizer", "learning_rate"}``), or ``None`` for
    another format. The same network as this one, but NVIDIA wraps each convolution and linear layer (``.conv.``,
    ``.linear_layer.`` in its keys) and names the attention ``attention_layer``, with a ``location_layer`` inside."""
    state = loaded.get("state_dict") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "embedding.weight" not in state or not any(".linear_layer." in k for k in state):
        return None
    renamed = {}
    for key, value in state.items():
        key = key.replace("attention_layer.location_layer.", "attention.").replace("attention_layer.", "attention.")
        renamed[re.sub(r"\.(linear_layer|conv)\.", ".", key)] = value
    return Weights("NVIDIA/tacotron2's checkpoint", "tacotron2", renamed)
