"""WaveGlow's ONNX export: the inverse flow with the noise as an input (``scripts/export.py --format onnx``)."""

from __future__ import annotations

import torch
from torch import nn

from models.waveglow.network import WaveGlow
from modules.waveglow import at_least_fp32
from utils.config import Config
from utils.onnx_export import Export, ExportPart


class WaveGlowInferExport(nn.Module):
    """:meth:`WaveGlow.infer` with the noise as an input: ``mel`` ``(B, n_mels, frames)`` and ``z`` ``(B, n_group,
    steps)`` -> ``audio`` ``(B, steps * n_group)`` in [-1, 1]. :meth:`WaveGlow.reverse` with two changes that keep the
    result (up to float32 rounding) and simplify the graph: each 1x1 convolution's inverse is computed once, here (a
    constant of the file, as in NVIDIA's export), and the upsampled mel is grouped by a reshape instead of ``unfold``.
    ``steps`` is ``frames * hop_length // n_group`` for the whole mel (what ``infer`` draws); fewer steps vocode a
    prefix."""

    def __init__(self, model: WaveGlow):
        super().__init__()
        self.cfg = model.cfg
        self.n_remaining = model.n_remaining
        self.upsample = model.upsample
        self.flows = model.flows
        for k, conv in enumerate(model.convs):
            with torch.no_grad():
                inverse = torch.linalg.inv(at_least_fp32(conv.weight)).to(conv.weight.dtype)
            self.register_buffer(f"inverse_{k}", inverse.unsqueeze(-1), persistent=False)

    def forward(self, mel: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        batch, g, steps = z.shape
        mel = self.upsample(mel)[:, :, :steps * g]  # (B, n_mels, samples): win_length >= hop_length leaves enough
        cond = mel.reshape(batch, mel.shape[1], steps, g).transpose(2, 3).reshape(batch, -1, steps)
        offset = g - self.n_remaining
        x = z[:, offset:]
        for k in reversed(range(self.cfg.n_flows)):
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = self.flows[k](x_a, cond)
            x = torch.cat([x_a, (x_b - out[:, :half]) * torch.exp(-out[:, half:])], dim=1)
            x = torch.nn.functional.conv1d(x, getattr(self, f"inverse_{k}"))
            if k > 0 and k % self.cfg.n_early_every == 0:
                offset -= self.cfg.n_early_size
                x = torch.cat([z[:, offset:offset + self.cfg.n_early_size], x], dim=1)
        return x.transpose(1, 2).reshape(batch, -1).clamp(-1.0, 1.0)


def export_parts(model: WaveGlow, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: one part, ``waveglow``: ``mel`` ``(B, n_mels, frames)`` and the noise ``z`` ``(B,
    n_group, frames * hop_length // n_group)`` the caller draws from N(0, sigma^2) (``waveglow.infer_sigma``) ->
    ``audio`` ``(B, samples)`` in [-1, 1]; batch, frames and steps dynamic, checked against :meth:`WaveGlow.reverse` on
    the same noise. Source: NVIDIA DeepLearningExamples, ``tensorrt/convert_waveglow2onnx.py`` (the same inputs)."""
    gen = torch.Generator().manual_seed(0)
    n_mels, g, hop = cfg.audio.n_mels, cfg.waveglow.n_group, cfg.audio.hop_length
    sigma = cfg.waveglow.infer_sigma

    def example(batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, n_mels, frames, generator=gen),
                sigma * torch.randn(batch, g, frames * hop // g, generator=gen))

    return [ExportPart(
        name="waveglow", module=WaveGlowInferExport(model), inputs=example(1, 24), other_inputs=example(2, 13),
        input_names=("mel", "z"), output_names=("audio",),
        dynamic_axes={"mel": {0: "batch", 2: "frames"}, "z": {0: "batch", 2: "steps"},
                      "audio": {0: "batch", 1: "samples"}},
        reference=lambda mel, z: model.reverse(mel, z).clamp(-1.0, 1.0),
        description=f"mel (B, {n_mels}, frames), z (B, {g}, frames * {hop} // {g}) -> audio (B, samples)")]


EXPORT = Export(parts=export_parts)
"""WaveGlow's ONNX files, as ``parts.py`` registers them for ``scripts/export.py --format onnx``."""
