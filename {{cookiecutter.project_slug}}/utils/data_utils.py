"""Reading a speech corpus: utterance lists, train/validation splits, wav loading, and the audio+mel dataset.

Two corpus descriptions are understood:

* the LJSpeech layout, a folder with ``metadata.csv`` (``id|raw text|normalized text``) and
  ``wavs/<id>.wav``;
* NVIDIA-style filelists, ``path|text`` lines, paths relative to the dataset folder (or absolute).

Every problem with the data (a missing folder or file, a malformed line, an unreadable wav) is a
:class:`DataError` whose one-line message names the file, and the line or utterance id where there is one.
A problem of one line (a malformed line, a missing wav) can instead be collected as a :class:`BadClip`
(the ``bad`` argument of the readers), so that ``train.py`` lists it with the other bad clips and, with
``data.on_bad_clip=skip``, trains without it.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import pickle
import struct
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Union

import librosa
import numpy as np
import soundfile as sf
import torch
from torch.utils.data import Dataset, DistributedSampler

from utils.audio_processing import MelSpectrogram, dynamic_range_compression
from utils.config import AudioConfig, DataConfig

PathLike = Union[str, Path]


class DataError(ValueError):
    """The corpus is missing, malformed or unreadable; the message names the file (and line or id)."""


GET_DATA = ("get LJSpeech with scripts/dataset.sh data, or a small demo corpus with python scripts/make_demo_corpus.py "
            "--output data/demo, or point --dataset-path at a folder in the LJSpeech layout")
"""How to get a corpus: said where one is missing."""


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


class BadClip(NamedTuple):
    """One utterance (or corpus line) that cannot be trained on: its id, its wav (or the list file and line),
    and why.

    A line without a usable id (too few fields, an empty id, an id already used) gets the id ``<file name>:<line>``
    (``metadata.csv:7``), which ``data.exclude`` accepts like any other id.
    """

    id: str
    path: str
    reason: str


class _LineIssue(NamedTuple):
    """A corpus line :func:`read_ljspeech` / :func:`read_filelist` refused: as a :class:`BadClip`, and as the
    message raised when the caller collects none."""

    clip: BadClip
    message: str


def _wav_problem(wav_path: Path) -> Optional[str]:
    """Why ``wav_path`` is no wav file (``"wav not found"``, ``"is a folder, not a wav file"``), or ``None``."""
    if wav_path.is_file():
        return None
    if wav_path.is_dir():
        return "is a folder, not a wav file"
    return "wav not found"


def _scan_ljspeech(root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_ljspeech`'s work: the good rows as utterances, the bad ones as issues, in file order."""
    if not root.is_dir():
        raise DataError(f"dataset folder not found: {root} ({GET_DATA})")
    metadata = root / "metadata.csv"
    utterances: list[Utterance] = []
    issues: list[_LineIssue] = []
    first_line: dict[str, int] = {}
    for number, line in _read_lines(metadata, "metadata file"):
        where = f"{metadata.name} line {number}"
        fields = line.split("|")
        if len(fields) not in (2, 3) or not fields[0].strip():
            expected = f"expected 'id|raw text|normalized text', got {line!r}"
            issues.append(_LineIssue(BadClip(f"{metadata.name}:{number}", f"{metadata}:{number}",
                                             f"malformed line: {expected}"), f"{metadata}:{number}: {expected}"))
            continue
        utt_id = fields[0].strip()
        wav_path = root / "wavs" / f"{utt_id}.wav"
        text = fields[2].strip() if len(fields) == 3 and fields[2].strip() else fields[1].strip()
        if utt_id in first_line:
            issues.append(_LineIssue(
                BadClip(f"{metadata.name}:{number}", str(wav_path),
                        f"utterance id '{utt_id}' appears twice (first on line {first_line[utt_id]}; {where})"),
                f"{metadata}:{number}: utterance id '{utt_id}' appears twice"))
            continue
        first_line[utt_id] = number
        if not text:
            issues.append(_LineIssue(BadClip(utt_id, str(wav_path), f"empty transcript ({where})"),
                                     f"{metadata}:{number}: utterance '{utt_id}' has no text"))
            continue
        problem = _wav_problem(wav_path)
        if problem is not None:
            said = "not found" if problem == "wav not found" else problem
            issues.append(_LineIssue(BadClip(utt_id, str(wav_path), f"{problem} ({where})"),
                                     f"{metadata}:{number}: wav of utterance '{utt_id}' {said}: {wav_path}"))
            continue
        utterances.append(Utterance(utt_id, wav_path, text))
    return utterances, issues


