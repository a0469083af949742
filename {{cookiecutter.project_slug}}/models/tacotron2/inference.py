"""Tacotron2 at inference: text -> mel -> wav (a vocoder checkpoint, or Griffin-Lim), and rank 0's validation pictures
and audio for TensorBoard (alignment, mel, gate).
"""

from __future__ import annotations

import argparse
import inspect
import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import librosa
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model import Batch
from models.tacotron2.network import Tacotron2
from models.tacotron2.text import sequence_to_text, text_to_sequence
from utils.config import Config
from utils.data.audio import ArrayLike, AudioConfig, check_wav_output, save_wav
from utils.data.corpus import DataError
from utils.data.speakers import chosen_index
from models.tacotron2.plots import plot_alignment, plot_gate, plot_spectrogram
from utils.plotting import add_audio, first_time, fixed_random_state

LOG_GRIFFIN_LIM_ITERS = 32
"""Griffin-Lim iterations of the validation clips: enough to hear the words, far from vocoder quality."""


def log_validation(model: nn.Module, batch: Batch, outputs: dict[str, torch.Tensor], step: int,
                   writer: Any, output_dir: Any, cfg: Config | None = None) -> None:
    """Pictures and audio of the first utterance of a validation batch, padding cut off (the loader does not shuffle
    and the collate sorts by text length, so it is the same utterance at every validation).

    ``batch`` is :class:`models.tacotron2.data.TextMelCollate`'s, ``outputs`` the unwrapped ``model``'s (in eval mode)
    for it: ``{"mel_postnet": (B, n_mels, T), "gate": (B, T), "alignments": (B, T, L), ...}``. Always saves
    ``output_dir/alignment_<step>.png``; with a TensorBoard ``writer`` also adds the figures ``alignment``,
    ``mel_target``, ``mel_predicted`` (post-net output) and ``gate``, and with the run's ``cfg`` audio made with
    Griffin-Lim (:func:`griffin_lim_clip`), at most ``tacotron2.val_audio_seconds`` of each (0: none; Griffin-Lim of
    3 s with :data:`LOG_GRIFFIN_LIM_ITERS` iterations takes about a second of CPU time) at ``audio.sampling_rate`` Hz:
    ``audio/teacher_forced_griffin_lim`` (the post-net mel), ``audio/free_running_griffin_lim``
    (:func:`free_running_mel` of the item's text), and at the run's first validation only ``audio/target_griffin_lim``
    (what Griffin-Lim makes of a perfect mel) and the text ``audio/utterance`` (id and transcript).
    """
    text_len, frames = int(batch["text_lengths"][0]), int(batch["mel_lengths"][0])
    alignment = outputs["alignments"][0, :frames, :text_len].float().cpu().T  # (L, T)
    utt = batch["ids"][0] if "ids" in batch else "utterance 0"
    figure = plot_alignment(alignment, Path(output_dir) / f"alignment_{step}.png", title=f"{utt}, step {step}")
    if writer is None:
        return
    writer.add_figure("alignment", figure, step)
    writer.add_figure("mel_target", plot_spectrogram(batch["mel"][0, :, :frames]), step)
    writer.add_figure("mel_predicted", plot_spectrogram(outputs["mel_postnet"][0, :, :frames]), step)
    writer.add_figure("gate", plot_gate(batch["gate"][0, :frames],
                                        torch.sigmoid(outputs["gate"][0, :frames].float())), step)
    if cfg is None or cfg.tacotron2.val_audio_seconds == 0:
        return
    audio_cfg = cfg.audio
    max_frames = max(2, int(cfg.tacotron2.val_audio_seconds * audio_cfg.sampling_rate / audio_cfg.hop_length))
    crop = min(frames, max_frames)
    text = batch["text"][0, :text_len]
    if first_time(writer, "audio/target_griffin_lim"):
        writer.add_text("audio/utterance", f"{utt}: {sequence_to_text(text.tolist())}", step)
        _add_griffin_lim(writer, "audio/target_griffin_lim", batch["mel"][0, :, :crop], step, audio_cfg)
    _add_griffin_lim(writer, "audio/teacher_forced_griffin_lim", outputs["mel_postnet"][0, :, :crop], step,
                     audio_cfg)
    speaker = batch["speaker"][:1] if "speaker" in batch else None
    _add_griffin_lim(writer, "audio/free_running_griffin_lim", free_running_mel(model, text, max_frames, speaker),
                     step, audio_cfg)


