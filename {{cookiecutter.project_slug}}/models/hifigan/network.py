"""HiFi-GAN's config section, networks, losses and the two-phase training step (discriminator, then generator), with
its optimizers and per-epoch learning-rate decay.

Source: Kong, Kim and Bae, "HiFi-GAN" (NeurIPS 2020), and jik876/hifi-gan for sizes and defaults.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from model import Batch
from modules.hifigan import (Discriminator, Generator, discriminator_loss, feature_matching_loss,
                             generator_adversarial_loss)
from utils.config import Config, ModelSection
from utils.data.audio import AudioConfig, MelSpectrogram

PHASES = ("discriminator", "generator")
"""Optimizer names in update order: the discriminator learns from the current generator first."""

Size = Annotated[int, Field(ge=1)]
"""An item of the section's tuples of sizes, rates and widths: at least 1."""
Beta = Annotated[float, Field(ge=0, lt=1)]
"""An Adam beta: in [0, 1)."""


class HiFiGANConfig(ModelSection):
    """The ``hifigan`` section of ``config.json`` (defaults: the paper's V1 and training set-up). Generator (Section
    2.2, Appendix A): ``upsample_rates`` and ``upsample_kernel_sizes`` of the transposed convolutions (the rates'
    product must be ``audio.hop_length``), ``upsample_initial_channel`` (``h_u``), ``resblock`` type (1: V1/V2, 2: V3),
    ``resblock_kernel_sizes`` (``k_r``) and ``resblock_dilation_sizes`` (``D_r``) of the MRF blocks. Discriminators
    (Section 2.3): ``mpd_periods``, ``mpd_channels`` (a period discriminator's 5 widths), ``msd_scales``,
    ``msd_channels`` (a scale discriminator's 7 widths; smaller ones make CPU runs fast). ``segment_length``: training
    crop in samples, a multiple of ``audio.hop_length``; ``batch_size`` per process. AdamW for both networks at
    ``optimizer.lr`` and ``optimizer.weight_decay`` (null: the paper's 2e-4 and 0.01) with ``adam_betas``, the rate
    multiplied by ``lr_decay`` after every epoch (its own schedule: ``optimizer.schedule`` is refused). Generator loss
    weights (Eq. 5): ``feature_loss_weight`` (``lambda_fm``), ``mel_loss_weight`` (``lambda_mel``); ``loss_fmax``: the
    mel loss's top band edge in Hz (None: ``sampling_rate / 2``, jik876's ``fmax_for_loss``). ``peak_normalize``: each
    clip scaled to this peak before cropping (jik876's ``normalize(audio) * 0.95``; 0: as read; never with
    ``data.mel_dir``, as jik876's fine-tuning). ``mel_on_device``: the workers only decode and crop the audio; the
    batch's mels are computed on the device in the step.
    """

    upsample_rates: tuple[Size, ...] = (8, 8, 2, 2)
    upsample_kernel_sizes: tuple[Size, ...] = (16, 16, 4, 4)
    upsample_initial_channel: int = Field(512, ge=1)
    resblock: Literal[1, 2] = 1
    resblock_kernel_sizes: tuple[Size, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[Size, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    mpd_periods: tuple[Size, ...] = (2, 3, 5, 7, 11)
    mpd_channels: tuple[Size, Size, Size, Size, Size] = (32, 128, 512, 1024, 1024)
    msd_scales: int = Field(3, ge=1)
    msd_channels: tuple[Size, Size, Size, Size, Size, Size, Size] = (128, 128, 256, 512, 1024, 1024, 1024)
    segment_length: int = Field(8192, ge=1)
    batch_size: int = Field(16, ge=1)
    adam_betas: tuple[Beta, Beta] = (0.8, 0.99)
    lr_decay: float = Field(0.999, gt=0, le=1)
    mel_loss_weight: float = Field(45.0, ge=0)
    feature_loss_weight: float = Field(2.0, ge=0)
    loss_fmax: Optional[float] = Field(None, gt=0)
    peak_normalize: float = Field(0.95, ge=0, le=1)
    mel_on_device: bool = False


TINY_OVERRIDES: dict[str, Any] = {
    "upsample_initial_channel": 32, "resblock_kernel_sizes": [3, 7], "resblock_dilation_sizes": [[1, 3], [1, 3]],
    "mpd_channels": [4, 8, 16, 32, 32], "msd_channels": [16, 16, 16, 32, 32, 32, 32], "segment_length": 2048,
    "batch_size": 2}
"""The ``hifigan`` entry of ``config.json``'s ``tiny`` block (JSON values, as the file holds them)."""


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """What :func:`train_step` needs besides the networks: the mel front end's settings and the loss weights."""

    audio: AudioConfig
    mel_loss_weight: float
    feature_loss_weight: float


class HiFiGAN(nn.Module):
    """HiFi-GAN: ``generator`` (mel -> audio) and ``discriminator`` (the MPD and the MSD in one module), built from a
    :class:`HiFiGANConfig` and the ``audio`` section (``n_mels``, ``hop_length``, the losses' mel front end).

    Raises:
        ValueError: settings the layers refuse (:class:`modules.hifigan.Generator`,
            :class:`modules.hifigan.Discriminator`), upsampling rates whose product is not ``audio.hop_length``, or a
            ``segment_length`` that is not a multiple of it.
    """

    def __init__(self, cfg: HiFiGANConfig, audio_cfg: AudioConfig):
        super().__init__()
        hop = math.prod(cfg.upsample_rates)
        if hop != audio_cfg.hop_length:
            raise ValueError(f"hifigan.upsample_rates {list(cfg.upsample_rates)} upsample by {hop}; their product must "
                             f"be audio.hop_length ({audio_cfg.hop_length})")
        if cfg.segment_length % audio_cfg.hop_length:
            raise ValueError(f"hifigan.segment_length ({cfg.segment_length}) must be a multiple of audio.hop_length "
                             f"({audio_cfg.hop_length})")
        if not audio_cfg.fmin < (cfg.loss_fmax or audio_cfg.fmax) <= audio_cfg.sampling_rate / 2:
            raise ValueError(f"hifigan.loss_fmax ({cfg.loss_fmax} Hz) must lie above audio.fmin ({audio_cfg.fmin}) and "
                             f"at most at audio.sampling_rate / 2 ({audio_cfg.sampling_rate / 2})")
        self.cfg = cfg
        self.generator = Generator(audio_cfg.n_mels, cfg.upsample_rates, cfg.upsample_kernel_sizes,
                                   cfg.upsample_initial_channel, cfg.resblock_kernel_sizes,
                                   cfg.resblock_dilation_sizes, cfg.resblock)
        self.discriminator = Discriminator(cfg.mpd_periods, cfg.mpd_channels, cfg.msd_scales, cfg.msd_channels)
        # train_step sees only the networks, so its loss settings travel with the generator (a plain attribute: nothing
        # in the state dict).
        self.generator.loss_settings = LossSettings(loss_audio(cfg, audio_cfg), cfg.mel_loss_weight,
                                                    cfg.feature_loss_weight)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Vocode ``batch["mel"]`` ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1]."""
        return self.generator(batch["mel"]).squeeze(1)


def networks(model: nn.Module) -> dict[str, nn.Module]:
    """The network each optimizer trains (``ModelSpec.networks``)."""
    return {"discriminator": model.discriminator, "generator": model.generator}


def build_optimizer(model: nn.Module, cfg: Config, device: torch.device) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per network at ``optimizer.lr`` and ``optimizer.weight_decay`` with ``hifigan.adam_betas`` (Section
    3: learning rate 2e-4, weight decay 0.01, betas 0.8/0.99), fused on CUDA."""
    return {name: torch.optim.AdamW(net.parameters(), lr=cfg.optimizer.lr, betas=tuple(cfg.hifigan.adam_betas),
                                    weight_decay=cfg.optimizer.weight_decay, fused=device.type == "cuda")
            for name, net in networks(model).items()}


def build_scheduler(phase: str, optimizer: torch.optim.Optimizer, cfg: Config) -> tuple[Any, str]:
    """The learning rate times ``hifigan.lr_decay`` (0.999) after every epoch, for either network (Section 3)."""
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.hifigan.lr_decay), "epoch"


