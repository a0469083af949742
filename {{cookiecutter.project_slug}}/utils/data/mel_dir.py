"""Mels read from a folder (``data.mel_dir``) instead of computed from the audio: a vocoder fine-tuned on a text-to-mel
model's teacher-forced mels from ``scripts/dump_gta_mels.py`` (Shen et al. 2018; jik876's ``--fine_tuning``). One of
the after-training tools: a project without them has no ``data.mel_dir``."""

from __future__ import annotations

import json
import typing
import warnings
from pathlib import Path
from typing import Optional

import torch

from model import ModelSpec
from utils.config import Config, ConfigError, Section
from utils.data.audio import AudioConfig, dynamic_range_compression
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus, DataError, PathLike
from utils.data.datasets import TORCH_LOAD_ERRORS, AudioMelDataset, Crop
from utils.data.sources import read_audio
from utils.framing import Framing, recorded_audio


class MelDirSettings(Section):
    """The ``data`` section's key of this part (one of the bases of ``parts.DataSettings``)."""

    mel_dir: str = ""  # mels to train a vocoder on (<id>.pt, from scripts.dump_gta_mels); empty: from the audio


MEL_SETTINGS_FILE = "_audio_config.json"
"""The file of a mel folder that records the ``audio`` settings its mels were made with (``AudioConfig.model_dump()``
as JSON), which ``scripts/dump_gta_mels.py`` writes."""
LEFT_OUT_FILE = "_left_out.json"
"""The file of a mel folder naming the utterances its dump left out and why: ``{"max_mel_frames": N, "frames": {id:
frames}}`` (longer than the text-to-mel model's ``max_mel_frames``); a vocoder on the folder trains without them."""

SILENCE_LOG_MEL = float(dynamic_range_compression(torch.zeros(())))
"""The log-mel of silence, ``log(1e-5)`` (about -11.51): pads a mel read from ``data.mel_dir`` shorter than a crop."""


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


def mel_dir_framing(data: MelDirSettings) -> Optional[str]:
    """The framing the mels of ``data.mel_dir`` (of the ``data`` section) were made with (:data:`MEL_SETTINGS_FILE`;
    one made before the setting: ``jik876``), or None without ``data.mel_dir`` or a readable record
    (:func:`check_mel_dir` says why): what ``utils.training.recipe.apply_recipe`` gives ``audio.mel_framing`` when the
    config leaves it null."""
    mel_dir = data.mel_dir
    if not mel_dir:
        return None
    try:
        record = _read_record(Path(mel_dir) / MEL_SETTINGS_FILE)
    except DataError:
        return None
    framing = None if record is None else recorded_audio(record)["mel_framing"]
    return framing if framing in typing.get_args(Framing) else None


