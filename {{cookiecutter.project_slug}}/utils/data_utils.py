"""Reading a speech corpus: utterance lists, train/validation splits, wav loading, and the audio+mel dataset.

Two corpus descriptions are understood:

* the LJSpeech layout, a folder with ``metadata.csv`` (``id|raw text|normalized text``) and
  ``wavs/<id>.wav``;
* NVIDIA-style filelists, ``path|text`` lines, paths relative to the dataset folder (or absolute).

Every problem with the data (a missing folder or file, a malformed line, an unreadable wav) is a
:class:`DataError` whose one-line message names the file, and the line or utterance id where there is one.
"""

from __future__ import annotations

import multiprocessing
import struct
from pathlib import Path
from typing import NamedTuple, Sequence, Union

import librosa
import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset, DistributedSampler

from utils.audio_processing import MelSpectrogram
from utils.config import AudioConfig, DataConfig

PathLike = Union[str, Path]


class DataError(ValueError):
    """The corpus is missing, malformed or unreadable; the message names the file (and line or id)."""


class Utterance(NamedTuple):
    """One recording: its id (the wav's file stem), the wav's path, and its transcript."""

    id: str
    wav_path: Path
    text: str


def _read_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """Non-blank lines of a UTF-8 text file as ``(line number, line)``; DataError if missing/empty/not UTF-8."""
    if not path.is_file():
        raise DataError(f"{what} not found: {path}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text ({err})") from None
    except OSError as err:  # no permission, a folder named like the file, an I/O error
        raise DataError(f"cannot read {what} {path}: {err.strerror or err}") from None
    # Lines end at "\n" only (str.splitlines would also split a transcript at U+2028, U+0085, ...).
    lines = [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    if not lines:
        raise DataError(f"{what} is empty: {path}")
    return lines


def read_ljspeech(dataset_path: PathLike) -> list[Utterance]:
    """Utterances of an LJSpeech-layout corpus, in ``metadata.csv`` order.

    ``metadata.csv`` is UTF-8, pipe separated, without a header: ``id|raw text|normalized text`` (the
    third column may be left out). The normalized text is used when present and non-empty, else the raw
    text. Fields are split on ``|`` only (no CSV quoting: transcripts may contain quotes). Blank lines
    are ignored. The wav of utterance ``id`` is ``wavs/<id>.wav``.

    Raises:
        DataError: the folder or ``metadata.csv`` is missing, ``metadata.csv`` is empty or not UTF-8,
            a line is malformed (the message names the line number), an id repeats, or a row's wav is
            missing (the message names the id and the path).
    """
    root = Path(dataset_path)
    if not root.is_dir():
        raise DataError(f"dataset folder not found: {root}")
    metadata = root / "metadata.csv"
    utterances: list[Utterance] = []
    seen: set[str] = set()
    for number, line in _read_lines(metadata, "metadata file"):
        fields = line.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip():
            raise DataError(f"{metadata}:{number}: expected 'id|raw text|normalized text', got {line!r}")
        utt_id = fields[0].strip()
        text = fields[2].strip() if len(fields) == 3 and fields[2].strip() else fields[1].strip()
        if not text:
            raise DataError(f"{metadata}:{number}: utterance '{utt_id}' has no text")
        if utt_id in seen:
            raise DataError(f"{metadata}:{number}: utterance id '{utt_id}' appears twice")
        seen.add(utt_id)
        wav_path = root / "wavs" / f"{utt_id}.wav"
        if not wav_path.is_file():
            raise DataError(f"{metadata}:{number}: wav of utterance '{utt_id}' not found: {wav_path}")
        utterances.append(Utterance(utt_id, wav_path, text))
    return utterances


def read_filelist(filelist_path: PathLike, dataset_path: PathLike) -> list[Utterance]:
    """Utterances of an NVIDIA-style filelist (``path|text`` lines, UTF-8), in file order.

    A relative path is taken relative to ``dataset_path``; an absolute one is used as is. The id of each
    utterance is its wav's file stem. Blank lines are ignored.

    Raises:
        DataError: the filelist is missing, empty or not UTF-8, a line is not ``path|text`` with both
            parts non-empty (the message names the line number), or a wav is missing (the message names
            the id and the path).
    """
    filelist = Path(filelist_path)
    root = Path(dataset_path)
    utterances: list[Utterance] = []
    for number, line in _read_lines(filelist, "filelist"):
        fields = line.split("|")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(f"{filelist}:{number}: expected 'path|text', got {line!r}")
        wav_path = Path(fields[0].strip())
        if not wav_path.is_absolute():
            wav_path = root / wav_path
        if not wav_path.is_file():
            raise DataError(f"{filelist}:{number}: wav of utterance '{wav_path.stem}' not found: {wav_path}")
        utterances.append(Utterance(wav_path.stem, wav_path, fields[1].strip()))
    return utterances


def _find_filelist(name: str, dataset_path: Path, key: str) -> Path:
    """``name`` if it exists as given, else ``dataset_path / name``; DataError naming both if neither exists."""
    given = Path(name)
    if given.is_file():
        return given
    inside = dataset_path / given
    if inside.is_file():
        return inside
    raise DataError(f"data.{key} not found: {given} (also looked for {inside})")


def load_splits(data_cfg: DataConfig) -> tuple[list[Utterance], list[Utterance]]:
    """The training and validation utterances described by the ``data`` section of the config.

    With ``data_cfg.training_files`` set, both filelists are read (:func:`read_filelist`); a relative
    filelist path is tried as given, then relative to ``dataset_path``. Otherwise ``metadata.csv`` is read
    (:func:`read_ljspeech`) and its last ``min(val_size, max(1, len // 10))`` utterances validate, which
    keeps at least one utterance on each side.

    Utterances whose id is in ``data_cfg.exclude`` are left out (``train.py`` adds the clips its start-up
    check refused there, with ``data.on_bad_clip=skip``).

    Returns:
        ``(train_utterances, val_utterances)``.

    Raises:
        DataError: anything :func:`read_filelist` / :func:`read_ljspeech` raise; ``training_files``
            without ``validation_files``; ``val_size < 1``; a corpus of fewer than 2 utterances.
    """
    root = Path(data_cfg.dataset_path)
    excluded = set(data_cfg.exclude)
    if data_cfg.training_files:
        if not data_cfg.validation_files:
            raise DataError("data.training_files is set but data.validation_files is empty: give both filelists")
        train_list = _find_filelist(data_cfg.training_files, root, "training_files")
        val_list = _find_filelist(data_cfg.validation_files, root, "validation_files")
        train, val = ([utt for utt in read_filelist(path, root) if utt.id not in excluded]
                      for path in (train_list, val_list))
        if not train or not val:
            raise DataError(f"data.exclude leaves no {'training' if not train else 'validation'} utterance")
        return train, val
    if data_cfg.val_size < 1:
        raise DataError(f"data.val_size must be at least 1, got {data_cfg.val_size}")
    utterances = [utt for utt in read_ljspeech(root) if utt.id not in excluded]
    if len(utterances) < 2:
        raise DataError(f"{root / 'metadata.csv'} lists {len(utterances)} utterance(s); at least 2 are needed "
                        "(one to train on, one to validate)")
    n_val = min(data_cfg.val_size, max(1, len(utterances) // 10))
    return utterances[:-n_val], utterances[-n_val:]


def check_wav_not_truncated(path: Path) -> None:
    """Raise DataError if a RIFF/WAVE file's ``data`` chunk claims more bytes than the file holds.

    libsndfile silently returns the samples that are there when a wav was cut short (an interrupted copy
    or download), so this walks the RIFF chunk headers to compare. Other formats are not checked.
    """
    with open(path, "rb") as f:
        header = f.read(12)
        if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            return
        file_size = path.stat().st_size
        while True:
            chunk = f.read(8)
            if len(chunk) < 8:
                return
            chunk_id, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if chunk_id == b"data":
                available = file_size - f.tell()
                # 0 and 0xFFFFFFFF mark "length unknown" (streamed writers); nothing to compare then.
                if size not in (0, 0xFFFFFFFF) and size > available:
                    raise DataError(f"truncated wav file: {path} (data chunk declares {size} bytes, "
                                    f"the file holds {available})")
                return
            f.seek(size + (size % 2), 1)


def load_wav(path: PathLike, sampling_rate: int) -> torch.Tensor:
    """Read a sound file as mono float samples in [-1, 1] at ``sampling_rate`` Hz.

    Reads with soundfile (float32, so 16-bit PCM is divided by 32768 as in NVIDIA's
    ``load_wav_to_torch`` + ``/ max_wav_value``), averages the channels of multi-channel files, and
    resamples with ``librosa.resample`` when the file's rate differs (expected, e.g. 16 kHz TTS output).
    Resampling may overshoot full scale slightly, so the result is clipped to [-1, 1].

    Returns:
        float32 tensor ``(T,)``.

    Raises:
        DataError: the file is missing, unreadable, truncated, empty, or holds NaN/inf samples (the
            message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"wav file not found: {path}")
    try:
        check_wav_not_truncated(path)
        audio, file_rate = sf.read(str(path), dtype="float32", always_2d=True)  # (T, channels)
    except (sf.LibsndfileError, RuntimeError) as err:
        raise DataError(f"cannot read audio file {path}: {err}") from None
    except OSError as err:  # no permission, an I/O error of the disk or network file system
        raise DataError(f"cannot read audio file {path}: {err.strerror or err}") from None
    if audio.shape[0] == 0:
        raise DataError(f"audio file has no samples: {path}")
    if not np.isfinite(audio).all():
        raise DataError(f"audio file holds NaN or infinite samples: {path}")
    audio = audio.mean(axis=1)
    if file_rate != sampling_rate:
        audio = librosa.resample(audio, orig_sr=file_rate, target_sr=sampling_rate)
    audio = np.clip(audio, -1.0, 1.0).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(audio))


class SharedEpoch:
    """An epoch number set in the training process and read live by its DataLoader workers.

    Persistent workers (``DataLoader(persistent_workers=True)``) hold their own copy of the dataset, made
    when they started: a plain ``self.epoch = n`` set later never reaches them, and every epoch would draw
    epoch 0's random crops. This keeps the number in shared memory instead (a ``multiprocessing.Value``),
    so ``value`` is the same in the process and in every worker it forks. A dataset whose items depend on the
    epoch keeps it here and sets it in ``set_epoch`` (``train.py`` calls that before each epoch).
    """

    def __init__(self, epoch: int = 0):
        self._shared = multiprocessing.Value("q", epoch, lock=False)

    @property
    def value(self) -> int:
        return int(self._shared.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._shared.value = epoch


class AudioMelDataset(Dataset):
    """Fixed-length audio segments and their log-mels: NVIDIA WaveGlow's ``Mel2Samp`` recipe.

    Item ``i`` loads utterance ``i``'s wav (:func:`load_wav`), takes ``segment_length`` samples from it
    (a random crop drawn from a generator seeded by ``(seed, epoch, i)``, so a resumed run crops exactly
    as the uninterrupted one whatever the worker layout; or the first ``segment_length`` samples when
    ``random_crop=False``, for a deterministic validation set), pads
    clips shorter than that with zeros at the end, and computes the log-mel of the segment with one
    :class:`~utils.audio_processing.MelSpectrogram` built for the dataset.

    Items are dicts: ``{"mel": (n_mels, frames) float32, "audio": (segment_length,) float32, "id": str}``
    with ``frames = MelSpectrogram.num_frames(segment_length)`` (about ``segment_length / hop_length``).
    Batch them with :func:`collate_audio_mel`.

    Args:
        utterances: from :func:`read_ljspeech`, :func:`read_filelist` or :func:`load_splits`.
        audio_cfg: signal settings (sampling rate, STFT and mel parameters).
        segment_length: samples per item.
        random_crop: random (training) or first-segment (validation) crops.
        seed: base seed of the crops; :meth:`set_epoch` changes them every epoch.
        with_mel: compute each crop's mel here (in the DataLoader workers); ``False``: items hold audio only.

    Raises:
        DataError: ``utterances`` is empty (here) or a wav cannot be loaded (in ``__getitem__``).
        ValueError: ``segment_length`` is too short to make a mel frame.
    """

    def __init__(self, utterances: Sequence[Utterance], audio_cfg: AudioConfig, segment_length: int,
                 random_crop: bool = True, seed: int = 0, with_mel: bool = True):
        if len(utterances) == 0:
            raise DataError("AudioMelDataset: no utterances given")
        self.utterances = list(utterances)
        self.audio_cfg = audio_cfg
        self.segment_length = segment_length
        self.random_crop = random_crop
        self.seed = seed
        self.with_mel = with_mel
        self._epoch = SharedEpoch()
        self.mel = MelSpectrogram.from_config(audio_cfg)
        if self.mel.num_frames(segment_length) < 1 or segment_length <= self.mel.pad:
            raise ValueError(f"AudioMelDataset: segment_length={segment_length} samples is too short for "
                             f"n_fft={audio_cfg.n_fft}, hop_length={audio_cfg.hop_length}")

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw other crops in epoch ``epoch`` (set before the epoch's batches are requested, like the
        sampler's); persistent DataLoader workers see it too (:class:`SharedEpoch`)."""
        self._epoch.value = epoch

    def __getitem__(self, index: int) -> dict:
        utt = self.utterances[index]
        audio = load_wav(utt.wav_path, self.audio_cfg.sampling_rate)
        if audio.shape[0] >= self.segment_length:
            start = 0
            if self.random_crop:
                rng = torch.Generator().manual_seed(hash((self.seed, self.epoch, index)) & 0x7FFF_FFFF_FFFF)
                start = int(torch.randint(0, audio.shape[0] - self.segment_length + 1, (1,), generator=rng).item())
            audio = audio[start:start + self.segment_length]
        else:
            audio = torch.nn.functional.pad(audio, (0, self.segment_length - audio.shape[0]))
        if not self.with_mel:  # the mel is computed on the device, in the training step
            return {"audio": audio, "id": utt.id}
        with torch.no_grad():
            mel = self.mel(audio)
        return {"mel": mel, "audio": audio, "id": utt.id}


class ResumableDistributedSampler(DistributedSampler):
    """A :class:`~torch.utils.data.DistributedSampler` that can start an epoch part-way through.

    ``set_epoch(epoch, start=k)`` makes the next pass skip this rank's first ``k`` samples of that epoch's
    order (the ones a resumed run already trained on); the pass after it is whole again. The order itself
    is the parent's: shuffled by ``seed + epoch``, split across ranks.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self):
        indices = list(super().__iter__())[self.start:]
        self.start = 0
        return iter(indices)

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start)


def collate_audio_mel(items: Sequence[dict]) -> dict:
    """Stack :class:`AudioMelDataset` items into a batch dict.

    Returns:
        ``{"mel": (B, n_mels, frames), "audio": (B, segment_length), "ids": [str] * B}``; without ``"mel"``
        when the items have none (``AudioMelDataset(with_mel=False)``).

    Raises:
        ValueError: ``items`` is empty or the items' shapes differ (the message names the ids).
    """
    if not items:
        raise ValueError("collate_audio_mel: empty list of items")
    first = items[0]
    keys = [key for key in ("mel", "audio") if key in first]
    def shapes(item: dict) -> str:
        return " / ".join(f"{key} {tuple(item[key].shape)}" for key in keys)
    for item in items[1:]:
        if any(item[key].shape != first[key].shape for key in keys):
            raise ValueError(f"collate_audio_mel: item '{item['id']}' has {shapes(item)}, item '{first['id']}' has "
                             f"{shapes(first)}")
    return {**{key: torch.stack([item[key] for item in items]) for key in keys},
            "ids": [item["id"] for item in items]}
