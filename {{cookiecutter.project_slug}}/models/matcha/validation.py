"""Matcha-TTS's validation media for TensorBoard and the trackers: the mel the sampler makes of the first utterance's
text beside its target, the monotonic alignment search's path, and audio (a vocoder checkpoint's,
``matcha.val_vocoder``, else Griffin-Lim's). Figures are plain :class:`matplotlib.figure.Figure` objects on the Agg
canvas: no GUI backend, no pyplot state."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from model import Batch, Vocoder
from models.matcha.inference import griffin_lim
from utils.config import Config
from utils.data.audio import AudioConfig
from utils.plotting import add_audio, first_time, fixed_random_state, to_numpy

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn: importing it costs ~1 s per process
    from matplotlib.figure import Figure

GRIFFIN_LIM_ITERS = 32
"""Griffin-Lim iterations of the validation clips: enough to hear the words, far from a vocoder's quality."""


def _figure(size: tuple[float, float], rows: int) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    figure.subplots(rows, 1, squeeze=False)
    return figure


def plot_mels(target: torch.Tensor, synthesised: torch.Tensor, title: str = "") -> Figure:
    """Two log-mel images ``(n_mels, frames)`` one above the other on one colour scale, low bands at the bottom: the
    ``target`` and what the sampler made of the same text (``synthesised``: its own number of frames).

    Raises:
        ValueError: either is not 2-D.
    """
    mels = [to_numpy(target, 2, "target mel"), to_numpy(synthesised, 2, "synthesised mel")]
    low, high = min(mel.min() for mel in mels), max(mel.max() for mel in mels)
    figure = _figure((8, 5), 2)
    for axes, mel, name in zip(figure.axes, mels, ("target", "synthesised")):
        image = axes.imshow(mel, aspect="auto", origin="lower", interpolation="none", vmin=low, vmax=high)
        axes.set_title(f"{title}: {name}" if title else name)
        axes.set_ylabel("mel channel")
        figure.colorbar(image, ax=axes)
    figure.axes[1].set_xlabel("frame")
    figure.tight_layout()
    return figure


def plot_alignment(path: torch.Tensor, title: str = "") -> Figure:
    """The 0/1 alignment ``(tokens, frames)`` of text to frames (the monotonic alignment search's path): tokens up,
    frames across.

    Raises:
        ValueError: ``path`` is not 2-D.
    """
    figure = _figure((6, 4), 1)
    axes = figure.axes[0]
    axes.imshow(to_numpy(path, 2, "alignment"), aspect="auto", origin="lower", interpolation="none")
    axes.set_xlabel("frame")
    axes.set_ylabel("token")
    if title:
        axes.set_title(title)
    figure.tight_layout()
    return figure


def clip(log_mel: torch.Tensor, audio_cfg: AudioConfig) -> torch.Tensor:
    """Griffin-Lim's audio ``(frames * hop_length,)`` of a log-mel ``(n_mels, frames)`` on the CPU, padded with zeros
    to the mel's length; silence for a mel shorter than an STFT window (``(frames - 1) * hop_length < n_fft``)."""
    samples = log_mel.shape[1] * audio_cfg.hop_length
    if (log_mel.shape[1] - 1) * audio_cfg.hop_length < audio_cfg.n_fft:
        return torch.zeros(samples)
    audio = griffin_lim(log_mel.float().cpu(), audio_cfg, seed=0, n_iter=GRIFFIN_LIM_ITERS)
    return F.pad(audio, (0, max(0, samples - audio.numel())))[:samples]


def synthesised_mel(model: nn.Module, batch: Batch, cfg: Config) -> torch.Tensor:
    """The normalised mel ``(n_mels, frames)`` the sampler makes of the first item's text (and speaker):
    ``matcha.n_timesteps`` Euler steps from noise times ``matcha.temperature``, durations times
    ``matcha.length_scale``, under :func:`utils.plotting.fixed_random_state` (the same noise at every validation, the
    run's random stream left as it was)."""
    length = batch["text_lengths"][:1]
    speaker = batch["speaker"][:1] if "speaker" in batch else None
    section = cfg.matcha
    with fixed_random_state(length.device):
        out = model.synthesise(batch["text"][:1, :int(length[0])], length, section.n_timesteps, section.temperature,
                               speaker, section.length_scale)
    return out["decoder_out"][0, :, :int(out["mel_lengths"][0])].float()


def log_validation(model: nn.Module, batch: Batch, outputs: dict[str, torch.Tensor], step: int, writer: Any,
                   output_dir: Any, cfg: Optional[Config] = None, vocoder: Optional[Vocoder] = None) -> None:
    """Pictures and audio of the first utterance of a validation batch (the loader does not shuffle: the same one at
    every validation), padding cut off. ``batch``: :class:`models.matcha.data.MatchaCollate`'s; ``outputs``: the
    unwrapped ``model``'s (in eval mode, the EMA's weights where the run keeps them) for it, ``{"attn": (B, T_text,
    T), ...}``. Always saves ``output_dir/alignment_<step>.png``; with a ``writer`` (TensorBoard, or the trackers'
    fan-out) and the run's ``cfg`` also adds the figures ``alignment`` (the MAS path) and ``mel`` (the target above,
    :func:`synthesised_mel` below, both de-normalised to log-mels), and the audio of at most
    ``matcha.val_audio_seconds`` of each (0: none) at ``audio.sampling_rate`` Hz, made by ``vocoder`` (the run's
    ``matcha.val_vocoder``, loaded at its start) or else Griffin-Lim (:func:`clip`), whose name ends each tag:
    ``audio/synthesised_<name>`` (``audio/synthesised_hifigan``, ``audio/synthesised_griffin_lim``), and at the run's
    first validation ``audio/target_<name>`` and the text ``audio/utterance`` (its id)."""
    text_len, frames = int(batch["text_lengths"][0]), int(batch["mel_lengths"][0])
    utt = batch["ids"][0] if "ids" in batch else "utterance 0"
    figure = plot_alignment(outputs["attn"][0, :text_len, :frames].float(), f"{utt}, step {step}")
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    figure.savefig(Path(output_dir) / f"alignment_{step}.png", format="png")
    if writer is None or cfg is None:
        return
    writer.add_figure("alignment", figure, step)
    mean, std = cfg.matcha.mel_mean or 0.0, cfg.matcha.mel_std or 1.0
    target = batch["mel"][0, :, :frames].float() * std + mean
    synthesised = synthesised_mel(model, batch, cfg) * std + mean
    writer.add_figure("mel", plot_mels(target, synthesised, f"{utt}, step {step}"), step)
    audio_cfg, seconds = cfg.audio, cfg.matcha.val_audio_seconds
    if seconds == 0:
        return
    crop = max(2, int(seconds * audio_cfg.sampling_rate / audio_cfg.hop_length))
    name, make = (vocoder.name, vocoder.vocode) if vocoder is not None else \
        ("griffin_lim", lambda mel: clip(mel, audio_cfg))
    if first_time(writer, f"audio/target_{name}"):
        writer.add_text("audio/utterance", str(utt), step)
        add_audio(writer, f"audio/target_{name}", make(target[:, :crop]), step, audio_cfg.sampling_rate)
    if not torch.isfinite(synthesised).all():  # a diverged model
        warnings.warn(f"step {step}: the synthesised mel holds NaN or infinite values; no audio")
        return
    add_audio(writer, f"audio/synthesised_{name}", make(synthesised[:, :crop]), step, audio_cfg.sampling_rate)
