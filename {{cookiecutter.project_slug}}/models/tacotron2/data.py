"""Text + mel pairs for Tacotron2: the dataset, its mel cache, the padding collate function.

Follows NVIDIA's Tacotron2 reference (``data_utils.TextMelLoader`` / ``TextMelCollate``): text is cleaned and mapped to
symbol ids, the target is the utterance's log-mel, a batch is sorted by text length (longest first, as
``pack_padded_sequence`` prefers) and padded, and the stop-gate target is 1 from the last real frame on.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from model import Batch
from models.tacotron2.network import speaker_table
from models.tacotron2.text import text_to_sequence
from models.tacotron2.text.cleaners import clean_text
from utils.config import Config
from utils.data.audio import AudioConfig, MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus, DataError, Utterance
from utils.data.sources import clip_samples, read_audio
from utils.data.speakers import speaker_indices
from utils.framing import recorded_audio

PathLike = Union[str, Path]

CACHE_SETTINGS_FILE = "_audio_config.json"
"""The file of the mel cache that records the audio settings its mels were made with."""


def mel_cache_path(dataset_path: PathLike, mel_cache_dir: str) -> Optional[Path]:
    """``<dataset_path>/<mel_cache_dir>`` (an absolute ``mel_cache_dir`` as it is), or ``None`` when it is empty."""
    if not mel_cache_dir:
        return None
    return Path(dataset_path) / mel_cache_dir


def check_cache_settings(cache_dir: Path, audio_cfg: AudioConfig) -> None:
    """Check the audio settings ``scripts/preprocess.py`` recorded in ``cache_dir / CACHE_SETTINGS_FILE`` against
    ``audio_cfg``; a cache (or a missing folder) without that file passes.

    Raises:
        DataError: the recorded settings differ (the message names the differing keys) or the file is not readable JSON.
    """
    settings_file = cache_dir / CACHE_SETTINGS_FILE
    if not settings_file.is_file():
        return
    try:
        recorded = json.loads(settings_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read mel cache settings {settings_file}: {err}") from None
    recorded = recorded_audio(recorded) if isinstance(recorded, dict) else {}
    differing = [f"{key}: cache {recorded.get(key)!r}, config {value!r}"
                 for key, value in recorded_audio(audio_cfg.model_dump()).items() if recorded.get(key) != value]
    if differing:
        raise DataError(f"mel cache {cache_dir} was made with other audio settings ({'; '.join(differing)}); "
                        "rerun python -m scripts.preprocess with --overwrite or change tacotron2.mel_cache_dir")


class TextMelDataset(Dataset):
    """Items ``{"text": LongTensor (L,), "mel": FloatTensor (n_mels, T), "id": str}`` (and ``"speaker": int``, the
    index of the utterance's speaker in ``speakers``, where given: a multi-speaker model's map) for Tacotron2: the
    symbol ids of
    the transcript cleaned with ``text_cleaners`` (encoded once, at construction, kept packed in one array) and the
    log-mel of the utterance's audio, read from ``mel_cache`` (:func:`mel_cache_path`, or ``None``) when
    ``<cache>/<id>.pt`` exists.

    Utterances longer than ``max_mel_frames`` mel frames (from durations and headers: no audio decoded; ``None``: no
    limit) are left out, never cut: with teacher forcing the decoder is fed the whole target mel, and a mel cut short
    would train the stop gate to go on where the transcript ends. They are listed in :attr:`skipped_ids`, and one
    ``UserWarning`` line says how many of how many (``split``: of which split), by which setting
    (``tacotron2.max_mel_frames`` and its value) and the longest.

    Raises:
        DataError: an empty transcript (named by id) or one with no symbol in the table, an unreadable audio header, a
            cache made with other audio settings, no utterance given or none left (the message names the setting, its
            value, the longest clip), a speaker not in ``speakers``, or (in ``__getitem__``) a malformed cached mel.
        ValueError: an unknown text cleaner name.
    """

    def __init__(self, corpus: Corpus, audio_cfg: AudioConfig, mel_cache: Optional[PathLike] = None,
                 text_cleaners: Sequence[str] = ("english_cleaners",), max_mel_frames: Optional[int] = None,
                 split: str = "", speakers: Optional[Sequence[str]] = None):
        self.audio_cfg = audio_cfg
        self.text_cleaners = tuple(text_cleaners)
        clean_text("", self.text_cleaners)  # an unknown cleaner name fails here, not in a worker mid-epoch
        self.max_mel_frames = max_mel_frames
        self.mel_transform = MelSpectrogram(audio_cfg)
        self.cache_dir = None if mel_cache is None else Path(mel_cache)
        if self.cache_dir is not None:
            check_cache_settings(self.cache_dir, audio_cfg)
        what = f"{split} utterances" if split else "utterances"
        if len(corpus) == 0:
            raise DataError(f"TextMelDataset: no {what} given")
        for utt in corpus:
            if not utt.text.strip():
                raise DataError(f"utterance '{utt.id}' has an empty transcript ({utt.audio})")
        self._frames = None if max_mel_frames is None else self._mel_frames(corpus)
        fits = np.ones(len(corpus), dtype=bool) if self._frames is None else self._frames <= max_mel_frames
        self.skipped_ids: list[str] = corpus.ids.take(np.flatnonzero(~fits)).tolist()
        self.corpus = corpus.take(np.flatnonzero(fits))
        self._report_skipped([] if self._frames is None else self._frames[~fits].tolist(), len(corpus), what)
        if self._frames is not None:
            self._frames = self._frames[fits]
        sequences = [self._encode(utt) for utt in self.corpus]  # each transcript once: a dropped symbol said once
        self._text_at = np.cumsum([0] + [len(sequence) for sequence in sequences])
        self._symbols = np.asarray([symbol for sequence in sequences for symbol in sequence], dtype=np.int64)
        self._speaker = None if speakers is None else speaker_indices(self.corpus, speakers)

    def _report_skipped(self, too_long: list[int], given: int, what: str) -> None:
        """One warning line for the utterances left out; a :class:`DataError` when none is left."""
        key, limit = "tacotron2.max_mel_frames", self.max_mel_frames
        if not len(self.corpus):
            raise DataError(f"{key} is {limit}: {len(too_long)} of {given} {what} are longer (longest {max(too_long)} "
                            f"frames); no {what} left: raise {key} to at least {max(too_long)}")
        if too_long:
            warnings.warn(f"TextMelDataset: skipped {len(too_long)} of {given} {what} ({len(too_long)} longer than "
                          f"{key}={limit} mel frames, the longest {max(too_long)}); raise the setting to keep them",
                          stacklevel=3)

    def _mel_frames(self, corpus: Corpus) -> np.ndarray:
        """Mel frames ``(N,)`` each clip will give, from durations and headers (``clip_samples``): no audio decoded."""
        return self.mel_transform.num_frames(clip_samples(corpus, self.audio_cfg.sampling_rate))

    def _encode(self, utt: Utterance) -> list[int]:
        sequence = text_to_sequence(utt.text, self.text_cleaners)
        if not sequence:
            raise DataError(f"utterance '{utt.id}': no symbol of the transcript {utt.text!r} is in the symbol table")
        return sequence

    def load_mel(self, utt: Utterance, audio: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The log-mel ``(n_mels, T)`` float32 of ``utt``: from the cache if present, else from ``audio`` (float32
        ``(T,)`` at ``audio.sampling_rate`` Hz), else from its audio source.

        Raises:
            DataError: the cached file cannot be loaded or is not a 2-D float tensor with ``n_mels`` rows.
        """
        cached = None if self.cache_dir is None else self.cache_dir / f"{utt.id}.pt"
        if cached is not None and cached.is_file():
            try:
                mel = torch.load(cached, map_location="cpu", weights_only=True)
            except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
                raise DataError(f"cannot load cached mel of '{utt.id}': {cached}: {err}") from None
            if (not isinstance(mel, torch.Tensor) or mel.dim() != 2 or not mel.is_floating_point()
                    or mel.size(0) != self.audio_cfg.n_mels):
                got = tuple(mel.shape) if isinstance(mel, torch.Tensor) else type(mel).__name__
                raise DataError(f"cached mel of '{utt.id}' ({cached}) should be a float tensor "
                                f"({self.audio_cfg.n_mels}, T), got {got}")
            return mel.float()
        if audio is None:
            audio = read_audio(utt.audio, self.audio_cfg.sampling_rate)
        with torch.no_grad():
            return self.mel_transform(audio)

    def lengths(self) -> list[int]:
        """Mel frames of every item, from durations and headers (what ``data.batching=buckets`` sorts by).

        Raises:
            DataError: an audio header cannot be read.
        """
        if self._frames is None:
            self._frames = self._mel_frames(self.corpus)
        return self._frames.tolist()

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> dict:
        return self.item(index)

    def item(self, index: int, audio: Optional[torch.Tensor] = None) -> dict:
        """Item ``index``, its mel made of ``audio`` (its utterance's sound, float32 ``(T,)`` at
        ``audio.sampling_rate`` Hz, wherever it was read from: a shard) where no cached mel is found (None: read from
        its audio source). Raises DataError as :meth:`load_mel`."""
        utt = self.corpus[index]
        symbols = self._symbols[self._text_at[index]:self._text_at[index + 1]]
        item = {"text": torch.tensor(symbols, dtype=torch.long), "mel": self.load_mel(utt, audio), "id": utt.id}
        if self._speaker is not None:
            item["speaker"] = int(self._speaker[index])
        return item


