"""The vocoders' audio+mel dataset (random crops), its collate function, the epoch shared with DataLoader workers, and
``inference.py``'s ``--mel``/``--wav`` reader."""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
from typing import Sequence

import torch
from torch.utils.data import Dataset

from utils.data.audio import AudioConfig, MelSpectrogram, load_wav
from utils.data.corpus import Corpus, DataError
from utils.data.sources import read_audio


TORCH_LOAD_ERRORS = (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError,
                     TypeError, AttributeError)  # what torch.load raises for a file that holds no tensor it can read


@dataclasses.dataclass(frozen=True)
class Crop:
    """Which ``segment_length`` samples of a clip an item holds (NVIDIA's ``Mel2Samp``, jik876's
    ``MelDataset``): with ``random`` a start seeded by ``(seed, epoch, index)`` (resumes crop alike), else the first."""

    segment_length: int  # samples
    random: bool = True
    seed: int = 0

    def start(self, index: int, epoch: int, choices: int) -> int:
        """The crop's start in ``[0, choices)`` (samples, or mel frames) for item ``index`` in ``epoch``."""
        if not self.random:
            return 0
        rng = torch.Generator().manual_seed(hash((self.seed, epoch, index)) & 0x7FFF_FFFF_FFFF)
        return int(torch.randint(0, choices, (1,), generator=rng).item())


class AudioMelDataset(Dataset):
    """Fixed-length audio segments and their log-mels: NVIDIA's ``Mel2Samp`` recipe.

    Item ``i`` is ``{"mel": (n_mels, MelSpectrogram.num_frames(segment_length)) float32, "audio": (segment_length,)
    float32, "id": str}`` (batch with :func:`collate_audio_mel`): ``crop.segment_length`` samples of utterance ``i``'s
    audio (:func:`~utils.data.sources.read_audio`), where :class:`Crop` puts them, zero-padded; ``with_mel=False``: no ``"mel"`` (computed on the device).
    ``peak``: each clip scaled to that peak first, in float64 then cast to float32 (jik876's ``MelDataset``:
    ``librosa.util.normalize(audio) * 0.95`` on the float64 clip, ``torch.FloatTensor`` of it; 0: as read).

    Raises:
        DataError: no utterances; in ``__getitem__``, an audio file unreadable (naming it).
        ValueError: ``segment_length`` too short for a mel frame.
    """

    def __init__(self, corpus: Corpus, audio_cfg: AudioConfig, crop: Crop, with_mel: bool = True, peak: float = 0.0):
        if len(corpus) == 0:
            raise DataError("AudioMelDataset: no utterances given")
        self.corpus, self.audio_cfg, self.crop = corpus, audio_cfg, crop
        self.with_mel, self.peak = with_mel, peak
        # Shared memory: persistent workers hold the dataset as it was at their start, out of a plain attribute's reach
        self._epoch = multiprocessing.Value("q", 0, lock=False)
        self.segment_length = segment_length = crop.segment_length  # samples
        self.mel = MelSpectrogram(audio_cfg)
        if self.mel.num_frames(segment_length) < 1 or segment_length < self.mel.min_samples:
            raise ValueError(f"AudioMelDataset: segment_length={segment_length} samples is too short for "
                             f"n_fft={audio_cfg.n_fft}, hop_length={audio_cfg.hop_length} ({self.mel.framing} "
                             "framing)")

    def __len__(self) -> int:
        return len(self.corpus)

    @property
    def epoch(self) -> int:
        return int(self._epoch.value)

    def set_epoch(self, epoch: int) -> None:
        """Draw epoch ``epoch``'s crops (set before its batches are requested; the workers see it)."""
        self._epoch.value = epoch

    def __getitem__(self, index: int) -> dict:
        return self.item(index, read_audio(self.corpus[index].audio, self.audio_cfg.sampling_rate))

    def item(self, index: int, audio: torch.Tensor) -> dict:
        """Item ``index`` made of ``audio``, its utterance's sound (float32 ``(T,)`` at ``audio.sampling_rate`` Hz, as
        :func:`~utils.data.sources.read_audio` gives it, wherever it was read from: a file, a shard)."""
        utt = self.corpus[index]
        if self.peak:  # jik876's order and precision: librosa's normalize of the float64 clip, times the peak
            audio64 = audio.double()
            audio = (audio64 / audio64.abs().max().clamp_min(torch.finfo(torch.float64).tiny) * self.peak).float()
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
    [str] * B}`` (without ``"mel"`` when the items have none). Raises ValueError if ``items`` is empty or the items'
    shapes differ (naming the ids)."""
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
    ``torch.save``) or the log-mel of ``--wav``. Raises DataError for a missing, unreadable or misshapen file, or a wav
    too short for one STFT window."""
    if args.wav:
        audio = load_wav(args.wav, cfg.audio.sampling_rate)
        mel_fn = MelSpectrogram(cfg.audio)
        if audio.numel() < mel_fn.min_samples:
            raise DataError(f"--wav {args.wav}: {audio.numel()} samples is shorter than one STFT window "
                            f"({mel_fn.min_samples} samples at {cfg.audio.sampling_rate} Hz)")
        with torch.no_grad():
            return mel_fn(audio)
    try:
        mel = torch.load(args.mel, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"--mel {args.mel}: no such file") from None
    except TORCH_LOAD_ERRORS as err:
        raise DataError(f"--mel {args.mel}: not a tensor saved with torch.save ({type(err).__name__})") from None
    if not torch.is_tensor(mel) or mel.dim() not in (2, 3) or (mel.dim() == 3 and mel.shape[0] != 1):
        raise DataError(f"--mel {args.mel}: expected a tensor of shape (n_mels, frames) or (1, n_mels, frames)")
    mel = mel.reshape(mel.shape[-2], mel.shape[-1]).float()
    if mel.shape[0] != cfg.audio.n_mels:
        raise DataError(f"--mel {args.mel}: has {mel.shape[0]} mel channels, the model expects {cfg.audio.n_mels}")
    if not torch.isfinite(mel).all():
        raise DataError(f"--mel {args.mel}: holds NaN or infinite values")
    return mel
