"""The audio+mel dataset of the vocoders (random crops, or mels read from ``data.mel_dir``), its collate function,
the epoch shared with DataLoader workers, and ``inference.py``'s ``--mel``/``--wav`` reader.
"""

from __future__ import annotations

import json
import multiprocessing
import pickle
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch.utils.data import Dataset

from utils.data.audio import AudioConfig, MelSpectrogram, dynamic_range_compression, load_wav
from utils.data.corpus import DataError, PathLike, Utterance


class SharedEpoch:
    """An epoch number set in the training process and read live by its DataLoader workers.

    Persistent workers (``DataLoader(persistent_workers=True)``) hold their own copy of the dataset, made when they
    started: a plain ``self.epoch = n`` set later never reaches them, and every epoch would draw epoch 0's random crops.
    This keeps the number in shared memory instead (a ``multiprocessing.Value``), so ``value`` is the same in the
    process and in every worker it forks. A dataset whose items depend on the epoch keeps it here and sets it in
    ``set_epoch`` (``train.py`` calls that before each epoch).
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
"""The file of a mel folder that records the ``audio`` settings its mels were made with (``model_dump()`` of
:class:`utils.data.audio.AudioConfig` as JSON): what ``scripts/dump_gta_mels.py`` writes next to its mels."""

SILENCE_LOG_MEL = float(dynamic_range_compression(torch.zeros(())))
"""The log-mel value of silence, ``log(1e-5)`` (about -11.51): what :class:`~utils.data.audio.MelSpectrogram`
gives for zero samples, and what pads a mel read from ``data.mel_dir`` when its clip is shorter than a crop."""


def check_mel_dir(mel_dir: Path, audio_cfg: AudioConfig, utterances: Sequence[Utterance]) -> None:
    """Refuse a mel folder (``data.mel_dir``) that cannot serve ``utterances``, before any audio is read: a missing folder,
    mels recorded (:data:`MEL_SETTINGS_FILE`, when there) with other audio settings, or an utterance without its
    ``<mel_dir>/<id>.pt`` (only the files' existence is checked here; their contents when an item is read).

    Raises:
        DataError: one line naming the folder, the differing settings, or the first utterance without a mel file (its id
            and the file) and how many there are.
    """
    if not mel_dir.is_dir():
        raise DataError(f"data.mel_dir {mel_dir} is not a folder (dump mels there with python -m scripts.dump_gta_mels, or "
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
                     for key, value in audio_cfg.model_dump().items() if recorded.get(key) != value]
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
        DataError: the file is missing or unreadable, or holds no finite float tensor ``(n_mels, frames)``; the message
            names the utterance and the file.
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

    Item ``i`` loads utterance ``i``'s wav (:func:`load_wav`), takes ``segment_length`` samples from it (a random crop
    drawn from a generator seeded by ``(seed, epoch, i)``, so a resumed run crops exactly as the uninterrupted one
    whatever the worker layout; or the first ``segment_length`` samples when ``random_crop=False``, for a deterministic
    validation set), pads clips shorter than that with zeros at the end, and computes the log-mel of the segment with
    one :class:`~utils.data.audio.MelSpectrogram` built for the dataset.

    Items are dicts: ``{"mel": (n_mels, frames) float32, "audio": (segment_length,) float32, "id": str}`` with ``frames
    = MelSpectrogram.num_frames(segment_length)`` (about ``segment_length / hop_length``). Batch them with
    :func:`collate_audio_mel`.

    With ``mel_dir`` (``data.mel_dir``) the mels are read, not computed: ``<mel_dir>/<id>.pt``, the whole utterance's
    mel ``(n_mels, frames)`` (e.g. Tacotron2's teacher-forced, "ground-truth aligned" mels from
    ``scripts/dump_gta_mels.py``), and a vocoder learns to turn *those* into the real audio: the fine-tuning of
    jik876/hifi-gan (``--fine_tuning``, its ``MelDataset``) and of Shen et al. 2018's WaveNet on Tacotron2's
    predictions. A mel must have exactly ``MelSpectrogram.num_frames(T)`` frames for the ``T`` samples of its clip
    (:func:`load_wav` at ``audio.sampling_rate``): ``(T + 2 * pad - n_fft) // hop_length + 1`` with ``pad = (n_fft -
    hop_length) // 2``; frame ``k`` then covers samples ``k * hop_length`` to ``(k + 1) * hop_length`` (its window is
    centred there). Audio and mel are cropped together on frame boundaries: a frame ``f`` drawn uniformly from ``[0,
    frames - segment_length // hop_length]`` by the same seeded generator as above (``(seed, epoch, i)``; ``f = 0``
    without ``random_crop``), mel frames ``f`` to ``f + segment_length // hop_length`` (end excluded) and samples ``f *
    hop_length`` to ``f * hop_length + segment_length``, so ``segment_length`` must be a multiple of ``hop_length``. A
    clip with fewer frames than that keeps its mel and the audio of those frames, padded with silence to the crop: zeros
    for the audio and :data:`SILENCE_LOG_MEL` for the mel, the mel of zeros (jik876 pads the mel with 0 instead, the log
    of a loud spectrum). Items then hold ``segment_length // hop_length`` mel frames.

    Args:
        utterances: from :func:`read_ljspeech`, :func:`read_filelist` or :func:`load_splits`.
        audio_cfg: signal settings (sampling rate, STFT and mel parameters).
        segment_length: samples per item.
        random_crop: random (training) or first-segment (validation) crops.
        seed: base seed of the crops; :meth:`set_epoch` changes them every epoch.
        with_mel: compute each crop's mel here (in the DataLoader workers); ``False``: items hold audio only.
        mel_dir: a folder of mels to read instead (a path as given, relative to the current folder); ``None`` or ``""``:
            compute them from the audio.

    Raises:
        DataError: ``utterances`` is empty, or ``mel_dir`` cannot serve them (:func:`check_mel_dir`: the folder, its
            recorded audio settings, a missing ``<id>.pt``) (here); a wav cannot be loaded, or a mel file is unreadable,
            misshapen or has another number of frames than its audio gives (in ``__getitem__``; the message names the
            utterance and the file).
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
        """Draw other crops in epoch ``epoch`` (set before the epoch's batches are requested, like the sampler's);
        persistent DataLoader workers see it too (:class:`SharedEpoch`)."""
        self._epoch.value = epoch

    def _start(self, index: int, choices: int) -> int:
        """The crop's start in ``[0, choices)`` (samples, or frames with ``mel_dir``): drawn from a generator seeded by
        ``(seed, epoch, index)`` for training crops, 0 for validation ones."""
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


def collate_audio_mel(items: Sequence[dict]) -> dict:
    """Stack :class:`AudioMelDataset` items into a batch dict.

    Returns:
        ``{"mel": (B, n_mels, frames), "audio": (B, segment_length), "ids": [str] * B}``; without ``"mel"`` when the
        items have none (``AudioMelDataset(with_mel=False)``).

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
    """The mel ``(n_mels, frames)`` a vocoder's ``inference.py`` run vocodes: from ``--mel`` (a tensor file saved with
    ``torch.save``) or the log-mel of ``--wav`` (``args.mel``, ``args.wav``; ``cfg.audio``), float32.

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