def dynamic_range_decompression(x: torch.Tensor, C: float = 1.0) -> torch.Tensor:
    """Undo ``utils.data.audio.dynamic_range_compression`` (any shape): ``exp(x) / C``; values below the floor stay at the floor.
    NVIDIA Tacotron2 reference (``audio_processing.dynamic_range_decompression``)."""
    return torch.exp(x) / C


def griffin_lim(log_mel: ArrayLike, audio_cfg: AudioConfig, n_iter: int = 60, seed: Optional[int] = 0) -> np.ndarray:
    """Rough waveform from a log-mel ``(n_mels, frames)`` (tensor on any device, or array) made with ``audio_cfg``, for
    listening checks without a vocoder: float32 ``(samples,)`` at ``audio_cfg.sampling_rate`` Hz, about ``frames *
    hop_length`` samples, not clipped.

    What ``librosa.feature.inverse.mel_to_audio`` does: ``exp``, ``mel_to_stft`` (magnitudes, the Slaney filters of
    :class:`utils.data.audio.MelSpectrogram`), ``n_iter`` iterations of ``librosa.griffinlim``, with the initial phases drawn from
    ``seed`` so the same mel gives the same audio (``None``: a fresh draw each call).

    Raises:
        ValueError: ``log_mel`` is not ``(n_mels, frames)``, holds NaN/inf, or ``n_iter`` < 1.
    """
    if isinstance(log_mel, torch.Tensor):
        log_mel = log_mel.detach().cpu().float().numpy()
    log_mel = np.asarray(log_mel, dtype=np.float32)
    if log_mel.ndim != 2 or log_mel.shape[0] != audio_cfg.n_mels:
        raise ValueError(f"griffin_lim expects a log-mel of shape (n_mels={audio_cfg.n_mels}, frames), "
                         f"got {log_mel.shape}")
    if not np.isfinite(log_mel).all():
        raise ValueError("griffin_lim: the log-mel holds NaN or infinite values")
    if n_iter < 1:
        raise ValueError(f"griffin_lim: n_iter must be >= 1, got {n_iter}")
    mel = dynamic_range_decompression(torch.from_numpy(log_mel)).numpy()
    magnitude = librosa.feature.inverse.mel_to_stft(mel, sr=audio_cfg.sampling_rate, n_fft=audio_cfg.n_fft, power=1.0,
                                                    fmin=audio_cfg.fmin, fmax=audio_cfg.fmax, htk=False)
    # the seed's keyword: random_state until librosa 1.0 renamed it rng
    seed_key = "rng" if "rng" in inspect.signature(librosa.griffinlim).parameters else "random_state"
    audio = librosa.griffinlim(magnitude, n_iter=n_iter, hop_length=audio_cfg.hop_length, n_fft=audio_cfg.n_fft,
                               win_length=audio_cfg.win_length, window="hann", **{seed_key: seed})
    return audio.astype(np.float32)


def griffin_lim_clip(log_mel: torch.Tensor, audio_cfg: AudioConfig,
                     n_iter: int = LOG_GRIFFIN_LIM_ITERS) -> torch.Tensor:
    """A log-mel ``(n_mels, frames)`` made audible: ``(frames * hop_length,)`` float32 samples on the CPU at
    ``audio_cfg.sampling_rate`` Hz, clipped to [-1, 1].

    :func:`griffin_lim` gives ``(frames - 1) * hop_length`` samples (librosa's frames are centred); the
    last hop is filled with zeros so that the clip lasts as long as the mel. A mel too short to fill one STFT window
    that way (``(frames - 1) * hop_length < n_fft``) gives silence.

    Raises:
        ValueError: see :func:`griffin_lim` (wrong shape, NaN or inf).
    """
    samples = log_mel.shape[1] * audio_cfg.hop_length
    if (log_mel.shape[1] - 1) * audio_cfg.hop_length < audio_cfg.n_fft:
        return torch.zeros(samples)
    audio = torch.from_numpy(griffin_lim(log_mel, audio_cfg, n_iter)).clamp(-1.0, 1.0)
    return F.pad(audio, (0, max(0, samples - audio.numel())))[:samples]


