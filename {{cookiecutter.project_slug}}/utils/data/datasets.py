"""The vocoders' audio+mel dataset (random crops; mels computed or read from ``data.mel_dir``), its collate function,
the epoch shared with DataLoader workers, and ``inference.py``'s ``--mel``/``--wav`` reader."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import pickle
import typing
import warnings
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch.utils.data import Dataset

from utils.data.audio import AudioConfig, MelSpectrogram, dynamic_range_compression, load_wav
from utils.data.corpus import DataError, PathLike, Utterance
from utils.framing import Framing, recorded_audio
from utils.parts import has_part


class SharedEpoch:
    """An epoch number set in the training process and read live by its DataLoader workers (in shared memory):
    persistent workers hold a copy of the dataset made when they started, which a plain ``self.epoch = n`` never
    reaches (every epoch would draw epoch 0's crops). A dataset whose items depend on the epoch sets it here."""

    def __init__(self, epoch: int = 0):
        self._shared = multiprocessing.Value("q", epoch, lock=False)

    @property
    def value(self) -> int:
        return int(self._shared.value)

    @value.setter
    def value(self, epoch: int) -> None:
        self._shared.value = epoch


MEL_SETTINGS_FILE = "_audio_config.json"
"""The file of a mel folder that records the ``audio`` settings its mels were made with (``AudioConfig.model_dump()``
as JSON), which ``scripts/dump_gta_mels.py`` writes."""
LEFT_OUT_FILE = "_left_out.json"
"""The file of a mel folder naming the utterances its dump left out and why: ``{"max_mel_frames": N, "frames": {id:
frames}}`` (longer than the text-to-mel model's ``max_mel_frames``); a vocoder on the folder trains without them."""

SILENCE_LOG_MEL = float(dynamic_range_compression(torch.zeros(())))
"""The log-mel of silence, ``log(1e-5)`` (about -11.51): pads a mel read from ``data.mel_dir`` shorter than a crop."""

_LOAD_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError, TypeError,
                AttributeError)  # what torch.load raises for a file that holds no tensor it can read