_MELS: dict = {}  # (device, audio settings) -> MelSpectrogram on that device


def mel_function(audio_cfg: AudioConfig, device: torch.device) -> MelSpectrogram:
    """The project's :class:`MelSpectrogram` for ``audio_cfg``, built once per device."""
    key = (str(device), tuple(audio_cfg.model_dump().values()))
    if key not in _MELS:
        _MELS[key] = MelSpectrogram(audio_cfg).to(device)
    return _MELS[key]


def loss_audio(cfg: HiFiGANConfig, audio_cfg: AudioConfig) -> AudioConfig:
    """The mel loss's front end: ``audio_cfg`` up to ``hifigan.loss_fmax`` Hz (None: the Nyquist frequency)."""
    return audio_cfg.model_copy(update={"fmax": cfg.loss_fmax or audio_cfg.sampling_rate / 2})


def aligned(real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both audio tensors (any shape ending in samples) cut to the shorter one's length: the generator gives ``frames *
    hop_length`` samples, the same number as the crops when ``segment_length`` is a multiple of the hop."""
    n = min(real.shape[-1], fake.shape[-1])
    return real[..., :n], fake[..., :n]


def mel_l1(fake: torch.Tensor, real: torch.Tensor, audio_cfg: AudioConfig) -> torch.Tensor:
    """Mel L1 loss (Eq. 3), unweighted: the mean absolute difference of the log-mels of ``fake`` and ``real`` audio
    ``(B, samples)`` (cut to a common length), in float32 outside autocast. Gradients reach ``fake`` only."""
    real, fake = aligned(real, fake)
    mel = mel_function(audio_cfg, fake.device)
    with torch.autocast(fake.device.type, enabled=False):
        with torch.no_grad():
            target = mel(real.float())
        return F.l1_loss(mel(fake.float()), target)


class MelL1Loss(nn.Module):
    """The validation criterion: ``(generated audio (B, samples), batch) -> mel L1`` against ``batch["audio"]``
    (validation has no discriminator step; the unweighted mel L1, in log-mel units, compares runs)."""

    def __init__(self, audio_cfg: AudioConfig):
        super().__init__()
        self.audio_cfg = audio_cfg

    def forward(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return mel_l1(outputs, batch["audio"], self.audio_cfg)


def train_step(phase: str, nets: dict[str, nn.Module], batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One ``phase`` of the GAN step (``ModelSpec.train_step``; Section 2.4) on ``batch`` ``{"mel": (B, n_mels,
    frames), "audio": (B, samples), ...}``, with ``nets`` ``{"discriminator", "generator"}``: the phase's network may
    be DDP-wrapped, the other is the plain module with frozen parameters. Returns ``(loss, metrics)``: for the
    discriminator, the LSGAN loss of the MPD and MSD on the real audio and on the generator's output (made under
    ``no_grad``), no metrics; for the generator, ``g_adv + feature_loss_weight * g_fm + mel_loss_weight * mel_l1`` and
    ``{"g_adv", "g_fm", "mel_l1"}`` (the terms unweighted, detached).

    Raises:
        ValueError: an unknown phase.
    """
    generator, discriminator = nets["generator"], nets["discriminator"]
    settings: LossSettings = getattr(generator, "module", generator).loss_settings
    mel, real = batch["mel"], batch["audio"].unsqueeze(1)  # real: (B, 1, samples)
    if phase == "discriminator":
        with torch.no_grad():
            fake = generator(mel)
        real, fake = aligned(real, fake)
        scores, _ = discriminator(torch.cat([real, fake.to(real.dtype)]))  # one pass over real and generated
        n = real.shape[0]
        return discriminator_loss([s[:n] for s in scores], [s[n:] for s in scores]), {}
    if phase == "generator":
        real, fake = aligned(real, generator(mel))
        with torch.no_grad():
            _, real_fmaps = discriminator(real)
        fake_scores, fake_fmaps = discriminator(fake)
        g_adv = generator_adversarial_loss(fake_scores)
        g_fm = feature_matching_loss(real_fmaps, fake_fmaps)
        loss_mel = mel_l1(fake.squeeze(1), real.squeeze(1), settings.audio)
        loss = g_adv + settings.feature_loss_weight * g_fm + settings.mel_loss_weight * loss_mel
        return loss, {"g_adv": g_adv.detach(), "g_fm": g_fm.detach(), "mel_l1": loss_mel.detach()}
    raise ValueError(f"hifigan train_step: unknown phase {phase!r}, expected one of {', '.join(PHASES)}")


def blocks(model: HiFiGAN) -> list[nn.Module]:
    """``ModelSpec.blocks``: the generator's MRF blocks, the period discriminators and the scale discriminators but the
    first, whose spectral norm updates a buffer in every training forward (recomputed for activation checkpointing it
    would step twice): it stays with the discriminator's root, never recomputed."""
    return [*model.generator.mrfs, *model.discriminator.mpd.discriminators,
            *model.discriminator.msd.discriminators[1:]]
