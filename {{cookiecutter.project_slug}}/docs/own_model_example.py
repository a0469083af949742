"""A complete model file to start your own from: ``melae``, a mel-spectrogram autoencoder with one loss.

Copy it into ``models/``, list it in ``models/__init__.py`` (two lines: ``from models import melae`` and ``melae.SPEC,``
in the registry's list) and it trains like the example models (this ``docs/`` copy is never imported)::

    cp docs/own_model_example.py models/melae.py
    python multiproc.py train.py --config config.json --model melae --tiny --dataset-path data/demo --max-steps 50
    python inference.py --checkpoint output/checkpoint_last.pt --wav data/demo/wavs/LJ_DEMO_0001.wav --output recon.pt

For a model of your own, rename the file, the ``melae`` section and the classes, and change the network, the
loss and the data. What each part is for:

* :class:`MelAEConfig`: the ``melae`` section of ``config.json``. The section is optional (a key left out takes
  its default here); ``batch_size`` is a required field of every model's section; ``Field`` declares bounds,
  checked when the config loads; ``Optional[...]`` accepts ``null`` in JSON and ``--set melae.dropout=null``.
  The learning rate and weight decay are the shared ``optimizer`` section's (``optimizer.lr``, ...).
* :class:`MelAE`: the network; ``forward(batch)`` takes the batch dict the collate function makes.
* :func:`reconstruction_loss`: ``criterion(outputs, batch) -> scalar``, the one loss the loop minimises. A loss of
  several terms may return ``(loss, {"name": term, ...})`` (scalar tensors): each term is then logged beside the loss
  (``losses`` of ``metrics.jsonl`` and ``val_metrics.jsonl``, TensorBoard's ``train/<name>`` and ``val/<name>``).
* :func:`build_datasets`: ``(train, val)`` datasets over the corpus (any layout ``data.format`` reads); their items are batched by
  ``collate_audio_mel`` into ``{"mel": (B, n_mels, frames), "audio": (B, samples), "ids": [str] * B}``.
* :func:`add_inference_args` and :func:`infer`: ``inference.py``'s options and work (the optional ``Inference``).
* ``SPEC = ModelSpec(...)`` at the end: the model's name (``--model melae``), everything above and its ``recipe``:
  the values it takes where ``config.json`` leaves a shared setting null (its learning rate where ``optimizer.lr``
  is null; the project's defaults for the rest).

Optional parts it leaves out, each skipped with a line saying so where it would be used: of ``Training`` (see
``model.py``), a fast path, ``log_validation``, ``build_optimizer`` (Adam otherwise); what the optional parts' tools
need of a model, registered in ``parts.py``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch
from pydantic import Field
from torch import nn

from model import Inference, ModelSpec, Training
from utils.config import Config, ModelSection
from utils.data.corpora import load_splits
from utils.data.datasets import AudioMelDataset, Crop, collate_audio_mel, read_mel


class MelAEConfig(ModelSection):
    """The ``melae`` section of ``config.json``.

    ``hidden``: channels of the two hidden convolutions; ``bottleneck``: channels of the code between
    encoder and decoder (fewer than ``audio.n_mels``, or the model learns a copy); ``dropout``: probability
    (0 to 1) after the encoder's first layer, ``None`` for none; ``segment_frames``: training crops in mel
    frames (``audio.hop_length`` samples each); ``batch_size``: crops per process and step.
    """

    hidden: int = Field(32, ge=1)
    bottleneck: int = Field(8, ge=1)
    dropout: Optional[float] = Field(None, ge=0, lt=1)
    segment_frames: int = Field(24, ge=4)
    batch_size: int = Field(4, ge=1)


class MelAE(nn.Module):
    """Log-mel ``(B, n_mels, T)`` -> code ``(B, bottleneck, T)`` -> log-mel ``(B, n_mels, T)``.

    Kernel-3 and kernel-1 convolutions along time, ``tanh`` between them; the decoder's output is added to
    the input's mean over mels and frames (one number per item), so the network learns only the shape.
    """

    def __init__(self, cfg: MelAEConfig, n_mels: int):
        super().__init__()
        self.encode = nn.Sequential(
            nn.Conv1d(n_mels, cfg.hidden, kernel_size=3, padding=1), nn.Tanh(), nn.Dropout(cfg.dropout or 0.0),
            nn.Conv1d(cfg.hidden, cfg.bottleneck, kernel_size=1))
        self.decode = nn.Sequential(
            nn.Conv1d(cfg.bottleneck, cfg.hidden, kernel_size=1), nn.Tanh(),
            nn.Conv1d(cfg.hidden, n_mels, kernel_size=3, padding=1))

    def forward(self, batch: dict) -> torch.Tensor:
        """The reconstruction of ``batch["mel"]`` ``(B, n_mels, T)``, same shape."""
        mel = batch["mel"]
        level = mel.mean(dim=(1, 2), keepdim=True)
        return self.decode(self.encode(mel)) + level


def reconstruction_loss(outputs: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean squared difference, in float32, between the reconstruction and ``batch["mel"]`` (log-mel units squared)."""
    return torch.mean((outputs.float() - batch["mel"].float()) ** 2)


def build_datasets(cfg: Config) -> tuple[AudioMelDataset, AudioMelDataset]:
    """Training and validation sets of ``cfg.data``'s corpus.

    Training items are random crops of ``melae.segment_frames * audio.hop_length`` samples (a new crop each
    epoch, seeded by ``train.seed``); validation items are the first crop of each clip, the same every time.
    """
    train_utts, val_utts = load_splits(cfg.data)
    crop_samples = cfg.melae.segment_frames * cfg.audio.hop_length
    train = AudioMelDataset(train_utts, cfg.audio, Crop(crop_samples, seed=cfg.train.seed))
    val = AudioMelDataset(val_utts, cfg.audio, Crop(crop_samples, random=False))
    return train, val


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """``inference.py``'s option for this model: the wav to reconstruct."""
    parser.add_argument("--wav", help="wav file whose log-mel is encoded and decoded")


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """Encode and decode the log-mel of ``--wav``; ``torch.save`` the ``(n_mels, frames)`` result to ``--output``.

    Raises:
        ValueError: no ``--wav`` was given.
        DataError: the wav cannot be read or is too short for one STFT frame (``MelSpectrogram.min_samples``).
    """
    if not args.wav:
        raise ValueError("melae needs --wav FILE: the wav to reconstruct")
    with torch.no_grad():
        mel = read_mel(args, cfg).unsqueeze(0).to(device)  # the project's own --wav -> log-mel, with its checks
        reconstruction = model({"mel": mel})[0].cpu()
    output = Path(args.output)
    torch.save(reconstruction, output)
    print(f"wrote {output}: mel {tuple(reconstruction.shape)}")
    return [output]


SPEC = ModelSpec(
    name="melae",                                                 # --model melae; the "melae" section of config.json
    config_cls=MelAEConfig,
    build_model=lambda cfg: MelAE(cfg.melae, cfg.audio.n_mels),
    training=Training(
        build_criterion=lambda cfg: reconstruction_loss,
        build_datasets=build_datasets,
        collate_fn=collate_audio_mel,
        count_items=lambda batch: batch["mel"].shape[0] * batch["mel"].shape[2]),   # mel frames, for items/s
    inference=Inference(infer=infer, add_args=add_inference_args),  # optional: inference.py's work and options
    recipe={"optimizer.lr": 3e-3},                                # optional: its rate where optimizer.lr is null
)
