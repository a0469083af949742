"""Matcha-TTS at inference: text -> phoneme ids -> mel by ``n_timesteps`` Euler steps from seeded noise -> wav (a
``--vocoder`` checkpoint, or Griffin-Lim)."""

from __future__ import annotations

import argparse
import inspect
import warnings
from pathlib import Path
from typing import Optional

import librosa
import numpy as np
import torch
from torch import nn

from models.matcha.network import MatchaTTS
from models.matcha.text import PhonemizerMissing, text_to_ids, versions
from utils.config import Config
from utils.data.audio import AudioConfig, check_wav_output, save_wav
from utils.data.speakers import chosen_index


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """Matcha-TTS's ``inference.py`` options (``inference.py`` adds ``--vocoder`` where the project registers one)."""
    parser.add_argument("--text", help="the sentence to speak")
    parser.add_argument("--speaker", help="the voice: a speaker's name in the run's speakers.json (a multi-speaker "
                                          "model needs one)")
    parser.add_argument("--n-timesteps", type=int, help="Euler steps of the decoder (default: matcha.n_timesteps)")
    parser.add_argument("--temperature", type=float, help="the noise's scale (default: matcha.temperature)")
    parser.add_argument("--length-scale", type=float, help="durations times this (default: matcha.length_scale)")


def speaker_index(model: MatchaTTS, cfg: Config, args: argparse.Namespace) -> Optional[torch.Tensor]:
    """``--speaker``'s index in the checkpoint's map (``data.speakers``) as a ``(1,)`` long tensor; ``None`` for a
    one-speaker model (where ``--speaker``, if given, must be its speaker).

    Raises:
        ValueError: a multi-speaker model without ``--speaker``, or a name not in the map (a few of its names said).
    """
    index = chosen_index(cfg.data.speakers, args.speaker, args.checkpoint, model.speakers is None)
    return None if index is None else torch.tensor([index], dtype=torch.long)


def settings(cfg: Config, args: argparse.Namespace) -> tuple[int, float, float]:
    """``(n_timesteps, temperature, length_scale)``: the options given, else the checkpoint's ``matcha`` section.

    Raises:
        ValueError: ``--n-timesteps`` under 1, a negative ``--temperature``, a ``--length-scale`` not above 0; a
            checkpoint that records no ``matcha.mel_mean`` or ``mel_std`` (the mels' scale is unknown).
    """
    section = cfg.matcha
    if section.mel_mean is None or section.mel_std is None:
        raise ValueError(f"{args.checkpoint} records no matcha.mel_mean or mel_std (a training run sets them): the "
                         "scale of its mels is unknown")
    steps = section.n_timesteps if args.n_timesteps is None else args.n_timesteps
    temperature = section.temperature if args.temperature is None else args.temperature
    scale = section.length_scale if args.length_scale is None else args.length_scale
    if steps < 1:
        raise ValueError(f"--n-timesteps {steps}: the decoder needs at least 1 Euler step (the authors use 10)")
    if temperature < 0 or not scale > 0:
        raise ValueError(f"--temperature {temperature} must be >= 0 and --length-scale {scale} > 0")
    return steps, temperature, scale


def griffin_lim(log_mel: torch.Tensor, audio_cfg: AudioConfig, seed: int, n_iter: int = 60) -> torch.Tensor:
    """A rough waveform ``(samples,)`` float32 in [-1, 1] of a log-mel ``(n_mels, frames)`` made with ``audio_cfg``,
    without a vocoder: ``exp``, magnitudes by ``librosa.feature.inverse.mel_to_stft`` (the Slaney filters), ``n_iter``
    iterations of ``librosa.griffinlim`` from random phases drawn from ``seed``."""
    magnitude = librosa.feature.inverse.mel_to_stft(np.exp(log_mel.double().numpy()), sr=audio_cfg.sampling_rate,
                                                    n_fft=audio_cfg.n_fft, power=1.0, fmin=audio_cfg.fmin,
                                                    fmax=audio_cfg.fmax, htk=False)
    # the seed's keyword: random_state until librosa 1.0 renamed it rng
    seed_key = "rng" if "rng" in inspect.signature(librosa.griffinlim).parameters else "random_state"
    audio = librosa.griffinlim(magnitude, n_iter=n_iter, hop_length=audio_cfg.hop_length, n_fft=audio_cfg.n_fft,
                               win_length=audio_cfg.win_length, window="hann", **{seed_key: seed})
    return torch.from_numpy(audio.astype(np.float32)).clamp(-1.0, 1.0)


def synthesise(model: MatchaTTS, cfg: Config, text: str, speaker: Optional[torch.Tensor],
               how: tuple[int, float, float]) -> torch.Tensor:
    """The log-mel ``(n_mels, frames)`` on the CPU of ``text`` in the voice ``speaker`` (``(1,)`` long or None), with
    ``how`` = ``(n_timesteps, temperature, length_scale)``; the noise from torch's seeded global stream. Warns (one
    line) where the checkpoint records other phonemizer or espeak-ng versions than these.

    Raises:
        ValueError: the text phonemizes to nothing, or no phonemizer (what to install).
    """
    try:
        ids = torch.tensor([text_to_ids(text)], dtype=torch.long)
    except PhonemizerMissing as err:
        raise ValueError(str(err)) from None
    recorded, found = (cfg.matcha.phonemizer, cfg.matcha.espeak_ng), tuple(versions().values())
    if recorded != (None, None) and recorded != found:
        warnings.warn(f"the model was trained on the phonemes of phonemizer {recorded[0]} and espeak-ng {recorded[1]}, "
                      f"these are of {found[0]} and {found[1]}: they may differ", stacklevel=2)
    device = next(model.parameters()).device
    steps, temperature, scale = how
    speaker = None if speaker is None else speaker.to(device)
    out = model.synthesise(ids.to(device), torch.tensor([ids.shape[1]], device=device), steps, temperature, speaker,
                           scale)
    mel = out["decoder_out"][0, :, :int(out["mel_lengths"][0])].float().cpu()
    return mel * cfg.matcha.mel_std + cfg.matcha.mel_mean


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for Matcha-TTS: ``--text`` -> mel -> audio (the ``--vocoder`` checkpoint's, or Griffin-Lim)
    -> the wav ``--output``.

    Raises:
        ValueError: no or empty ``--text``, see :func:`speaker_index`, :func:`settings` and :func:`synthesise`.
        CheckpointError: the ``--vocoder`` checkpoint's (``args.load_vocoder``: no vocoder, other audio settings).
    """
    if args.text is None or not args.text.strip():
        raise ValueError(f"{args.checkpoint} is a Matcha-TTS checkpoint: give --text, the sentence to speak")
    how = settings(cfg, args)
    speaker = speaker_index(model, cfg, args)
    output = check_wav_output(args.output)
    vocode = args.load_vocoder(args.vocoder) if getattr(args, "vocoder", None) else None
    mel = synthesise(model.eval(), cfg, args.text, speaker, how)
    audio = vocode(mel) if vocode is not None else griffin_lim(mel, cfg.audio, args.seed)
    save_wav(output, audio, cfg.audio.sampling_rate)
    print(f"wrote {output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]
