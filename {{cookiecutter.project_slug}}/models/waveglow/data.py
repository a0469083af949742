"""WaveGlow's data: audio crops with their mels (or mels computed on the device)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from model import Batch
from utils.config import Config
from utils.data.audio import MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus
from utils.data.datasets import AudioMelDataset, Crop


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` (random crops for training, first crop for validation; the mels in
    ``audio.mel_framing``, NVIDIA's by the recipe: ``1 + segment_length // hop_length`` frames, as ``Mel2Samp``).
    Raises DataError (see :class:`AudioMelDataset`)."""
    return datasets_of(cfg, load_splits(cfg.data))


def datasets_of(cfg: Config, splits: tuple[Corpus, Corpus]) -> tuple[Dataset, Dataset]:
    """:func:`build_datasets` of the ``(train, val)`` corpora ``splits`` (a corpus a part reads: audio handed to each
    dataset's ``item``)."""
    seg, with_mel = cfg.waveglow.segment_length, not cfg.waveglow.mel_on_device
    return (AudioMelDataset(splits[0], cfg.audio, Crop(seg, seed=cfg.train.seed), with_mel=with_mel),
            AudioMelDataset(splits[1], cfg.audio, Crop(seg, random=False), with_mel=with_mel))


_MELS: dict = {}  # (device, audio settings) -> MelSpectrogram on that device


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the audio's
    device (``waveglow.mel_on_device``) unless the batch has one (the workers' mels to float32 rounding)."""
    if "mel" in batch:
        return batch
    key = (str(batch["audio"].device), tuple(cfg.audio.model_dump().values()))
    if key not in _MELS:
        _MELS[key] = MelSpectrogram(cfg.audio).to(batch["audio"].device)
    with torch.no_grad():
        return {**batch, "mel": _MELS[key](batch["audio"])}