def _scan_filelist(filelist: Path, root: Path) -> tuple[list[Utterance], list[_LineIssue]]:
    """:func:`read_filelist`'s work: the good lines as utterances, the bad ones as issues, in file order."""
    utterances: list[Utterance] = []
    issues: list[_LineIssue] = []
    for number, line in _read_lines(filelist, "filelist"):
        where = f"{filelist.name} line {number}"
        fields = line.split("|")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            expected = f"expected 'path|text', got {line!r}"
            issues.append(_LineIssue(BadClip(f"{filelist.name}:{number}", f"{filelist}:{number}",
                                             f"malformed line: {expected}"), f"{filelist}:{number}: {expected}"))
            continue
        wav_path = Path(fields[0].strip())
        if not wav_path.is_absolute():
            wav_path = root / wav_path
        problem = _wav_problem(wav_path)
        if problem is not None:
            said = "not found" if problem == "wav not found" else problem
            issues.append(_LineIssue(BadClip(wav_path.stem, str(wav_path), f"{problem} ({where})"),
                                     f"{filelist}:{number}: wav of utterance '{wav_path.stem}' {said}: {wav_path}"))
            continue
        utterances.append(Utterance(wav_path.stem, wav_path, fields[1].strip()))
    return utterances, issues


def _settle(issues: Sequence[_LineIssue], bad: Optional[list[BadClip]]) -> None:
    """Raise the first issue's message when the caller collects none (``bad is None``), else collect them."""
    if not issues:
        return
    if bad is None:
        more = f" (and {len(issues) - 1} more bad line(s))" if len(issues) > 1 else ""
        raise DataError(f"{issues[0].message}{more}")
    bad.extend(issue.clip for issue in issues)


