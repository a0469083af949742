"""Phoneme ids + normalised mel pairs for Matcha-TTS: the dataset, the corpus's mel statistics, the padding collate.

Follows the authors' ``TextMelDataModule`` (shivammehta25/Matcha-TTS, ``matcha/data/text_mel_datamodule.py``): the
transcript's ``english_cleaners2`` phoneme ids with blanks (:mod:`models.matcha.text`), the log-mel of the clip in
jik876's frames (the recipe's ``audio.mel_framing``) normalised as ``(mel - mel_mean) / mel_std``, a batch padded to
frames the U-Net can halve (:func:`models.matcha.network.fix_length`).
"""

from __future__ import annotations

import math
import sys
from typing import Optional, Sequence

import torch
from torch.utils.data import Dataset

from model import Batch
from models.matcha.network import fix_length
from models.matcha.text import PhonemizerMissing, text_to_ids, versions
from utils.config import Config, ConfigError
from utils.data.audio import AudioConfig, MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus, DataError
from utils.data.sources import clip_samples, read_audio
from utils.data.speakers import speaker_indices


def encode(corpus: Corpus) -> list[list[int]]:
    """The phoneme ids with blanks of each transcript of ``corpus``.

    Raises:
        DataError: a transcript that phonemizes to nothing (named by id), or no phonemizer (what to install).
    """
    encoded = []
    for utt in corpus:
        try:
            encoded.append(text_to_ids(utt.text))
        except PhonemizerMissing as err:
            raise DataError(str(err)) from None
        except ValueError as err:
            raise DataError(f"utterance '{utt.id}' ({utt.audio}): {err}") from None
    return encoded