def check_config(spec: ModelSpec, cfg: Config) -> None:
    """Refuse a ``data.mel_dir`` (none: nothing to check) the model cannot train on: not a vocoder, no
    ``segment_length`` in its section to crop with, mels computed on the device, or a ``segment_length`` that is not a
    multiple of ``audio.hop_length``.

    Raises:
        ConfigError: one line naming the setting and what to do instead.
    """
    name, mel_dir = spec.name, cfg.data.mel_dir
    if not mel_dir:
        return
    if spec.inference is None or spec.inference.vocode is None:
        raise ConfigError(f"data.mel_dir={mel_dir}: model '{name}' is not a vocoder (its spec has no "
                          "Inference.vocode) and does not read mels from a folder; leave data.mel_dir empty")
    model_cfg, hop = cfg.section(name), cfg.audio.hop_length
    if getattr(model_cfg, "mel_on_device", False):
        raise ConfigError(f"data.mel_dir={mel_dir} with {name}.mel_on_device=true: the mels are read from "
                          f"data.mel_dir, not computed from the audio on the device; set {name}.mel_on_device=false "
                          "or data.mel_dir=\"\"")
    segment = getattr(model_cfg, "segment_length", None)
    if not isinstance(segment, int):
        raise ConfigError(f"data.mel_dir={mel_dir}: model '{name}' has no {name}.segment_length, the crop its audio and "
                          "mels are cut to; leave data.mel_dir empty")
    if segment % hop:
        nearest = " or ".join(str(n) for n in (segment // hop * hop, (segment // hop + 1) * hop) if n)
        raise ConfigError(f"{name}.segment_length={segment} is not a multiple of audio.hop_length={hop}: with "
                          f"data.mel_dir audio and mel are cropped together on frame boundaries; use {nearest}")


def check_mel_dir(mel_dir: Path, audio_cfg: AudioConfig, utterances: Corpus) -> Corpus:
    """The ``utterances`` a mel folder serves, checked before any audio is read: it must exist, its recorded audio
    settings (:data:`MEL_SETTINGS_FILE`) be ``audio_cfg``'s, and every utterance have ``<id>.pt`` but those its dump
    left out (:data:`LEFT_OUT_FILE`), which are left out here too, said in one warning line.

    Raises:
        DataError: naming the folder, the differing settings, or the first utterance without a mel file and how many;
            or no utterance left.
    """
    if not mel_dir.is_dir():
        raise DataError(f"data.mel_dir {mel_dir} is not a folder (of <id>.pt mels, as a text-to-mel model's dump "
                        "writes them; set data.mel_dir=\"\" to compute the mels from the audio)")
    recorded = _read_record(mel_dir / MEL_SETTINGS_FILE)
    if recorded is not None:
        recorded, audio = recorded_audio(recorded), recorded_audio(audio_cfg.model_dump())
        differing = [f"{key}: mels {recorded.get(key)!r}, config {value!r}"
                     for key, value in audio.items() if recorded.get(key) != value]
        if differing:
            raise DataError(f"the mels in {mel_dir} were made with other audio settings ({'; '.join(differing)}): "
                            "set the audio section to theirs, or dump them again with this one")
    left_out = _read_record(mel_dir / LEFT_OUT_FILE) or {}
    missing = [utt_id for utt_id in utterances.ids.tolist() if not (mel_dir / f"{utt_id}.pt").is_file()]
    unexplained = [utt_id for utt_id in missing if utt_id not in left_out.get("frames", {})]
    if unexplained:
        more = f" (and {len(unexplained) - 1} more of {len(utterances)} utterances)" if len(unexplained) > 1 else ""
        raise DataError(f"no mel for utterance '{unexplained[0]}': {mel_dir / (unexplained[0] + '.pt')} not found"
                        f"{more}; dump it into data.mel_dir, or leave the utterance out with data.exclude")
    gone = set(missing)
    kept = utterances.take([i for i, utt_id in enumerate(utterances.ids.tolist()) if utt_id not in gone])
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
    except TORCH_LOAD_ERRORS as err:
        raise DataError(f"cannot load the mel of utterance '{utt_id}': {path}: {type(err).__name__}") from None
    if not torch.is_tensor(mel) or mel.dim() != 2 or not mel.is_floating_point() or mel.shape[0] != n_mels:
        got = tuple(mel.shape) if torch.is_tensor(mel) else type(mel).__name__
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) should be a float tensor ({n_mels}, frames), got "
                        f"{got}")
    if not torch.isfinite(mel).all():
        raise DataError(f"the mel of utterance '{utt_id}' ({path}) holds NaN or infinite values")
    return mel.float()