def read_ljspeech(dataset_path: PathLike, bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an LJSpeech-layout corpus, in ``metadata.csv`` order.

    ``metadata.csv`` is UTF-8, pipe separated, without a header: ``id|raw text|normalized text`` (the
    third column may be left out). The normalized text is used when present and non-empty, else the raw
    text. Fields are split on ``|`` only (no CSV quoting: transcripts may contain quotes). Blank lines
    are ignored. The wav of utterance ``id`` is ``wavs/<id>.wav``.

    A bad row is one clip, not the whole corpus: a malformed line (not 2 or 3 fields, or an empty id; listed
    as ``metadata.csv:<line>``), an id already used (the later line, as ``metadata.csv:<line>``), an empty
    transcript, a wav that is missing or is a folder. With ``bad`` given, each is appended to it as a
    :class:`BadClip` and left out; without, the first one raises.

    Args:
        dataset_path: the corpus folder.
        bad: a list collecting the bad rows, or ``None`` (raise on the first).

    Raises:
        DataError: the folder or ``metadata.csv`` is missing, ``metadata.csv`` is empty or not UTF-8; without
            ``bad``, also a bad row (the message names the line number, and the id and path where there are).
    """
    utterances, issues = _scan_ljspeech(Path(dataset_path))
    _settle(issues, bad)
    return utterances


def read_filelist(filelist_path: PathLike, dataset_path: PathLike,
                  bad: Optional[list[BadClip]] = None) -> list[Utterance]:
    """Utterances of an NVIDIA-style filelist (``path|text`` lines, UTF-8), in file order.

    A relative path is taken relative to ``dataset_path``; an absolute one is used as is. The id of each
    utterance is its wav's file stem. Blank lines are ignored.

    A bad line is one clip, not the whole list: a line that is not ``path|text`` with both parts non-empty
    (listed as ``<filelist name>:<line>``), a wav that is missing or is a folder. With ``bad`` given, each is
    appended to it as a :class:`BadClip` and left out; without, the first one raises.

    Raises:
        DataError: the filelist is missing, empty or not UTF-8; without ``bad``, also a bad line (the message
            names the line number, and the id and path where there are).
    """
    utterances, issues = _scan_filelist(Path(filelist_path), Path(dataset_path))
    _settle(issues, bad)
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


def load_splits(data_cfg: DataConfig,
                bad: Optional[list[BadClip]] = None) -> tuple[list[Utterance], list[Utterance]]:
    """The training and validation utterances described by the ``data`` section of the config.

    With ``data_cfg.training_files`` set, both filelists are read (:func:`read_filelist`); a relative
    filelist path is tried as given, then relative to ``dataset_path``. Otherwise ``metadata.csv`` is read
    (:func:`read_ljspeech`) and its last ``min(val_size, max(1, len // 10))`` utterances validate, which
    keeps at least one utterance on each side.

    Utterances whose id is in ``data_cfg.exclude`` are left out, and so are bad lines whose id is there
    (``metadata.csv:7`` for a malformed line): ``train.py`` adds the clips and lines its start-up check
    refused there, with ``data.on_bad_clip=skip``. The other bad lines (:func:`read_ljspeech`) are appended to
    ``bad`` when it is given, else the first raises.

    Args:
        data_cfg: the ``data`` section.
        bad: a list collecting the bad lines not in ``data_cfg.exclude``, or ``None`` (raise on the first).

    Returns:
        ``(train_utterances, val_utterances)``.

    Raises:
        DataError: anything :func:`read_filelist` / :func:`read_ljspeech` raise; ``training_files``
            without ``validation_files``; ``val_size < 1``; fewer than 2 utterances left (metadata.csv), or
            none on one side (filelists).
    """
    root = Path(data_cfg.dataset_path)
    excluded = set(data_cfg.exclude)
    if data_cfg.training_files:
        if not data_cfg.validation_files:
            raise DataError("data.training_files is set but data.validation_files is empty: give both filelists")
        splits = []
        for key in ("training_files", "validation_files"):
            filelist = _find_filelist(getattr(data_cfg, key), root, key)
            utterances, issues = _scan_filelist(filelist, root)
            _settle([issue for issue in issues if issue.clip.id not in excluded], bad)
            kept = [utt for utt in utterances if utt.id not in excluded]
            if not kept:
                split = "training" if key == "training_files" else "validation"
                why = (f"all {len(utterances)} of its utterances are in data.exclude (where "
                       "data.on_bad_clip=skip adds the bad clips)" if utterances else "it has no usable line")
                raise DataError(f"no {split} utterance left in {filelist}: {why}")
            splits.append(kept)
        return splits[0], splits[1]
    if data_cfg.val_size < 1:
        raise DataError(f"data.val_size must be at least 1, got {data_cfg.val_size}")
    utterances, issues = _scan_ljspeech(root)
    _settle([issue for issue in issues if issue.clip.id not in excluded], bad)
    kept = [utt for utt in utterances if utt.id not in excluded]
    if len(kept) < 2:
        gone = len(issues) + len(utterances) - len(kept)
        why = f" ({gone} bad or excluded line(s) left out)" if gone else ""
        raise DataError(f"{root / 'metadata.csv'} lists {len(kept)} usable utterance(s){why}; at least 2 are "
                        "needed (one to train on, one to validate)")
    n_val = min(data_cfg.val_size, max(1, len(kept) // 10))
    return kept[:-n_val], kept[-n_val:]


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


MEL_SETTINGS_FILE = "_audio_config.json"
"""The file of a mel folder that records the ``audio`` settings its mels were made with (``dataclasses.asdict`` of
:class:`utils.config.AudioConfig` as JSON): what ``scripts/dump_gta_mels.py`` writes next to its mels."""

SILENCE_LOG_MEL = float(dynamic_range_compression(torch.zeros(())))
"""The log-mel value of silence, ``log(1e-5)`` (about -11.51): what :class:`~utils.audio_processing.MelSpectrogram`
gives for zero samples, and what pads a mel read from ``data.mel_dir`` when its clip is shorter than a crop."""


def check_mel_dir(mel_dir: Path, audio_cfg: AudioConfig, utterances: Sequence[Utterance]) -> None:
    """Refuse a mel folder (``data.mel_dir``) that cannot serve ``utterances``, before any audio is read: a missing
    folder, mels recorded (:data:`MEL_SETTINGS_FILE`, when there) with other audio settings, or an utterance without
    its ``<mel_dir>/<id>.pt`` (only the files' existence is checked here; their contents when an item is read).

    Raises:
        DataError: one line naming the folder, the differing settings, or the first utterance without a mel file
            (its id and the file) and how many there are.
    """
    if not mel_dir.is_dir():
        raise DataError(f"data.mel_dir {mel_dir} is not a folder (dump mels there with scripts/dump_gta_mels.py, or "
                        "set data.mel_dir=\"\" to compute the mels from the audio)")
    settings_file = mel_dir / MEL_SETTINGS_FILE
    if settings_file.is_file():
        try:
            recorded = json.loads(settings_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"cannot read the mel settings {settings_file}: {err}") from None
        if not isinstance(recorded, dict):
            raise DataError(f"{settings_file}: expected a JSON object of audio settings")
        differing = [f"{key}: mels {recorded.get(key)!r}, config {value!r}"
                     for key, value in dataclasses.asdict(audio_cfg).items() if recorded.get(key) != value]
        if differing:
            raise DataError(f"the mels in {mel_dir} were made with other audio settings ({'; '.join(differing)}): "
                            "set the audio section to theirs, or dump them again with this one")
    missing = [utt for utt in utterances if not (mel_dir / f"{utt.id}.pt").is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more of {len(utterances)} utterances)" if len(missing) > 1 else ""
        raise DataError(f"no mel for utterance '{missing[0].id}': {mel_dir / (missing[0].id + '.pt')} not found{more}; "
                        "dump it into data.mel_dir, or leave the utterance out with data.exclude")


def load_mel_file(path: Path, utt_id: str, n_mels: int) -> torch.Tensor:
    """The mel ``(n_mels, frames)`` float32 of utterance ``utt_id`` in ``path`` (a tensor saved with ``torch.save``).

    Raises:
        DataError: the file is missing or unreadable, or holds no finite float tensor ``(n_mels, frames)``; the
            message names the utterance and the file.
    """
    try:
        mel = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"no mel for utterance '{utt_id}': {path} not found") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, TypeError,
            AttributeError) as err:
        raise DataError(f"cannot load the mel of utterance '{utt_id}': {path}: {type(err).__name__}") from None
    if not torch.is_tensor(mel) or mel.dim() != 2 or not mel.is_floating_point() or mel.shape[0] != n_mels:
        got = tuple(mel.shape) if torch.is_tensor(mel) else type(mel).__name__
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) should be a float tensor ({n_mels}, frames), got "
                        f"{got}")
    if not torch.isfinite(mel).all():
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) holds NaN or infinite values")
    return mel.float()


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

    With ``mel_dir`` (``data.mel_dir``) the mels are read, not computed: ``<mel_dir>/<id>.pt``, the whole utterance's
    mel ``(n_mels, frames)`` (e.g. Tacotron2's teacher-forced, "ground-truth aligned" mels from
    ``scripts/dump_gta_mels.py``), and a vocoder learns to turn *those* into the real audio: the fine-tuning of
    jik876/hifi-gan (``--fine_tuning``, its ``MelDataset``) and of Shen et al. 2018's WaveNet on Tacotron2's
    predictions. A mel must have exactly ``MelSpectrogram.num_frames(T)`` frames for the ``T`` samples of its clip
    (:func:`load_wav` at ``audio.sampling_rate``): ``(T + 2 * pad - n_fft) // hop_length + 1`` with
    ``pad = (n_fft - hop_length) // 2``; frame ``k`` then covers samples ``k * hop_length`` to
    ``(k + 1) * hop_length`` (its window is centred there). Audio and mel are cropped together on frame boundaries:
    a frame ``f`` drawn uniformly from ``[0, frames - segment_length // hop_length]`` by the same seeded generator
    as above (``(seed, epoch, i)``; ``f = 0`` without ``random_crop``), mel frames ``f`` to
    ``f + segment_length // hop_length`` (end excluded) and samples ``f * hop_length`` to
    ``f * hop_length + segment_length``, so ``segment_length`` must be a multiple of ``hop_length``. A clip with
    fewer frames than that keeps its mel and the audio of those frames, padded with silence to the crop: zeros for
    the audio and :data:`SILENCE_LOG_MEL` for the mel, the mel of zeros (jik876 pads the mel with 0 instead, the
    log of a loud spectrum). Items then hold ``segment_length // hop_length`` mel frames.

    Args:
        utterances: from :func:`read_ljspeech`, :func:`read_filelist` or :func:`load_splits`.
        audio_cfg: signal settings (sampling rate, STFT and mel parameters).
        segment_length: samples per item.
        random_crop: random (training) or first-segment (validation) crops.
        seed: base seed of the crops; :meth:`set_epoch` changes them every epoch.
        with_mel: compute each crop's mel here (in the DataLoader workers); ``False``: items hold audio only.
        mel_dir: a folder of mels to read instead (a path as given, relative to the current folder); ``None`` or
            ``""``: compute them from the audio.

    Raises:
        DataError: ``utterances`` is empty, or ``mel_dir`` cannot serve them (:func:`check_mel_dir`: the folder, its
            recorded audio settings, a missing ``<id>.pt``) (here); a wav cannot be loaded, or a mel file is
            unreadable, misshapen or has another number of frames than its audio gives (in ``__getitem__``;
            the message names the utterance and the file).
        ValueError: ``segment_length`` is too short to make a mel frame, or with ``mel_dir`` is not a multiple of
            ``hop_length``, or ``mel_dir`` comes with ``with_mel=False``.
    """

    def __init__(self, utterances: Sequence[Utterance], audio_cfg: AudioConfig, segment_length: int,
                 random_crop: bool = True, seed: int = 0, with_mel: bool = True,
                 mel_dir: Optional[PathLike] = None):
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
        self.mel_dir = Path(mel_dir) if mel_dir else None
        if self.mel_dir is not None:
            hop = audio_cfg.hop_length
            if not with_mel:
                raise ValueError(f"AudioMelDataset: mel_dir={self.mel_dir} reads the mels, with_mel=False computes "
                                 "them on the device: use one of the two")
            if segment_length % hop:
                lower, upper = segment_length // hop * hop, (segment_length // hop + 1) * hop
                raise ValueError(f"segment_length={segment_length} is not a multiple of audio.hop_length={hop}: with "
                                 f"data.mel_dir audio and mel are cropped together on frame boundaries; use "
                                 f"{f'{lower} or ' if lower else ''}{upper}")
            check_mel_dir(self.mel_dir, audio_cfg, self.utterances)

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw other crops in epoch ``epoch`` (set before the epoch's batches are requested, like the
        sampler's); persistent DataLoader workers see it too (:class:`SharedEpoch`)."""
        self._epoch.value = epoch

    def _start(self, index: int, choices: int) -> int:
        """The crop's start in ``[0, choices)`` (samples, or frames with ``mel_dir``): drawn from a generator seeded
        by ``(seed, epoch, index)`` for training crops, 0 for validation ones."""
        if not self.random_crop:
            return 0
        rng = torch.Generator().manual_seed(hash((self.seed, self.epoch, index)) & 0x7FFF_FFFF_FFFF)
        return int(torch.randint(0, choices, (1,), generator=rng).item())

    def _read_item(self, index: int, utt: Utterance, audio: torch.Tensor) -> dict:
        """The item of a mel read from ``mel_dir``: mel and audio cropped together on frame boundaries (see the class
        docstring).

        Raises:
            DataError: the mel file is missing, unreadable or misshapen, or its frame count is not the audio's.
        """
        hop, path = self.audio_cfg.hop_length, self.mel_dir / f"{utt.id}.pt"
        mel = load_mel_file(path, utt.id, self.audio_cfg.n_mels)
        expected = self.mel.num_frames(audio.shape[0])
        if mel.shape[1] != expected:
            raise DataError(f"the mel of utterance '{utt.id}' ({path}) has {mel.shape[1]} frames; its audio "
                            f"({audio.shape[0]} samples at {self.audio_cfg.sampling_rate} Hz) gives {expected} "
                            f"((samples + 2 * {self.mel.pad} - {self.mel.n_fft}) // {hop} + 1): made from other audio "
                            "or with other settings")
        frames = self.segment_length // hop
        if mel.shape[1] >= frames:
            start = self._start(index, mel.shape[1] - frames + 1)
            mel = mel[:, start:start + frames]
            audio = audio[start * hop:start * hop + self.segment_length]
        else:  # the clip's frames and their audio, then silence
            audio = audio[:mel.shape[1] * hop]
            mel = torch.nn.functional.pad(mel, (0, frames - mel.shape[1]), value=SILENCE_LOG_MEL)
            audio = torch.nn.functional.pad(audio, (0, self.segment_length - audio.shape[0]))
        return {"mel": mel.contiguous(), "audio": audio.contiguous(), "id": utt.id}

    def __getitem__(self, index: int) -> dict:
        utt = self.utterances[index]
        audio = load_wav(utt.wav_path, self.audio_cfg.sampling_rate)
        if self.mel_dir is not None:
            return self._read_item(index, utt, audio)
        if audio.shape[0] >= self.segment_length:
            start = self._start(index, audio.shape[0] - self.segment_length + 1)
            audio = audio[start:start + self.segment_length]
        else:
            audio = torch.nn.functional.pad(audio, (0, self.segment_length - audio.shape[0]))
        if not self.with_mel:  # the mel is computed on the device, in the training step
            return {"audio": audio, "id": utt.id}
        with torch.no_grad():
            mel = self.mel(audio)
        return {"mel": mel, "audio": audio, "id": utt.id}


class ResumableDistributedSampler(DistributedSampler):
    """A :class:`~torch.utils.data.DistributedSampler` that can start an epoch part-way through, on any number of
    ranks.

    ``set_epoch(epoch, start=k)`` makes the next pass leave out the first ``k`` samples of that epoch's order
    (shuffled by ``seed + epoch``, the parent's order, which does not depend on the number of ranks): the ones
    all ranks together already trained on, ``k`` counted in global samples. The rest is split across this run's
    ranks as the parent splits a whole epoch (rank ``r`` takes every ``num_replicas``-th sample from its
    ``r``-th; ``drop_last`` drops the remainder, otherwise it is padded from the start). With the same number of
    ranks a resumed epoch is exactly the rest of the uninterrupted one; the pass after it is whole again.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle by ``seed + epoch``; ``start``: global samples of this epoch's order to leave out."""
        super().set_epoch(epoch)
        self.start = start

    def _rest(self) -> list[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        else:
            order = list(range(len(self.dataset)))
        rest = order[self.start:]
        if self.drop_last:
            rest = rest[:len(rest) - len(rest) % self.num_replicas]
        elif rest and len(rest) % self.num_replicas:
            pad = self.num_replicas - len(rest) % self.num_replicas
            rest += (rest * (pad // len(rest) + 1))[:pad]
        return rest[self.rank::self.num_replicas]

    def __iter__(self):
        indices = list(super().__iter__()) if self.start == 0 else self._rest()
        self.start = 0
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples if self.start == 0 else len(self._rest())


class LengthBucketSampler:
    """A distributed batch sampler whose batches hold utterances of similar length (``data.batching=buckets``).

    Padding is wasted compute for a variable-length model: a random batch of LJSpeech-like clips (1-10 s) is
    padded to its longest, so a large share of its mel frames is padding. Here an epoch's order is built as
    follows, by ``seed + epoch`` alone (not by the number of ranks, nor by ``num_workers``: batches are made in
    the main process):

    1. the indices are shuffled;
    2. each run of ``pool * batch_size`` of them is sorted by length and cut into micro-batches of ``batch_size``
       (the last pool's incomplete micro-batch, fewer than ``batch_size`` utterances, is left out this epoch);
    3. the micro-batches are shuffled.

    Optimizer step ``s`` of ``num_replicas`` ranks takes micro-batches ``s * num_replicas`` to
    ``s * num_replicas + num_replicas - 1``, rank ``r`` the ``r``-th of them; micro-batches that do not fill a
    last step are left out too. So each utterance is read at most once per epoch across the ranks, and at most
    ``batch_size * num_replicas - 1`` are left out of an epoch (the same count as the random sampler's
    ``drop_last``; other utterances each epoch). ``set_epoch(epoch, start=k)`` leaves out the first ``k`` global
    samples (``k`` a multiple of ``batch_size``, as every step's samples are) of that epoch's order: resumed on
    the same number of ranks the epoch goes on exactly as the uninterrupted one; on another number, the rest of
    the same order is shared among the new ranks, each utterance still read once. This is the idea of VITS'
    ``DistributedBucketSampler`` and of NVIDIA NeMo's semi-sorted batches, made resumable.

    Args:
        lengths: each item's length (mel frames, samples, symbols: what the collate function pads), ``(N,)``.
        batch_size: utterances per micro-batch (one rank's batch).
        num_replicas, rank: the world size and this process's rank.
        seed: the shuffling seed (``train.seed``).
        pool: micro-batches sorted together (``data.bucket_pool``): larger pools pad less, smaller ones mix
            lengths more.

    Raises:
        ValueError: ``batch_size``, ``pool`` or ``num_replicas`` < 1, ``rank`` outside ``[0, num_replicas)``, a
            length < 1, or a ``start`` that is not a multiple of ``batch_size``.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, pool: int = 64):
        if batch_size < 1 or pool < 1 or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"LengthBucketSampler: batch_size={batch_size}, pool={pool}, num_replicas="
                             f"{num_replicas}, rank={rank}: sizes must be >= 1 and 0 <= rank < num_replicas")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        if len(self.lengths) and int(self.lengths.min()) < 1:
            raise ValueError(f"LengthBucketSampler: item {int(self.lengths.argmin())} has length "
                             f"{int(self.lengths.min())}; every length must be >= 1")
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank
        self.seed, self.pool = seed, pool
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Order by ``seed + epoch``; ``start``: global samples of this epoch's order to leave out."""
        if start % self.batch_size:
            raise ValueError(f"LengthBucketSampler: start={start} is not a multiple of batch_size={self.batch_size}")
        self.epoch, self.start = epoch, start

    def epoch_batches(self) -> list[list[int]]:
        """Every full micro-batch of the epoch's order (steps 1 to 3 above), for all ranks together."""
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator)
        span = self.pool * self.batch_size
        batches = []
        for begin in range(0, len(order), span):
            chunk = order[begin:begin + span]
            # stable: equal lengths keep their shuffled order, so ties do not depend on the sort's algorithm
            chunk = chunk[torch.sort(self.lengths[chunk], stable=True).indices].tolist()
            batches += [chunk[i:i + self.batch_size] for i in range(0, len(chunk) - self.batch_size + 1,
                                                                       self.batch_size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    def _rest(self) -> list[list[int]]:
        rest = self.epoch_batches()[self.start // self.batch_size:]
        rest = rest[:len(rest) - len(rest) % self.num_replicas]
        return rest[self.rank::self.num_replicas]

    def __iter__(self):
        # A generator: its body runs at the first batch asked for. A DataLoader makes one iterator it throws away
        # before the one it reads, and that one must not use up the skip, which applies to one pass only.
        batches = self._rest()
        self.start = 0
        yield from batches

    def __len__(self) -> int:
        """This rank's micro-batches of the epoch, counted without building its order (how many full micro-batches
        each pool gives does not depend on the order)."""
        full_pools, left = divmod(len(self.lengths), self.pool * self.batch_size)
        rest = max(full_pools * self.pool + left // self.batch_size - self.start // self.batch_size, 0)
        return rest // self.num_replicas


def random_batches(count: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """The full batches of one shuffled pass over ``count`` items (``data.batching=random`` on one rank, epoch 0):
    what :func:`padding_fraction` compares bucketed batches with."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    order = torch.randperm(count, generator=generator).tolist()
    return [order[i:i + batch_size] for i in range(0, count - batch_size + 1, batch_size)]


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """The share of a padded batch's positions that are padding, over ``batches`` (lists of item indices):
    ``sum(len(b) * max(lengths of b) - sum(lengths of b)) / sum(len(b) * max(lengths of b))``; 0.0 when there is
    no batch."""
    padded = real = 0
    for batch in batches:
        sizes = [int(lengths[i]) for i in batch]
        padded += len(sizes) * max(sizes)
        real += sum(sizes)
    return (padded - real) / padded if padded else 0.0


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


def read_mel(args, cfg) -> torch.Tensor:
    """The mel ``(n_mels, frames)`` a vocoder's ``inference.py`` run vocodes: from ``--mel`` (a tensor file saved
    with ``torch.save``) or the log-mel of ``--wav`` (``args.mel``, ``args.wav``; ``cfg.audio``), float32.

    Raises:
        DataError: a missing, unreadable or misshapen file, or a wav too short for one STFT window.
    """
    if args.wav:
        audio = load_wav(args.wav, cfg.audio.sampling_rate)
        mel_fn = MelSpectrogram.from_config(cfg.audio)
        if audio.numel() < mel_fn.min_samples:
            raise DataError(f"--wav {args.wav}: {audio.numel()} samples is shorter than one STFT window "
                            f"({mel_fn.min_samples} samples at {cfg.audio.sampling_rate} Hz)")
        with torch.no_grad():
            return mel_fn(audio)
    try:
        mel = torch.load(args.mel, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"--mel {args.mel}: no such file") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, TypeError,
            AttributeError) as err:
        raise DataError(f"--mel {args.mel}: not a tensor saved with torch.save ({type(err).__name__})") from None
    if not torch.is_tensor(mel) or mel.dim() not in (2, 3) or (mel.dim() == 3 and mel.shape[0] != 1):
        raise DataError(f"--mel {args.mel}: expected a tensor of shape (n_mels, frames) or (1, n_mels, frames)")
    mel = mel.reshape(mel.shape[-2], mel.shape[-1]).float()
    if mel.shape[0] != cfg.audio.n_mels:
        raise DataError(f"--mel {args.mel}: has {mel.shape[0]} mel channels, the model expects {cfg.audio.n_mels}")
    if not torch.isfinite(mel).all():
        raise DataError(f"--mel {args.mel}: holds NaN or infinite values")
    return mel