class MatchaDataset(Dataset):
    """Items ``{"text": LongTensor (L,), "mel": FloatTensor (n_mels, T), "id": str}`` (and ``"speaker": int``, the
    index of the utterance's speaker in ``speakers`` where given): the phoneme ids with blanks of the transcript
    (phonemized once, at construction) and the log-mel of the clip, normalised by ``stats`` ``(mel_mean, mel_std)``
    (``None``: the log-mel as it is, what :func:`mel_statistics` reads).

    Raises:
        DataError: no utterance given, see :func:`encode`, a speaker not in ``speakers``; an unreadable clip (in
            ``__getitem__`` and :meth:`lengths`).
    """

    def __init__(self, corpus: Corpus, audio_cfg: AudioConfig, stats: Optional[tuple[float, float]] = None,
                 split: str = "", speakers: Optional[Sequence[str]] = None):
        if len(corpus) == 0:
            raise DataError(f"MatchaDataset: no {split + ' ' if split else ''}utterances given")
        self.corpus, self.audio_cfg, self.stats = corpus, audio_cfg, stats
        self.mel_transform = MelSpectrogram(audio_cfg)
        self._ids = encode(corpus)
        self._speaker = None if speakers is None else speaker_indices(corpus, speakers)

    def mel(self, index: int, audio: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The log-mel ``(n_mels, T)`` of item ``index``, normalised by :attr:`stats` where given: of ``audio``
        (float32 ``(T,)`` at ``audio.sampling_rate`` Hz) where given, else of its utterance's audio source."""
        if audio is None:
            audio = read_audio(self.corpus[index].audio, self.audio_cfg.sampling_rate)
        with torch.no_grad():
            mel = self.mel_transform(audio)
        return mel if self.stats is None else (mel - self.stats[0]) / self.stats[1]

    def lengths(self) -> list[int]:
        """Mel frames of every item, from durations and headers (what ``data.batching`` sorts and budgets by)."""
        return self.mel_transform.num_frames(clip_samples(self.corpus, self.audio_cfg.sampling_rate)).tolist()

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> dict:
        return self.item(index)

    def item(self, index: int, audio: Optional[torch.Tensor] = None) -> dict:
        """Item ``index``, its mel made of ``audio`` (its utterance's sound, float32 ``(T,)`` at
        ``audio.sampling_rate`` Hz, wherever it was read from: a shard; None: read from its audio source). Raises
        DataError: an unreadable clip."""
        item = {"text": torch.tensor(self._ids[index], dtype=torch.long), "mel": self.mel(index, audio),
                "id": self.corpus[index].id}
        if self._speaker is not None:
            item["speaker"] = int(self._speaker[index])
        return item


def mel_statistics(dataset: MatchaDataset) -> tuple[float, float]:
    """``(mel_mean, mel_std)`` over every value of every log-mel of ``dataset`` (made without ``stats``), as the
    authors' ``generate_data_statistics.py``: the mean, and the square root of the mean square less the squared mean.

    Raises:
        DataError: an unreadable clip.
    """
    total, squares, count = 0.0, 0.0, 0
    for index in range(len(dataset)):
        mel = dataset.mel(index).double()
        total, squares, count = total + float(mel.sum()), squares + float((mel ** 2).sum()), count + mel.numel()
    mean = total / count
    return mean, math.sqrt(max(squares / count - mean ** 2, 0.0))


class MatchaCollate:
    """Batch :class:`MatchaDataset` items: ``{"text": (B, L_max) long padded with 0, "text_lengths": (B,) long, "mel":
    (B, n_mels, T) float32 zero past each item's frames, ``T`` the longest rounded up by
    :func:`models.matcha.network.fix_length`, "mel_lengths": (B,) long, "ids": [str] * B}`` in the items' order, and
    ``"speaker": (B,) long`` where the items carry speakers.

    Raises:
        ValueError: no items, an empty text or mel.
    """

    def __call__(self, items: Sequence[dict]) -> Batch:
        if not items:
            raise ValueError("MatchaCollate: empty list of items")
        for item in items:
            if item["text"].numel() == 0 or item["mel"].size(-1) == 0:
                raise ValueError(f"MatchaCollate: item '{item['id']}' has an empty text or mel")
        text_lengths = torch.tensor([item["text"].numel() for item in items], dtype=torch.long)
        mel_lengths = torch.tensor([item["mel"].size(1) for item in items], dtype=torch.long)
        text = torch.zeros(len(items), int(text_lengths.max()), dtype=torch.long)
        mel = torch.zeros(len(items), items[0]["mel"].size(0), fix_length(int(mel_lengths.max())))
        for i, item in enumerate(items):
            text[i, :text_lengths[i]] = item["text"]
            mel[i, :, :mel_lengths[i]] = item["mel"]
        batch = {"text": text, "text_lengths": text_lengths, "mel": mel, "mel_lengths": mel_lengths,
                 "ids": [item["id"] for item in items]}
        if "speaker" in items[0]:
            batch["speaker"] = torch.tensor([item["speaker"] for item in items], dtype=torch.long)
        return batch


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`MatchaDataset` of the ``cfg.data`` splits, normalised by ``matcha.mel_mean`` and
    ``matcha.mel_std``; where either is null both are computed over the training split (:func:`mel_statistics`, said
    in a ``note:`` line on stderr) and set in ``cfg``, so that the run's checkpoints record them, as they record the
    phonemizer's and espeak-ng's versions (``matcha.phonemizer``, ``matcha.espeak_ng``). A multi-speaker model's
    items carry their speaker's index in ``data.speakers``.

    Raises:
        DataError: the splits cannot be read (:func:`utils.data.corpus.load_splits`), see :class:`MatchaDataset`.
    """
    return _datasets(cfg, load_splits(cfg.data), computes_statistics=True)


def datasets_of(cfg: Config, splits: tuple[Corpus, Corpus]) -> tuple[Dataset, Dataset]:
    """:func:`build_datasets` of the ``(train, val)`` corpora ``splits`` (a corpus of shards: audio handed to each
    dataset's ``item``), normalised by ``matcha.mel_mean`` and ``matcha.mel_std`` as given: such a corpus is not read
    whole at the start, so they are not computed.

    Raises:
        ConfigError: ``matcha.mel_mean`` or ``matcha.mel_std`` null (what prints them named).
        DataError: see :class:`MatchaDataset`.
    """
    return _datasets(cfg, splits, computes_statistics=False)


def _datasets(cfg: Config, splits: tuple[Corpus, Corpus], computes_statistics: bool) -> tuple[Dataset, Dataset]:
    """:func:`build_datasets` of ``splits``; null statistics computed over the training split where
    ``computes_statistics``, else a ConfigError before any transcript is phonemized."""
    section, speakers = cfg.matcha, cfg.data.speakers if len(cfg.data.speakers) > 1 else None
    unset = section.mel_mean is None or section.mel_std is None
    if unset and not computes_statistics:
        raise ConfigError("matcha.mel_mean and matcha.mel_std must be set to train from a corpus that is not read "
                          "whole at the start (shards): python -m scripts.mel_statistics --config config.json "
                          "--dataset-path DIR prints them for the corpus the shards were made from")
    train = MatchaDataset(splits[0], cfg.audio, None, "training", speakers)
    if unset:
        section.mel_mean, section.mel_std = mel_statistics(train)
        print(f"note: matcha.mel_mean {section.mel_mean:.6f}, matcha.mel_std {section.mel_std:.6f}: computed over the "
              f"{len(train)} training utterances (python -m scripts.mel_statistics prints them for config.json, which "
              "skips this)", file=sys.stderr, flush=True)
    train.stats = (section.mel_mean, section.mel_std)
    found = versions()  # the programs the corpus was phonemized with, recorded in the checkpoints' config
    section.phonemizer, section.espeak_ng = found["phonemizer"], found["espeak-ng"]
    val = MatchaDataset(splits[1], cfg.audio, train.stats, "validation", speakers)
    return train, val


def count_items(batch: Batch) -> int:
    """Mel frames in the batch (padding excluded)."""
    return int(batch["mel_lengths"].sum())
