"""HiFi-GAN's data: audio crops with their mels (or mels computed on the device), and synthetic benchmark batches."""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.data import Dataset

from model import Batch
from models.hifigan.network import mel_function
from utils.config import Config
from utils.data.corpus import load_splits
from utils.data.datasets import AudioMelDataset, Crop


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` of ``hifigan.segment_length`` crops (random for training, the first
    for validation), each clip first scaled to the peak ``hifigan.peak_normalize`` (jik876's ``MelDataset``); mels
    ``(n_mels, MelSpectrogram.num_frames(segment_length))``: ``segment_length // hop_length`` in jik876's framing, the
    recipe's (the generator's ``frames * hop_length`` samples line up with the crop; NVIDIA's gives one frame more, its
    samples cut off). With ``data.mel_dir`` the mels are read from that folder and cropped with the audio, as read, on
    frame boundaries: fine-tuning on Tacotron2's teacher-forced mels (``scripts/dump_gta_mels.py``), as
    jik876/hifi-gan's ``--fine_tuning`` does.

    Raises:
        ValueError: ``segment_length`` not a multiple of ``audio.hop_length`` (the output would not line up).
        DataError: see :class:`AudioMelDataset` (``data.mel_dir`` missing a mel, made with other settings).
    """
    seg = cfg.hifigan.segment_length
    if seg % cfg.audio.hop_length:
        raise ValueError(f"hifigan.segment_length ({seg}) must be a multiple of audio.hop_length "
                         f"({cfg.audio.hop_length})")
    train_utts, val_utts = load_splits(cfg.data)
    kwargs = {"with_mel": not cfg.hifigan.mel_on_device, "mel_dir": cfg.data.mel_dir,
              "peak": cfg.hifigan.peak_normalize}
    return (AudioMelDataset(train_utts, cfg.audio, Crop(seg, seed=cfg.train.seed), **kwargs),
            AudioMelDataset(val_utts, cfg.audio, Crop(seg, random=False), **kwargs))


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the audio's
    device (``hifigan.mel_on_device``) unless the batch has one."""
    if "mel" in batch:
        return batch
    with torch.no_grad():
        return {**batch, "mel": mel_function(cfg.audio, batch["audio"].device)(batch["audio"])}


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random HiFi-GAN batch of ``batch_size`` items of the training shapes: ``{"mel": (B, n_mels, segment //
    hop_length) standard normal, "audio": (B, segment) normal with standard deviation 0.1, "ids": [str] * B}``, float32
    on the CPU, ``segment`` the ``segment_length`` samples (default ``hifigan.segment_length``).

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``audio.hop_length``.
    """
    segment = cfg.hifigan.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"hifigan synthetic_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.audio.hop_length:
        raise ValueError(f"hifigan synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"audio.hop_length={cfg.audio.hop_length}")
    mel = torch.randn(batch_size, cfg.audio.n_mels, segment // cfg.audio.hop_length, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}
