"""NVIDIA/waveglow's checkpoints (``waveglow_256channels_*.pt``, a pickled module), read without running any of it."""

from __future__ import annotations

import re
from typing import Any

import torch

from utils.checkpoint.published import Published, Record, Weights, record_parameters, weight_norm_key
from utils.config import Config

PICKLED_CLASSES = ("glow.WaveGlow", "glow.WN", "glow.Invertible1x1Conv", "torch.nn.modules.conv.Conv1d",
                   "torch.nn.modules.conv.ConvTranspose1d", "torch.nn.modules.container.ModuleList",
                   "torch.nn.utils.weight_norm.WeightNorm")
"""What NVIDIA's published WaveGlow file pickles: its ``glow`` classes, torch's modules and old weight norm hook."""


def fuse_cond_layers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """NVIDIA's WN before August 2019 (``waveglow_256channels.pt``): one conditioning convolution per layer,
    ``WN.<k>.cond_layers.<i>``, as its current single ``cond_layer``: the layers' outputs in order (weight norm is per
    output channel, so concatenating ``weight_g``, ``weight_v`` and ``bias`` is exact, as its ``convert_model.py``)."""
    fused, parts = {}, {}
    for key, value in state.items():
        match = re.match(r"^(WN\.\d+)\.cond_layers\.(\d+)\.(\w+)$", key)
        if match:
            parts.setdefault(f"{match.group(1)}.cond_layer.{match.group(3)}", {})[int(match.group(2))] = value
        else:
            fused[key] = value
    return {**fused, **{key: torch.cat([layers[i] for i in sorted(layers)]) for key, layers in parts.items()}}


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """NVIDIA/waveglow's checkpoints (``{"model": <the pickled glow.WaveGlow>, "iteration", "optimizer",
    "learning_rate"}``, zip or legacy format), or ``None`` for another format. The module arrives as records
    (:data:`PICKLED_CLASSES`, never run); its parameters are renamed: ``WN.<i>`` -> ``flows.<i>`` (``in_layers`` ->
    ``dilated``, ``res_skip_layers`` -> ``res_skip``, ``cond_layer`` -> ``cond``; older ``cond_layers``:
    :func:`fuse_cond_layers`), old weight norm's ``weight_g``/``weight_v`` -> the parametrization, and
    ``convinv.<i>.conv``'s ``(c, c, 1)`` weight -> the ``(c, c)`` matrix ``convs.<i>``."""
    if not isinstance(loaded, dict) or not isinstance(loaded.get("model"), Record):
        return None
    renamed, parts = {}, {"in_layers": "dilated", "res_skip_layers": "res_skip", "cond_layer": "cond"}
    for key, value in fuse_cond_layers(record_parameters(loaded["model"])).items():
        match = re.match(r"^WN\.(\d+)\.(\w+)\.(.*)$", key)
        if match:
            key = f"flows.{match.group(1)}.{parts.get(match.group(2), match.group(2))}.{match.group(3)}"
        elif re.match(r"^convinv\.\d+\.conv\.weight$", key):
            key, value = re.sub(r"^convinv\.(\d+)\.conv\.", r"convs.\1.", key), value.squeeze(-1)
        renamed[weight_norm_key(key)] = value
    return Weights("NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow)", "waveglow", renamed)


PUBLISHED = Published(read=read_published, source="NVIDIA's WaveGlow checkpoint", pickled_classes=PICKLED_CLASSES)
"""NVIDIA/waveglow's checkpoints, as ``parts.py`` registers WaveGlow's reader."""
