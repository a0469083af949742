"""HiFi-GAN's data: audio crops with their mels (or mels computed on the device)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from model import Batch
from models.hifigan.network import mel_function
from utils.config import Config
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus
from utils.data.datasets import AudioMelDataset, Crop


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` of ``hifigan.segment_length`` crops (random for training, the first
    for validation), each clip first scaled to the peak ``hifigan.peak_normalize`` (jik876's ``MelDataset``); mels
    ``(n_mels, MelSpectrogram.num_frames(segment_length))``: ``segment_length // hop_length`` in jik876's framing, the
    recipe's (the generator's ``frames * hop_length`` samples line up with the crop; NVIDIA's gives one frame more, its
    samples cut off).

    Raises:
        ValueError: ``segment_length`` not a multiple of ``audio.hop_length`` (the output would not line up).
        DataError: see :class:`AudioMelDataset`.
    """
    return datasets_of(cfg, load_splits(cfg.data))


def datasets_of(cfg: Config, splits: tuple[Corpus, Corpus]) -> tuple[Dataset, Dataset]:
    """:func:`build_datasets` of the ``(train, val)`` corpora ``splits`` (a corpus a part reads: audio handed to each
    dataset's ``item``). Raises ValueError as :func:`build_datasets`."""
    seg = cfg.hifigan.segment_length
    if seg % cfg.audio.hop_length:
        raise ValueError(f"hifigan.segment_length ({seg}) must be a multiple of audio.hop_length "
                         f"({cfg.audio.hop_length})")
    kwargs = {"with_mel": not cfg.hifigan.mel_on_device, "peak": cfg.hifigan.peak_normalize}
    return (AudioMelDataset(splits[0], cfg.audio, Crop(seg, seed=cfg.train.seed), **kwargs),
            AudioMelDataset(splits[1], cfg.audio, Crop(seg, random=False), **kwargs))


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the audio's
    device (``hifigan.mel_on_device``) unless the batch has one."""
    if "mel" in batch:
        return batch
    with torch.no_grad():
        return {**batch, "mel": mel_function(cfg.audio, batch["audio"].device)(batch["audio"])}
