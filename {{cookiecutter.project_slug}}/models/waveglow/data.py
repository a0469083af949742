"""WaveGlow's data: audio crops with their mels (or mels computed on the device), and synthetic benchmark batches."""

from __future__ import annotations

from typing import Optional

import torch
from torch.utils.data import Dataset

from model import Batch
from utils.config import Config
from utils.data.audio import MelSpectrogram
from utils.data.corpus import load_splits
from utils.data.datasets import AudioMelDataset, Crop


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` (random crops for training, first crop for validation; the mels
    in ``audio.mel_framing``, NVIDIA's by the recipe: ``1 + segment_length // hop_length`` frames, as ``Mel2Samp``).
    With ``data.mel_dir`` the mels are read from that folder (e.g. Tacotron2's teacher-forced mels, Shen et al. 2018's
    recipe for its vocoder) and cropped with the audio on frame boundaries.

    Raises:
        DataError: see :class:`AudioMelDataset` (``data.mel_dir`` missing a mel, made with other settings).
        ValueError: with ``data.mel_dir``, ``waveglow.segment_length`` not a multiple of ``audio.hop_length``.
    """
    train_utts, val_utts = load_splits(cfg.data)
    seg = cfg.waveglow.segment_length
    with_mel, mel_dir = not cfg.waveglow.mel_on_device, cfg.data.mel_dir
    return (AudioMelDataset(train_utts, cfg.audio, Crop(seg, seed=cfg.train.seed), with_mel=with_mel, mel_dir=mel_dir),
            AudioMelDataset(val_utts, cfg.audio, Crop(seg, random=False), with_mel=with_mel, mel_dir=mel_dir))


_MELS: dict = {}  # (device, audio settings) -> MelSpectrogram on that device


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the audio's
    device (``waveglow.mel_on_device``) unless the batch has one. The workers' :class:`MelSpectrogram` (equal to
    float32 rounding: batched vs single STFT)."""
    if "mel" in batch:
        return batch
    key = (str(batch["audio"].device), tuple(cfg.audio.model_dump().values()))
    if key not in _MELS:
        _MELS[key] = MelSpectrogram.from_config(cfg.audio).to(batch["audio"].device)
    with torch.no_grad():
        return {**batch, "mel": _MELS[key](batch["audio"])}


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random WaveGlow batch with the shapes of NVIDIA's reference benchmark harness, float32 on the CPU: ``{"mel": (B,
    n_mels, segment // hop_length + 1) standard normal, "audio": (B, segment) normal with standard deviation 0.1, "ids":
    [str] * B}``, ``segment`` = ``segment_length`` (default ``waveglow.segment_length``) samples: the frames of NVIDIA's
    framing, the recipe's (``MelSpectrogram.num_frames``), whatever ``audio.mel_framing`` says (same shapes as the
    reference's benchmark).

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``n_group``.
    """
    segment = cfg.waveglow.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"waveglow synthetic_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.waveglow.n_group:
        raise ValueError(f"waveglow synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"waveglow.n_group={cfg.waveglow.n_group}")
    mel = torch.randn(batch_size, cfg.audio.n_mels, segment // cfg.audio.hop_length + 1, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}
