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

import argparse
from pathlib import Path
from typing import Any, Optional
import torch
from torch import nn
from model import Batch
from utils.data.audio import check_wav_output, save_wav
from utils.config import Config
from utils.data.datasets import read_mel
from utils.plotting import add_audio, first_time


# --- inference.py --------------------------------------------------------------------------------------------

def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """HiFi-GAN's ``inference.py`` options: what to vocode, ``--mel`` or ``--wav``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mel", help="a torch tensor file (n_mels, frames) to vocode")
    source.add_argument("--wav", help="a wav whose mel is vocoded (copy-synthesis)")

@torch.no_grad()
def vocode(model: nn.Module, mel: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Mel ``(n_mels, frames)`` -> audio ``(frames * hop_length,)`` in [-1, 1] (tanh output), float32 on the CPU."""
    device = next(model.generator.parameters()).device
    return model.generator(mel.unsqueeze(0).to(device))[0, 0].float().cpu()

def log_validation(model: nn.Module, batch: Batch, outputs: torch.Tensor, step: int, writer: Any, output_dir: Any,
                   cfg: Optional[Config] = None) -> None:
    """Audio of the first utterance of a validation batch, for TensorBoard's audio tab.

    ``audio/vocoded``: the generator's output for that item, ``outputs[0]`` ``(samples,)`` (the validation crop:
    the first ``hifigan.segment_length`` samples of the clip; the loader does not shuffle, so it is the same
    utterance at every validation), at ``audio.sampling_rate`` Hz. ``audio/ground_truth``: the item's audio
    ``batch["audio"][0]``, at the first validation of the run only. Nothing is written without a ``writer`` or
    a ``cfg``.

    Args:
        model: the :class:`HiFiGAN` (unused: ``outputs`` holds its audio).
        batch: ``{"mel": (B, n_mels, frames), "audio": (B, samples), ...}``.
        outputs: the generator's audio for ``batch``, ``(B, samples)`` in [-1, 1].
        step: the training step.
        writer: a ``SummaryWriter`` or ``None``.
        output_dir: the run's folder (unused).
        cfg: the run's config (``audio.sampling_rate``).
    """
    if writer is None or cfg is None:
        return
    add_audio(writer, "audio/vocoded", outputs[0].float(), step, cfg.audio.sampling_rate)
    if first_time(writer, "audio/ground_truth"):
        add_audio(writer, "audio/ground_truth", batch["audio"][0].float(), step, cfg.audio.sampling_rate)

def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for HiFi-GAN: vocode ``--mel`` or the mel of ``--wav`` into the wav ``--output``.

    Raises:
        ValueError: neither ``--mel`` nor ``--wav``, or an output that is not a .wav path.
        DataError: see :func:`read_mel`.
    """
    if not (args.mel or args.wav):
        raise ValueError(f"{args.checkpoint} is a HiFi-GAN checkpoint: give --mel or --wav")
    output = check_wav_output(args.output)
    audio = vocode(model, read_mel(args, cfg), cfg)
    save_wav(output, audio, cfg.audio.sampling_rate)
    print(f"wrote {output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]