def _read_record(path: Path) -> Optional[dict]:
    """The JSON object in ``path``, None without the file. DataError: unreadable, or not an object."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"cannot read the mel folder's record {path}: {err}") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: expected a JSON object")
    return record


def mel_dir_framing(mel_dir: PathLike) -> Optional[str]:
    """The framing the mels of ``mel_dir`` were made with (:data:`MEL_SETTINGS_FILE`; one made before the setting:
    ``jik876``), or None without a readable record (:func:`check_mel_dir` says why)."""
    try:
        record = _read_record(Path(mel_dir) / MEL_SETTINGS_FILE)
    except DataError:
        return None
    framing = None if record is None else recorded_audio(record)["mel_framing"]
    return framing if framing in typing.get_args(Framing) else None


def check_mel_dir(mel_dir: Path, audio_cfg: AudioConfig, utterances: Sequence[Utterance]) -> list[Utterance]:
    """The ``utterances`` a mel folder (``data.mel_dir``) serves, checked before any audio is read: it must exist, its
    recorded audio settings (:data:`MEL_SETTINGS_FILE`) be ``audio_cfg``'s, and every utterance have ``<id>.pt`` but
    those its dump left out (:data:`LEFT_OUT_FILE`), which are left out here too, said in one warning line.

    Raises:
        DataError: naming the folder, the differing settings, or the first utterance without a mel file and how many;
            or no utterance left.
    """
    if not mel_dir.is_dir():
        dump = "dump mels there with python -m scripts.dump_gta_mels, or " if has_part("scripts.dump_gta_mels") else ""
        raise DataError(f"data.mel_dir {mel_dir} is not a folder ({dump}set data.mel_dir=\"\" to compute the mels "
                        "from the audio)")
    recorded = _read_record(mel_dir / MEL_SETTINGS_FILE)
    if recorded is not None:
        recorded, audio = recorded_audio(recorded), recorded_audio(audio_cfg.model_dump())
        differing = [f"{key}: mels {recorded.get(key)!r}, config {value!r}"
                     for key, value in audio.items() if recorded.get(key) != value]
        if differing:
            raise DataError(f"the mels in {mel_dir} were made with other audio settings ({'; '.join(differing)}): "
                            "set the audio section to theirs, or dump them again with this one")
    left_out = _read_record(mel_dir / LEFT_OUT_FILE) or {}
    missing = [utt.id for utt in utterances if not (mel_dir / f"{utt.id}.pt").is_file()]
    unexplained = [utt_id for utt_id in missing if utt_id not in left_out.get("frames", {})]
    if unexplained:
        more = f" (and {len(unexplained) - 1} more of {len(utterances)} utterances)" if len(unexplained) > 1 else ""
        raise DataError(f"no mel for utterance '{unexplained[0]}': {mel_dir / (unexplained[0] + '.pt')} not found"
                        f"{more}; dump it into data.mel_dir, or leave the utterance out with data.exclude")
    gone = set(missing)
    kept = [utt for utt in utterances if utt.id not in gone]
    if missing:
        why = (f"{len(missing)} of {len(utterances)} utterances have no mel in {mel_dir}: its dump left them out, "
               f"longer than the text-to-mel model's max_mel_frames={left_out.get('max_mel_frames')} mel frames ({LEFT_OUT_FILE})")
        if not kept:
            raise DataError(f"{why}; none is left: dump them with --max-mel-frames 0")
        warnings.warn(f"AudioMelDataset: training without {why}; dump them with --max-mel-frames 0 to keep them",
                      stacklevel=3)
    return kept


def load_mel_file(path: Path, utt_id: str, n_mels: int) -> torch.Tensor:
    """The mel ``(n_mels, frames)`` float32 of utterance ``utt_id`` in ``path`` (a tensor saved with ``torch.save``).

    Raises:
        DataError: naming the utterance and the file: missing, unreadable, or no finite float ``(n_mels, frames)``.
    """
    try:
        mel = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"no mel for utterance '{utt_id}': {path} not found") from None
    except _LOAD_ERRORS as err:
        raise DataError(f"cannot load the mel of utterance '{utt_id}': {path}: {type(err).__name__}") from None
    if not torch.is_tensor(mel) or mel.dim() != 2 or not mel.is_floating_point() or mel.shape[0] != n_mels:
        got = tuple(mel.shape) if torch.is_tensor(mel) else type(mel).__name__
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) should be a float tensor ({n_mels}, frames), got "
                        f"{got}")
    if not torch.isfinite(mel).all():
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) holds NaN or infinite values")
    return mel.float()


@dataclasses.dataclass(frozen=True)
class Crop:
    """Which ``segment_length`` samples of a clip an item holds: with ``random`` a start drawn from a generator seeded
    by ``(seed, epoch, index)`` (so a resumed run crops as the uninterrupted one, whatever the DataLoader workers),
    else the first ones (validation). NVIDIA WaveGlow's ``Mel2Samp`` and jik876/hifi-gan's ``MelDataset`` crop so."""

    segment_length: int  # samples
    random: bool = True
    seed: int = 0

    def start(self, index: int, epoch: int, choices: int) -> int:
        """The crop's start in ``[0, choices)`` (samples, or mel frames) for item ``index`` in ``epoch``; 0 without
        ``random``."""
        if not self.random:
            return 0
        rng = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF_FFFF)
        return int(torch.randint(0, choices, (1,), generator=rng).item())


class AudioMelDataset(Dataset):
    """Fixed-length audio segments and their log-mels: NVIDIA WaveGlow's ``Mel2Samp`` recipe.

    Item ``i`` is ``{"mel": (n_mels, MelSpectrogram.num_frames(segment_length)) float32, "audio": (segment_length,)
    float32, "id": str}`` (batch with :func:`collate_audio_mel`): ``crop.segment_length`` samples of utterance ``i``'s
    wav, where :class:`Crop` puts them (random, or the first ones), zero-padded; ``with_mel=False``: no ``"mel"``
    (computed on the device). ``peak``: each clip scaled to that peak first (jik876's ``normalize(audio) * 0.95``; 0:
    as read; not with ``mel_dir``, whose mels were made from the audio as read).

    With ``mel_dir`` the mels are read instead (``<mel_dir>/<id>.pt``: the utterance's ``(n_mels,
    MelSpectrogram.num_frames(T))`` for its ``T`` samples, in the folder's framing: ``audio.mel_framing`` follows it,
    :func:`utils.training.recipe.apply_recipe`), e.g. Tacotron2's teacher-forced mels from
    ``scripts/dump_gta_mels.py``, which a vocoder learns to turn into the real audio (jik876/hifi-gan's
    ``--fine_tuning``; Shen et al. 2018); utterances the dump left out are left out (:func:`check_mel_dir`). Mel and
    audio are then cropped together on frame boundaries (mel frames from a frame ``f`` drawn as above, samples from ``f
    * hop_length``, jik876's alignment whatever the framing), so ``segment_length`` must be a multiple of
    ``hop_length``; every crop, the one ending on the clip's last frame included, is ``segment_length`` samples: what
    its frames cover past the clip's end (NVIDIA's framing: ``1 + T // hop_length`` frames cover up to ``hop_length``
    samples more than the clip) is zeros, as NVIDIA's ``Mel2Samp`` and jik876's ``MelDataset`` pad a clip shorter than
    a segment; a clip of fewer frames than the crop is followed by zeros and :data:`SILENCE_LOG_MEL` (jik876 pads the
    mel with 0, the log of a loud spectrum).

    Raises:
        DataError: no utterances, or ``mel_dir`` cannot serve them (:func:`check_mel_dir`); in ``__getitem__``, a wav or
            mel file unreadable, misshapen, or of another frame count than its audio (naming utterance and file).
        ValueError: ``segment_length`` too short for a mel frame, or with ``mel_dir`` not a multiple of
            ``hop_length``; ``mel_dir`` with ``with_mel=False``.
    """

    def __init__(self, utterances: Sequence[Utterance], audio_cfg: AudioConfig, crop: Crop, with_mel: bool = True,
                 mel_dir: Optional[PathLike] = None, peak: float = 0.0):
        if len(utterances) == 0:
            raise DataError("AudioMelDataset: no utterances given")
        self.utterances, self.audio_cfg, self.crop = list(utterances), audio_cfg, crop
        self.with_mel, self.peak, self._epoch = with_mel, peak, SharedEpoch()
        self.segment_length = segment_length = crop.segment_length  # samples
        self.mel = MelSpectrogram.from_config(audio_cfg)
        if self.mel.num_frames(segment_length) < 1 or segment_length < self.mel.min_samples:
            raise ValueError(f"AudioMelDataset: segment_length={segment_length} samples is too short for "
                             f"n_fft={audio_cfg.n_fft}, hop_length={audio_cfg.hop_length} ({self.mel.framing} "
                             "framing)")
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
            self.utterances = check_mel_dir(self.mel_dir, audio_cfg, self.utterances)

    def __len__(self) -> int:
        return len(self.utterances)

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s crops (set before its batches are requested; workers see it: :class:`SharedEpoch`)."""
        self._epoch.value = epoch

    def _read_item(self, index: int, utt: Utterance, audio: torch.Tensor) -> dict:
        """The item of a mel read from ``mel_dir``, cropped with its audio on frame boundaries."""
        hop, path = self.audio_cfg.hop_length, self.mel_dir / f"{utt.id}.pt"
        mel = load_mel_file(path, utt.id, self.audio_cfg.n_mels)
        expected = self.mel.num_frames(audio.shape[0])
        if mel.shape[1] != expected:
            raise DataError(f"the mel of utterance '{utt.id}' ({path}) has {mel.shape[1]} frames; its audio "
                            f"({audio.shape[0]} samples at {self.audio_cfg.sampling_rate} Hz) gives {expected} "
                            f"({self.mel.framing} framing: (samples + 2 * {self.mel.pad} - {self.mel.n_fft}) // {hop} "
                            "+ 1): made from other audio or with other settings")
        frames = self.segment_length // hop
        # The audio of the mel's frames, zeros past the clip's end: NVIDIA's framing has 1 + T // hop frames, whose
        # last crop reaches up to hop samples past the clip's T; a clip shorter than the crop: silence after its frames.
        audio = audio[:mel.shape[1] * hop]
        audio = torch.nn.functional.pad(audio, (0, max(mel.shape[1], frames) * hop - audio.shape[0]))
        mel = torch.nn.functional.pad(mel, (0, max(frames - mel.shape[1], 0)), value=SILENCE_LOG_MEL)
        start = self.crop.start(index, self.epoch, mel.shape[1] - frames + 1)
        mel = mel[:, start:start + frames]
        audio = audio[start * hop:start * hop + self.segment_length]
        return {"mel": mel.contiguous(), "audio": audio.contiguous(), "id": utt.id}

    def __getitem__(self, index: int) -> dict:
        utt = self.utterances[index]
        audio = load_wav(utt.wav_path, self.audio_cfg.sampling_rate)
        if self.mel_dir is not None:
            return self._read_item(index, utt, audio)
        if self.peak:
            audio = audio * (self.peak / audio.abs().max().clamp_min(1e-8))
        if audio.shape[0] >= self.segment_length:
            start = self.crop.start(index, self.epoch, audio.shape[0] - self.segment_length + 1)
            audio = audio[start:start + self.segment_length]
        else:
            audio = torch.nn.functional.pad(audio, (0, self.segment_length - audio.shape[0]))
        if not self.with_mel:  # the mel is computed on the device, in the training step
            return {"audio": audio, "id": utt.id}
        with torch.no_grad():
            return {"mel": self.mel(audio), "audio": audio, "id": utt.id}