def free_running_mel(model: Tacotron2, text: torch.Tensor, max_frames: int,
                     speaker: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The post-net mel ``(n_mels, T)`` that :meth:`Tacotron2.inference` makes of symbol ids ``text`` ``(L,)`` (in the
    voice of ``speaker`` ``(1,)`` long, a multi-speaker model's), cut at
    ``T <= max_frames`` frames (without the usual warning), under :func:`utils.plotting.fixed_random_state`: the
    pre-net's dropout draws the same masks at every call, and the run's random stream is left as it was."""
    decoder = model.decoder
    limit = decoder.max_decoder_steps
    decoder.max_decoder_steps = min(limit, max_frames)
    try:
        with fixed_random_state(text.device), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tacotron2 decoder reached max_decoder_steps")
            mel = model.inference(text.unsqueeze(0), speaker=speaker)[0][0]
    finally:
        decoder.max_decoder_steps = limit
    return mel.float()


def _add_griffin_lim(writer: Any, tag: str, log_mel: torch.Tensor, step: int, audio_cfg: AudioConfig) -> None:
    """Add :func:`griffin_lim_clip` of ``log_mel`` ``(n_mels, frames)`` to TensorBoard as ``tag``; a mel with NaN or
    inf (a diverged model) is left out with a warning."""
    if not torch.isfinite(log_mel).all():
        warnings.warn(f"step {step}: the mel of '{tag}' holds NaN or infinite values; no audio")
        return
    add_audio(writer, tag, griffin_lim_clip(log_mel, audio_cfg), step, audio_cfg.sampling_rate)


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """Tacotron2's ``inference.py`` options: the text (``inference.py`` adds ``--vocoder`` where the project registers a
    vocoder: ``Inference.takes_vocoder``)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", help="the sentence to speak")
    source.add_argument("--text-file", help="a UTF-8 file of sentences, one wav per line (--output: a folder)")
    parser.add_argument("--speaker", help="the voice: a speaker's name in the run's speakers.json (a multi-speaker "
                                          "model needs one)")


def speaker_index(model: Tacotron2, cfg: Config, args: argparse.Namespace) -> Optional[torch.Tensor]:
    """``--speaker``'s index in the checkpoint's map (``data.speakers``) as a ``(1,)`` long tensor, ``None`` for a
    model without a speaker embedding (where ``--speaker``, if given, must be its one speaker).

    Raises:
        ValueError: a multi-speaker model without ``--speaker``, or a name not in the map (a few of its names said).
    """
    index = chosen_index(cfg.data.speakers, getattr(args, "speaker", None), args.checkpoint, model.speaker_embedding is None)
    return None if index is None else torch.tensor([index], dtype=torch.long)


def read_lines(args: argparse.Namespace) -> tuple[list[str], list[Path]]:
    """The sentences to speak and the wav each goes to (``--text`` -> ``--output``; ``--text-file`` -> one wav a line in
    the folder ``--output``).

    Raises:
        ValueError: no text given, an empty ``--text``, or an output that is not a .wav path / is a file.
        DataError: a ``--text-file`` that is missing, not UTF-8 or holds no text.
    """
    if args.text is None and args.text_file is None:
        raise ValueError(f"{args.checkpoint} is a Tacotron2 checkpoint: give --text or --text-file")
    if args.text is not None:
        if not args.text.strip():
            raise ValueError("--text is empty: give the sentence to speak")
        return [args.text], [check_wav_output(args.output)]
    path = Path(args.text_file)
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise DataError(f"--text-file {path}: no such file") from None
    except UnicodeDecodeError as err:
        raise DataError(f"--text-file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise DataError(f"--text-file {path}: cannot read it: {err.strerror or err}") from None
    if not lines:
        raise DataError(f"--text-file {path} has no text")
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--output {out_dir} is a file; with --text-file it is the folder the wavs go to")
    return lines, [out_dir / f"line_{i:03d}.wav" for i in range(1, len(lines) + 1)]


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for Tacotron2: each text -> mel -> audio (by the ``--vocoder`` checkpoint, or Griffin-Lim) -> wav.

    Raises:
        ValueError, DataError: see :func:`read_lines` and :func:`speaker_index`; a text with no character the model
            knows.
    """
    speaker = speaker_index(model, cfg, args)
    speaker = speaker.to(device) if speaker is not None else None
    lines, outputs = read_lines(args)
    vocode = args.load_vocoder(args.vocoder) if getattr(args, "vocoder", None) else None
    for text, out in zip(lines, outputs):
        ids = torch.tensor(text_to_sequence(text, cfg.tacotron2.text_cleaners), dtype=torch.long)
        if ids.numel() == 0:
            raise DataError(f"text {text!r} has no character the model knows")
        # a bar on a terminal only: in a pipe its redraws would share lines with the warnings and "wrote" lines
        mel = model.inference(ids.unsqueeze(0).to(device), progress=sys.stderr.isatty(), speaker=speaker)[0][0]
        mel = mel.float().cpu()
        audio = vocode(mel) if vocode is not None else griffin_lim_clip(mel, cfg.audio, n_iter=60)
        save_wav(out, audio, cfg.audio.sampling_rate)
        print(f"wrote {out} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return outputs