def known_speakers(train: Corpus, val: Corpus, speakers: Sequence[str], val_size: int) -> tuple[Corpus, Corpus]:
    """``(train, val)`` with the validation utterances whose speaker is not in ``speakers`` left out (their embedding
    rows are never trained), one warning line saying how many. Where none is left (LibriTTS's ``dev-*`` speakers are
    none of its training speakers), the last ``min(val_size, max(1, len(train) // 10))`` training utterances validate
    instead, said in a warning line, as in a layout without a validation split.

    Raises:
        DataError: none is left and the training split has under 2 utterances.
    """
    known = set(speakers)
    keep = [i for i, name in enumerate(val.speaker.tolist()) if name in known]
    if len(keep) == len(val):
        return train, val
    others = sorted(set(val.speaker.tolist()) - known)
    named = f"{', '.join(others[:5])}{', ...' if len(others) > 5 else ''}"
    if keep:
        warnings.warn(f"TextMelDataset: left out {len(val) - len(keep)} of {len(val)} validation utterances: their "
                      f"speakers ({named}) are not in the training split's", stacklevel=2)
        return train, val.take(keep)
    if len(train) < 2:
        raise DataError(f"none of the {len(val)} validation utterances is of a training speaker (theirs: {named}), and "
                        f"{len(train)} training utterance(s) cannot give one: give a validation split of training "
                        "speakers")
    n_val = min(val_size, max(1, len(train) // 10))
    warnings.warn(f"TextMelDataset: none of the {len(val)} validation utterances is of a training speaker (theirs: "
                  f"{named}): the last {n_val} training utterances validate instead", stacklevel=2)
    return train.take(range(len(train) - n_val)), train.take(range(len(train) - n_val, len(train)))


class TextMelCollate:
    """Batch :class:`TextMelDataset` items: sort by text length (descending), pad, build gate targets. Returns
    ``{"text": (B, L_max) long padded with 0 (the "_" pad symbol), "text_lengths": (B,) long, "mel": (B, n_mels,
    T_max) float32 padded with zeros, "gate": (B, T_max) float32 stop target (1 from the last real frame on),
    "mel_lengths": (B,) long, "ids": [str] * B}`` in the sorted order, and ``"speaker": (B,) long`` where the items
    carry speakers.

    Raises:
        ValueError: no items, mels of different ``n_mels``, an empty text or mel.
    """

    def __call__(self, items: Sequence[dict]) -> dict:
        if not items:
            raise ValueError("TextMelCollate: empty list of items")
        n_mels = items[0]["mel"].size(0)
        for item in items:
            if item["mel"].dim() != 2 or item["mel"].size(0) != n_mels:
                raise ValueError(f"TextMelCollate: mel of '{item['id']}' has shape {tuple(item['mel'].shape)}, "
                                 f"expected ({n_mels}, T)")
            if item["text"].numel() == 0 or item["mel"].size(1) == 0:
                raise ValueError(f"TextMelCollate: item '{item['id']}' has an empty text or mel")
        ordered = sorted(items, key=lambda item: item["text"].numel(), reverse=True)
        batch = len(ordered)
        text_lengths = torch.tensor([item["text"].numel() for item in ordered], dtype=torch.long)
        mel_lengths = torch.tensor([item["mel"].size(1) for item in ordered], dtype=torch.long)
        max_frames = int(mel_lengths.max())
        text = torch.zeros(batch, int(text_lengths.max()), dtype=torch.long)
        mel = torch.zeros(batch, n_mels, max_frames, dtype=torch.float32)
        gate = torch.zeros(batch, max_frames, dtype=torch.float32)
        for i, item in enumerate(ordered):
            text[i, :text_lengths[i]] = item["text"]
            mel[i, :, :mel_lengths[i]] = item["mel"]
            gate[i, mel_lengths[i] - 1:] = 1.0
        batch = {"text": text, "text_lengths": text_lengths, "mel": mel, "gate": gate,
                 "mel_lengths": mel_lengths, "ids": [item["id"] for item in ordered]}
        if "speaker" in ordered[0]:
            batch["speaker"] = torch.tensor([item["speaker"] for item in ordered], dtype=torch.long)
        return batch


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`TextMelDataset` of the ``cfg.data`` splits, clips longer than
    ``tacotron2.max_mel_frames`` (when > 0) left out with a warning line per split. A multi-speaker model's items
    carry their speaker's index in ``data.speakers``; validation utterances of other speakers are left out, said in
    a line, and where none is left training utterances validate (:func:`known_speakers`).

    Raises:
        DataError: the splits cannot be read (:func:`utils.data.corpus.load_splits`), or the setting leaves no training
            or no validation utterance.
    """
    return datasets_of(cfg, load_splits(cfg.data))


def datasets_of(cfg: Config, splits: tuple[Corpus, Corpus]) -> tuple[Dataset, Dataset]:
    """:func:`build_datasets` of the ``(train, val)`` corpora ``splits`` (a corpus a part reads: durations given, audio
    handed to each dataset's ``item``). Raises DataError as :func:`build_datasets`."""
    train_utts, val_utts = splits
    model_cfg = cfg.tacotron2
    max_frames = model_cfg.max_mel_frames if model_cfg.max_mel_frames > 0 else None
    cache = mel_cache_path(cfg.data.dataset_path, model_cfg.mel_cache_dir)
    speakers = cfg.data.speakers if speaker_table(model_cfg, len(cfg.data.speakers)) else None
    if speakers is not None:
        train_utts, val_utts = known_speakers(train_utts, val_utts, speakers, cfg.data.val_size)
    return tuple(TextMelDataset(utts, cfg.audio, cache, text_cleaners=model_cfg.text_cleaners,
                                max_mel_frames=max_frames, split=split, speakers=speakers)
                 for utts, split in ((train_utts, "training"), (val_utts, "validation")))


def count_items(batch: Batch) -> int:
    """Mel frames in the batch (padding excluded)."""
    return int(batch["mel_lengths"].sum())


def check_text(text: str, cfg: Config) -> str | None:
    """The start-up corpus check for a transcript: ``None`` if some character maps to a symbol after cleaning."""
    with warnings.catch_warnings():  # the reason below says it; the front end's warning would repeat it
        warnings.simplefilter("ignore")
        if text_to_sequence(text, cfg.tacotron2.text_cleaners):
            return None
    return f"transcript {text!r} has no symbol of the Tacotron2 symbol table after cleaning"
