"""HiFi-GAN's ONNX export: the generator, mel -> audio (``scripts/export.py --format onnx``)."""

from __future__ import annotations

import torch
from torch import nn

from models.hifigan.network import HiFiGAN
from modules.hifigan import Generator
from utils.config import Config
from utils.onnx_export import Export, ExportPart


class GeneratorExport(nn.Module):
    """The generator as it is exported: mel ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1]."""

    def __init__(self, generator: Generator):
        super().__init__()
        self.generator = generator

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.generator(mel).squeeze(1)


def export_parts(model: HiFiGAN, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: one part, ``generator``: ``mel`` ``(B, n_mels, frames)`` (natural-log mel) ->
    ``audio`` ``(B, frames * hop_length)``, batch and frames dynamic. No noise input: the generator is deterministic."""
    gen = torch.Generator().manual_seed(0)
    n_mels = cfg.audio.n_mels
    return [ExportPart(
        name="generator", module=GeneratorExport(model.generator),
        inputs=(torch.randn(1, n_mels, 32, generator=gen),), other_inputs=(torch.randn(2, n_mels, 19, generator=gen),),
        input_names=("mel",), output_names=("audio",),
        dynamic_axes={"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 1: "samples"}},
        description=f"mel (B, {n_mels}, frames) -> audio (B, frames * {model.generator.hop_length})")]


EXPORT = Export(parts=export_parts)
"""HiFi-GAN's ONNX files, as ``parts.py`` registers them for ``scripts/export.py --format onnx``."""