class MelDirDataset(AudioMelDataset):
    """:class:`AudioMelDataset` items whose mels are read from ``mel_dir``: ``<mel_dir>/<id>.pt``, the utterance's
    ``(n_mels, MelSpectrogram.num_frames(T))`` for its ``T`` samples, in the folder's framing (``audio.mel_framing``
    follows it: ``utils.training.recipe.apply_recipe``); utterances its dump left out are left out
    (:func:`check_mel_dir`).

    Mel and audio (as read) are cropped together on frame boundaries: mel frames from a frame ``f`` drawn by the
    :class:`Crop`, samples from ``f * hop_length`` (jik876's alignment, whatever the framing), so ``segment_length``
    must be a multiple of ``hop_length``. Every crop is ``segment_length`` samples: what its frames cover past the
    clip's end (NVIDIA's ``1 + T // hop_length`` frames reach up to ``hop_length`` samples past it) is zeros, as
    NVIDIA's ``Mel2Samp`` and jik876's ``MelDataset`` pad a short clip; a clip of fewer frames than the crop is followed
    by zeros and :data:`SILENCE_LOG_MEL` (jik876 pads the mel with 0, the log of a loud spectrum).

    Raises:
        DataError: see :class:`AudioMelDataset` and :func:`check_mel_dir`; in ``__getitem__``, a mel file unreadable,
            misshapen, or of another frame count than its audio (naming utterance and file).
        ValueError: ``segment_length`` too short for a mel frame, or not a multiple of ``hop_length``.
    """

    def __init__(self, corpus: Corpus, audio_cfg: AudioConfig, crop: Crop, mel_dir: PathLike):
        super().__init__(corpus, audio_cfg, crop)
        self.mel_dir, segment_length, hop = Path(mel_dir), crop.segment_length, audio_cfg.hop_length
        if segment_length % hop:
            lower, upper = segment_length // hop * hop, (segment_length // hop + 1) * hop
            raise ValueError(f"segment_length={segment_length} is not a multiple of audio.hop_length={hop}: with "
                             f"data.mel_dir audio and mel are cropped together on frame boundaries; use "
                             f"{f'{lower} or ' if lower else ''}{upper}")
        self.corpus = check_mel_dir(self.mel_dir, audio_cfg, self.corpus)

    def __getitem__(self, index: int) -> dict:
        utt = self.corpus[index]
        audio = read_audio(utt.audio, self.audio_cfg.sampling_rate)
        hop, path = self.audio_cfg.hop_length, self.mel_dir / f"{utt.id}.pt"
        mel = load_mel_file(path, utt.id, self.audio_cfg.n_mels)
        expected = self.mel.num_frames(audio.shape[0])
        if mel.shape[1] != expected:
            raise DataError(f"the mel of utterance '{utt.id}' ({path}) has {mel.shape[1]} frames; its audio "
                            f"({audio.shape[0]} samples at {self.audio_cfg.sampling_rate} Hz) gives {expected} "
                            f"({self.mel.framing} framing: (samples + 2 * {self.mel.pad} - {self.mel.n_fft}) // {hop} "
                            "+ 1): made from other audio or with other settings")
        frames = self.segment_length // hop
        audio = audio[:mel.shape[1] * hop]
        audio = torch.nn.functional.pad(audio, (0, max(mel.shape[1], frames) * hop - audio.shape[0]))
        mel = torch.nn.functional.pad(mel, (0, max(frames - mel.shape[1], 0)), value=SILENCE_LOG_MEL)
        start = self.crop.start(index, self.epoch, mel.shape[1] - frames + 1)
        mel = mel[:, start:start + frames]
        audio = audio[start * hop:start * hop + self.segment_length]
        return {"mel": mel.contiguous(), "audio": audio.contiguous(), "id": utt.id}


def vocoder_datasets(spec: ModelSpec, cfg: Config) -> Optional[tuple[MelDirDataset, MelDirDataset]]:
    """A vocoder's train and validation :class:`MelDirDataset` on ``data.mel_dir`` in place of its model's datasets
    (``None`` without ``data.mel_dir``): random crops of the model's ``segment_length`` samples seeded by
    ``train.seed``, and the first crop. :func:`check_config` has refused a model that cannot train on them."""
    if not cfg.data.mel_dir:
        return None
    splits, segment_length = load_splits(cfg.data), cfg.section(spec.name).segment_length
    train = MelDirDataset(splits[0], cfg.audio, Crop(segment_length, seed=cfg.train.seed), cfg.data.mel_dir)
    val = MelDirDataset(splits[1], cfg.audio, Crop(segment_length, random=False), cfg.data.mel_dir)
    return train, val