def collate_audio_mel(items: Sequence[dict]) -> dict:
    """Stack :class:`AudioMelDataset` items into ``{"mel": (B, n_mels, frames), "audio": (B, segment_length), "ids":
    [str] * B}`` (without ``"mel"`` when the items have none).

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
    return {**{key: torch.stack([item[key] for item in items]) for key in keys}, "ids": [item["id"] for item in items]}


def read_mel(args, cfg) -> torch.Tensor:
    """The float32 mel ``(n_mels, frames)`` a vocoder's ``inference.py`` vocodes: ``--mel`` (a tensor saved with
    ``torch.save``) or the log-mel of ``--wav``.

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
    except _LOAD_ERRORS as err:
        raise DataError(f"--mel {args.mel}: not a tensor saved with torch.save ({type(err).__name__})") from None
    if not torch.is_tensor(mel) or mel.dim() not in (2, 3) or (mel.dim() == 3 and mel.shape[0] != 1):
        raise DataError(f"--mel {args.mel}: expected a tensor of shape (n_mels, frames) or (1, n_mels, frames)")
    mel = mel.reshape(mel.shape[-2], mel.shape[-1]).float()
    if mel.shape[0] != cfg.audio.n_mels:
        raise DataError(f"--mel {args.mel}: has {mel.shape[0]} mel channels, the model expects {cfg.audio.n_mels}")
    if not torch.isfinite(mel).all():
        raise DataError(f"--mel {args.mel}: holds NaN or infinite values")
    return mel
