"""HiFi-GAN at inference: vocoding a mel (``inference.py --mel`` or ``--wav``; another model's vocoder) and the audio
of a validation batch for TensorBoard.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from model import Batch
from utils.config import Config
from utils.data.audio import check_wav_output, save_wav
from utils.data.datasets import read_mel
from utils.plotting import add_audio, first_time


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
    """Audio of the first utterance of a validation batch ``{"audio": (B, samples), ...}`` for TensorBoard; nothing
    without a ``writer`` or a ``cfg`` (``model`` and ``output_dir`` are unused).

    ``audio/vocoded``: the generator's output for it, ``outputs[0]`` (``outputs``: ``(B, samples)`` in [-1, 1]), at
    ``audio.sampling_rate`` Hz; ``audio/ground_truth``: its audio, at the run's first validation only. The validation
    crop is the first ``hifigan.segment_length`` samples of the clip and the loader does not shuffle, so it is the same
    utterance at every validation.
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
