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

import torch
from torch import nn
from modules.hifigan import (Generator)
from utils.config import Config
from utils.onnx_export import ExportPart
from models.hifigan.network import HiFiGAN


# --- scripts/export.py --format onnx ------------------------------------------------------------------------------

class GeneratorExport(nn.Module):
    """The generator as it is exported: mel ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1]
    (:meth:`HiFiGAN.forward` without the batch dict)."""

    def __init__(self, generator: Generator):
        super().__init__()
        self.generator = generator

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.generator(mel).squeeze(1)

def export_parts(model: HiFiGAN, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: one part, ``generator``: ``mel`` ``(B, n_mels, frames)`` (natural-log mel) ->
    ``audio`` ``(B, frames * hop_length)``, batch and frames dynamic (checked at 1 x 32 and 2 x 19 frames). No
    noise input: the generator is deterministic (Section 2.2)."""
    gen = torch.Generator().manual_seed(0)
    n_mels = cfg.audio.n_mels
    return [ExportPart(
        name="generator", module=GeneratorExport(model.generator),
        inputs=(torch.randn(1, n_mels, 32, generator=gen),), other_inputs=(torch.randn(2, n_mels, 19, generator=gen),),
        input_names=("mel",), output_names=("audio",),
        dynamic_axes={"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 1: "samples"}},
        description=f"mel (B, {n_mels}, frames) -> audio (B, frames * {model.generator.hop_length})")]
