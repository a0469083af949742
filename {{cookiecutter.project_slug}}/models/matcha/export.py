"""Matcha-TTS's ONNX export: the whole text-to-mel graph in one file, ``text_to_mel``, its Euler steps fixed at export
(``scripts/export.py --format onnx``), as the authors' exporter makes it (shivammehta25/Matcha-TTS,
``matcha/onnx/export.py``: inputs ``x``, ``x_lengths``, ``scales`` = [temperature, length_scale], ``spks``; outputs
``mel``, ``mel_lengths``), with the sampler's noise an input where theirs draws it in the graph: the file computes
what the PyTorch model computes from the same noise, which ONNX Runtime's random operators could not."""

from __future__ import annotations

import torch
from torch import nn

from models.matcha.network import MatchaTTS, fix_length
from utils.config import Config
from utils.onnx_export import Export, ExportError, ExportPart


class TextToMelExport(nn.Module):
    """:meth:`MatchaTTS.synthesise` with ``n_timesteps`` Euler steps, its mels in log-mel units (times ``mel_std``,
    plus ``mel_mean``), cut to the longest item.

    Inputs: ``x`` ``(B, T_text)`` int64 token ids (zeros past each length), ``x_lengths`` ``(B,)`` int64, ``scales``
    ``(2,)`` float32 [temperature, length_scale], then ``spks`` ``(B,)`` int64 speaker indices where the model has a
    speaker table, and ``noise`` ``(B, n_feats, N)`` float32 standard normal: the sampler starts at ``temperature`` times
    its first ``T`` frames (``T``: the longest item's frames rounded up to a multiple of 4; frames past ``N`` start at
    0, the mean: give ``N >= T``). Outputs: ``mel`` ``(B, n_feats, max(mel_lengths))`` float32 natural-log mel
    (a vocoder's ONNX file reads it; frames past an item's length are not silence), ``mel_lengths`` ``(B,)``
    int64 frames.
    """

    def __init__(self, model: MatchaTTS, n_timesteps: int, mel_mean: float, mel_std: float):
        super().__init__()
        self.model, self.n_timesteps = model, n_timesteps
        self.mel_mean, self.mel_std = mel_mean, mel_std

    def forward(self, x: torch.Tensor, x_lengths: torch.Tensor, scales: torch.Tensor, *spks_and_noise: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        *spks, noise = spks_and_noise
        out = self.model.synthesise(x, x_lengths, self.n_timesteps, scales[0], spks[0] if spks else None, scales[1],
                                    noise=noise)
        frames = torch.arange(out["mel_lengths"].max(), device=x.device)  # a size the graph computes, not a constant
        return out["decoder_out"].index_select(2, frames) * self.mel_std + self.mel_mean, out["mel_lengths"]


def export_parts(model: MatchaTTS, cfg: Config) -> list[ExportPart]:
    """``Export.parts``: one part, ``text_to_mel`` (:class:`TextToMelExport`, ``cfg.matcha.n_timesteps`` Euler steps),
    batch, text length, noise frames and mel frames dynamic; checked on one unpadded text and on a padded batch of two
    (a speaker each where the model has a table), each with noise longer than its frames, against
    :meth:`MatchaTTS.synthesise` given the same noise.

    Raises:
        ExportError: ``cfg.matcha`` records no ``mel_mean`` or ``mel_std`` (a training run sets them).
    """
    section = cfg.matcha
    if section.mel_mean is None or section.mel_std is None:
        raise ExportError("the checkpoint records no matcha.mel_mean or mel_std (a training run sets them): the scale "
                          "of its mels is unknown")
    gen = torch.Generator().manual_seed(0)
    speakers = model.speakers is not None
    n_vocab = model.encoder.embedding.num_embeddings
    module = TextToMelExport(model, section.n_timesteps, section.mel_mean, section.mel_std)

    def example(lengths: list[int], temperature: float, length_scale: float) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(1, n_vocab, (len(lengths), max(lengths)), generator=gen)
        lengths_ = torch.tensor(lengths)
        ids = ids.masked_fill(torch.arange(max(lengths))[None] >= lengths_[:, None], 0)
        spks = (torch.randint(0, model.n_spks, (len(lengths),), generator=gen),) if speakers else ()
        with torch.no_grad():  # the frames the sampler runs on, and a few more
            frames = module.model.synthesise(ids, lengths_, 1, 0.0, spks[0] if spks else None, length_scale)
        noise_frames = int(fix_length(int(frames["mel_lengths"].max()))) + 3
        return (ids, lengths_, torch.tensor([temperature, length_scale]), *spks,
                torch.randn(len(lengths), model.n_feats, noise_frames, generator=gen))

    def reference(ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, *spks_and_noise: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The PyTorch model with the scales as floats and the noise's first frames."""
        *spks, noise = spks_and_noise
        out = model.synthesise(ids, lengths, section.n_timesteps, float(scales[0]), spks[0] if spks else None,
                               float(scales[1]), noise=noise)
        frames = int(out["mel_lengths"].max())
        return out["decoder_out"][:, :, :frames] * section.mel_std + section.mel_mean, out["mel_lengths"]

    names = ("x", "x_lengths", "scales", *(("spks",) if speakers else ()), "noise")
    axes = {"x": {0: "batch", 1: "text"}, "x_lengths": {0: "batch"}, "noise": {0: "batch", 2: "noise_frames"},
            "mel": {0: "batch", 2: "frames"}, "mel_lengths": {0: "batch"}, **({"spks": {0: "batch"}} if speakers else {})}
    return [ExportPart(
        name="text_to_mel", module=module, inputs=example([11], section.temperature, section.length_scale),
        other_inputs=example([7, 4], 0.5, 1.3), input_names=names, output_names=("mel", "mel_lengths"),
        dynamic_axes=axes, reference=reference,
        description=f"x (B, L) int64, x_lengths (B,), scales [temperature, length_scale]"
                    f"{', spks (B,)' if speakers else ''}, noise (B, {model.n_feats}, N) -> mel (B, {model.n_feats}, "
                    f"frames) log-mel, mel_lengths (B,); {section.n_timesteps} Euler steps")]


EXPORT = Export(parts=export_parts)
"""Matcha-TTS's ONNX file, as ``parts.py`` registers it for ``scripts/export.py --format onnx``."""
