"""WaveGlow at inference: vocoding a mel (``inference.py --mel`` or ``--wav``; a mel-making model's ``--vocoder``) and
the validation audio for TensorBoard."""

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
from utils.plotting import add_audio, first_time, fixed_random_state

LOG_AUDIO_SECONDS = 2.0  # the longest clip vocoded for TensorBoard at each validation (the crop is usually shorter)


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """WaveGlow's ``inference.py`` options: what to vocode (``--mel`` or ``--wav``) and ``--sigma``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mel", help="a torch tensor file (n_mels, frames) to vocode")
    source.add_argument("--wav", help="a wav whose mel is vocoded (copy-synthesis)")
    parser.add_argument("--sigma", type=float, help="noise scale (default: waveglow.infer_sigma, 0.6)")


def vocode(model: nn.Module, mel: torch.Tensor, cfg: Config, sigma: Optional[float] = None) -> torch.Tensor:
    """Mel ``(n_mels, frames)`` -> audio ``(samples,)`` on the CPU, unclamped (``sigma``: ``waveglow.infer_sigma``)."""
    device = next(model.parameters()).device
    sigma = cfg.waveglow.infer_sigma if sigma is None else sigma
    return model.infer(mel.unsqueeze(0).to(device), sigma=sigma)[0].float().cpu()


def log_validation(model: nn.Module, batch: Batch, outputs, step: int, writer: Any, output_dir: Any,
                   cfg: Optional[Config] = None) -> None:
    """Audio of the first utterance of a validation batch ``{"mel": (B, n_mels, frames), "audio": (B, samples), ...}``
    for TensorBoard (nothing without a ``writer`` or a ``cfg``): ``audio/vocoded``, at most :data:`LOG_AUDIO_SECONDS`
    of its mel vocoded with the same noise every time, and at the first validation ``audio/ground_truth``, as many
    samples of its audio (the loader does not shuffle: the same utterance and crop every time)."""
    if writer is None or cfg is None:
        return
    rate, hop = cfg.audio.sampling_rate, cfg.audio.hop_length
    frames = max(1, min(batch["mel"].shape[2], int(LOG_AUDIO_SECONDS * rate / hop)))
    mel = batch["mel"][0, :, :frames].float()
    with fixed_random_state(mel.device):
        audio = vocode(model, mel, cfg)
    add_audio(writer, "audio/vocoded", audio, step, rate)
    if first_time(writer, "audio/ground_truth"):
        add_audio(writer, "audio/ground_truth", batch["audio"][0, :frames * hop], step, rate)


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for WaveGlow: vocode ``--mel`` or the mel of ``--wav`` into the wav ``--output``. Raises
    ValueError for neither ``--mel`` nor ``--wav``, a bad ``--sigma``, or an output that is not a .wav path; DataError:
    see :func:`read_mel`."""
    if not (args.mel or args.wav):
        raise ValueError(f"{args.checkpoint} is a WaveGlow checkpoint: give --mel or --wav")
    if args.sigma is not None and not 0 <= args.sigma < float("inf"):
        raise ValueError(f"--sigma must be a finite number >= 0, got {args.sigma}")
    output = check_wav_output(args.output)
    audio = vocode(model, read_mel(args, cfg), cfg, args.sigma)
    save_wav(output, audio, cfg.audio.sampling_rate)
    print(f"wrote {output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]
