"""HiFi-GAN (mel -> audio): config, model, losses, two-phase training step, data, inference, benchmark shapes.

Source: Kong, Kim and Bae, "HiFi-GAN: Generative Adversarial Networks for Efficient and High Fidelity Speech
Synthesis" (NeurIPS 2020); defaults are the paper's V1 (Appendix A; 13.92M generator parameters, Table 1)
and its training set-up (Section 3: AdamW with betas 0.8/0.99 and weight decay 0.01, learning rate 2e-4
decayed by 0.999 every epoch, batch 16; 8192-sample crops as in the authors' V1 configuration). The
layers are in ``modules/hifigan.py``; this file assembles them and tells ``train.py`` and ``inference.py``
how to use them.

The mel front end is the project's shared one (``utils.data.audio.MelSpectrogram`` with the ``audio``
section: 22050 Hz, hop 256, 80 mels), the same as Tacotron2's and WaveGlow's, so one HiFi-GAN checkpoint
vocodes Tacotron2's mels. The mel L1 loss compares mels made by that same front end (the authors' code
takes the loss's mel up to the Nyquist frequency instead; here one front end serves both).

Training alternates two optimizers (``ModelSpec.phases``): the discriminator step (MPD + MSD on real audio and
on the generator's output, LSGAN loss), then the generator step (LSGAN adversarial loss, feature matching x2,
mel L1 x45). :data:`TINY_OVERRIDES` is the ``hifigan`` entry of ``config.json``'s ``tiny`` block (a CPU smoke
run: a full discriminator + generator step pair takes a fraction of a second)::

    "hifigan": {"upsample_initial_channel": 32, "resblock_kernel_sizes": [3, 7],
                "resblock_dilation_sizes": [[1, 3], [1, 3]], "mpd_channels": [4, 8, 16, 32, 32],
                "msd_channels": [16, 16, 16, 32, 32, 32, 32], "segment_length": 2048, "batch_size": 2,
                "learning_rate": 0.001}
"""

from __future__ import annotations

import re
from typing import Any
from utils.config import Config
from utils.checkpoint.published import Weights, weight_norm_key


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """jik876/hifi-gan's generator files (``g_<step>``; ``{"generator": state_dict}``), or ``None`` for another
    format. The generator of this model; its residual blocks ``resblocks.<i * kernels + j>.convs1``/``convs2`` are
    ``mrfs.<i>.blocks.<j>.dilated``/``plain`` here (``kernels``: ``hifigan.resblock_kernel_sizes``), and old weight
    norm's ``weight_g``/``weight_v`` the parametrization. Such a file holds no discriminator: those start afresh.
    (Read from jik876's checkpoint code for the layout; its generator's output from the same weights equals this
    one's.)"""
    state = loaded.get("generator") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "conv_pre.weight_v" not in state:
        return None
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    renamed = {}
    for key, value in state.items():
        match = re.match(r"^resblocks\.(\d+)\.convs([12])\.(.*)$", key)
        if match:
            index, kind = int(match.group(1)), "dilated" if match.group(2) == "1" else "plain"
            key = f"mrfs.{index // kernels}.blocks.{index % kernels}.{kind}.{match.group(3)}"
        renamed["generator." + weight_norm_key(key)] = value
    return Weights("jik876/hifi-gan's generator file", "hifigan", renamed, partial=("discriminator.",))
