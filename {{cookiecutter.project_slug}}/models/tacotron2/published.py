"""NVIDIA's Tacotron2 checkpoints (``tacotron2_statedict.pt``; its ``train.py`` checkpoints), read into this model."""

from __future__ import annotations

import re
from typing import Any

from utils.checkpoint.published import Published, Weights
from utils.config import Config

NVIDIA_CLEANERS = ["nvidia_english_cleaners"]
"""What text NVIDIA's weights were trained on: its ``english_cleaners`` (:mod:`models.tacotron2.text.cleaners`)."""


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """NVIDIA/tacotron2's checkpoints (``{"state_dict", "iteration", "optimizer", "learning_rate"}``, or the bare state
    dict), or ``None`` for another format. The same network as this one, but NVIDIA wraps each convolution and linear
    layer (``.conv.``, ``.linear_layer.`` in its keys) and names the attention ``attention_layer``, with a
    ``location_layer`` inside. A config that keeps the default ``tacotron2.text_cleaners`` gets
    :data:`NVIDIA_CLEANERS` (``cfg`` is changed; the weights expect NVIDIA's symbol ids), said in ``source``."""
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "embedding.weight" not in state or not any(".linear_layer." in k for k in state):
        return None
    renamed = {}
    for key, value in state.items():
        key = key.replace("attention_layer.location_layer.", "attention.").replace("attention_layer.", "attention.")
        renamed[re.sub(r"\.(linear_layer|conv)\.", ".", key)] = value
    source = "NVIDIA/tacotron2's checkpoint"
    if cfg.tacotron2.text_cleaners == type(cfg.tacotron2)().text_cleaners:
        cfg.tacotron2.text_cleaners = list(NVIDIA_CLEANERS)
        source += (f"; text cleaned as NVIDIA's: tacotron2.text_cleaners={NVIDIA_CLEANERS} (replacing the default; "
                   "another value is kept)")
    return Weights(source, "tacotron2", renamed)


PUBLISHED = Published(read=read_published, source="NVIDIA's Tacotron2 checkpoint")
"""NVIDIA/tacotron2's checkpoints, as ``parts.py`` registers Tacotron2's reader."""
