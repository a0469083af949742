"""jik876/hifi-gan's generator files (``g_<step>``) read into this model (``--init-from``, ``import_weights``)."""

from __future__ import annotations

import json
import re
from typing import Any

from utils.checkpoint.files import CheckpointError
from utils.checkpoint.published import Published, Weights, weight_norm_key
from utils.config import Config

VARIANTS = {  # jik876/hifi-gan's config_v1.json, config_v2.json, config_v3.json: their generator settings
    "V1": {"upsample_rates": (8, 8, 2, 2), "upsample_kernel_sizes": (16, 16, 4, 4), "upsample_initial_channel": 512,
           "resblock": 1, "resblock_kernel_sizes": (3, 7, 11), "resblock_dilation_sizes": ((1, 3, 5),) * 3},
    "V2": {"upsample_rates": (8, 8, 2, 2), "upsample_kernel_sizes": (16, 16, 4, 4), "upsample_initial_channel": 128,
           "resblock": 1, "resblock_kernel_sizes": (3, 7, 11), "resblock_dilation_sizes": ((1, 3, 5),) * 3},
    "V3": {"upsample_rates": (8, 8, 4), "upsample_kernel_sizes": (16, 16, 8), "upsample_initial_channel": 256,
           "resblock": 2, "resblock_kernel_sizes": (3, 5, 7), "resblock_dilation_sizes": ((1, 2), (2, 6), (3, 12))},
}
"""The published generators (the paper's Table 1). Their weights' shapes tell them apart: see :func:`shapes`."""


def shapes(settings: Any) -> dict[str, Any]:
    """What a generator's weight shapes show of its ``hifigan`` ``settings`` (a mapping or the config section): all
    but the upsampling rates and the dilations' values (only how many dilations each residual block has)."""
    get = settings.get if isinstance(settings, dict) else lambda key: getattr(settings, key)
    return {"upsample_initial_channel": get("upsample_initial_channel"), "resblock": get("resblock"),
            "upsample_kernel_sizes": tuple(get("upsample_kernel_sizes")),
            "resblock_kernel_sizes": tuple(get("resblock_kernel_sizes")),
            "dilations per residual block": tuple(len(d) for d in get("resblock_dilation_sizes"))}


def file_shapes(state: dict) -> dict[str, Any]:
    """:func:`shapes` as read from a jik876 generator ``state_dict`` (``conv_pre``, ``ups.<i>``, ``resblocks.<n>``).
    The kernels are those of the first upsampling stage's residual blocks ``resblocks.<j>``, ``j < kernels``: those
    with ``resblocks.0``'s channels (each stage halves them), whatever the count of upsampling layers (V1 without
    ``ups.3`` has V1's kernels, not 12 blocks / 3 layers = 4)."""
    ups = sorted({int(m.group(1)) for key in state if (m := re.match(r"^ups\.(\d+)\.weight_v$", key))})
    convs = {}  # (residual block, convolution): (channels, kernel) of its first convolution list, convs1 or convs
    for key in state:
        if m := re.match(r"^resblocks\.(\d+)\.convs1?\.(\d+)\.weight_v$", key):
            convs[int(m.group(1)), int(m.group(2))] = (state[key].shape[0], state[key].shape[-1])
    kernels = 0
    while (kernels, 0) in convs and convs[kernels, 0][0] == convs[0, 0][0]:
        kernels += 1
    return {"upsample_initial_channel": state["conv_pre.weight_v"].shape[0],
            "resblock": 2 if any(re.match(r"^resblocks\.\d+\.convs\.", key) for key in state) else 1,
            "upsample_kernel_sizes": tuple(state[f"ups.{i}.weight_v"].shape[-1] for i in ups),
            "resblock_kernel_sizes": tuple(convs[j, 0][1] for j in range(kernels)),
            "dilations per residual block": tuple(sum(block == j for block, _ in convs) for j in range(kernels))}


def generator_settings(state: dict, cfg: Config) -> tuple[str, str]:
    """The published variant whose shapes ``state`` has (``""``: none) and what :func:`read_published` says of it. A
    ``cfg`` whose generator has other shapes gets the variant's settings (``cfg.hifigan`` is changed).

    Raises:
        CheckpointError: the shapes fit neither ``cfg``'s generator nor a variant's; names the variant that differs in
            the fewest of :func:`shapes`' entries, and what differs.
    """
    found = file_shapes(state)
    variant = next((name for name, settings in VARIANTS.items() if shapes(settings) == found), "")
    if shapes(cfg.hifigan) == found:
        return variant, ""
    if variant:
        changed = {key: value for key, value in VARIANTS[variant].items() if getattr(cfg.hifigan, key) != value}
        for key, value in changed.items():
            setattr(cfg.hifigan, key, value)
        return variant, (f"; {variant}'s generator settings (config_{variant.lower()}.json) replace the config's: "
                         + ", ".join(f"hifigan.{key}={json.dumps(value, separators=(',', ':'))}"
                                     for key, value in changed.items()))
    candidates = {name: shapes(value) for name, value in VARIANTS.items()}
    differs = {name: [key for key in found if theirs[key] != found[key]] for name, theirs in candidates.items()}
    closest = min(differs, key=lambda name: len(differs[name]))  # the first, V1 before V2 before V3, of a tie
    raise CheckpointError(
        f"jik876/hifi-gan's generator file fits neither this config's generator nor V1, V2 or V3; the closest, "
        f"{closest}, differs in " + "; ".join(f"{key} (the file: {found[key]}, {closest}: {candidates[closest][key]})"
                                             for key in differs[closest])
        + ". Give the generator's settings with --set hifigan.KEY=VALUE")


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """jik876/hifi-gan's generator files (``{"generator": state_dict}``; V1, V2, V3), or ``None`` for another format.
    Its residual blocks ``resblocks.<i * kernels + j>.convs1``/``convs2`` (type 1) or ``.convs`` (type 2, V3) are
    ``mrfs.<i>.blocks.<j>.dilated``/``plain`` here (``kernels``: ``hifigan.resblock_kernel_sizes``), old weight norm's
    ``weight_g``/``weight_v`` the parametrization. Such a file holds no discriminator: it starts afresh. Which of
    :data:`VARIANTS` it is comes from its shapes: a ``cfg`` whose generator does not fit gets that variant's settings
    (``cfg`` is changed; said in ``source``).

    Raises:
        CheckpointError: its shapes fit neither ``cfg``'s generator nor a published variant's.
    """
    state = loaded.get("generator") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "conv_pre.weight_v" not in state:
        return None
    variant, applied = generator_settings(state, cfg)
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    renamed = {}
    for key, value in state.items():
        match = re.match(r"^resblocks\.(\d+)\.convs([12]?)\.(.*)$", key)
        if match:
            index, kind = int(match.group(1)), "plain" if match.group(2) == "2" else "dilated"
            key = f"mrfs.{index // kernels}.blocks.{index % kernels}.{kind}.{match.group(3)}"
        renamed["generator." + weight_norm_key(key)] = value
    source = f"jik876/hifi-gan's {variant + ' ' if variant else ''}generator file{applied}"
    return Weights(source, "hifigan", renamed, partial=("discriminator.",))


PUBLISHED = Published(read=read_published, source="jik876's HiFi-GAN generator")
"""jik876/hifi-gan's generator files, as ``parts.py`` registers HiFi-GAN's reader."""
