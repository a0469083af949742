"""jik876/hifi-gan's generator files (``g_<step>``) read into this model (``--init-from``, ``import_weights``)."""

from __future__ import annotations

import re
from typing import Any

from utils.checkpoint.published import Weights, weight_norm_key
from utils.config import Config


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """jik876/hifi-gan's generator files (``{"generator": state_dict}``; V1, V2, V3), or ``None`` for another format.
    Its residual blocks ``resblocks.<i * kernels + j>.convs1``/``convs2`` (type 1) or ``.convs`` (type 2, V3) are
    ``mrfs.<i>.blocks.<j>.dilated``/``plain`` here (``kernels``: ``hifigan.resblock_kernel_sizes``), old weight norm's
    ``weight_g``/``weight_v`` the parametrization. Such a file holds no discriminator: it starts afresh."""
    state = loaded.get("generator") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "conv_pre.weight_v" not in state:
        return None
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    renamed = {}
    for key, value in state.items():
        match = re.match(r"^resblocks\.(\d+)\.convs([12]?)\.(.*)$", key)
        if match:
            index, kind = int(match.group(1)), "plain" if match.group(2) == "2" else "dilated"
            key = f"mrfs.{index // kernels}.blocks.{index % kernels}.{kind}.{match.group(3)}"
        renamed["generator." + weight_norm_key(key)] = value
    return Weights("jik876/hifi-gan's generator file", "hifigan", renamed, partial=("discriminator.",))
