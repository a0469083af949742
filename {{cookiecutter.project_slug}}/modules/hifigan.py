"""Building blocks of HiFi-GAN: the generator, the multi-period and multi-scale discriminators, the losses. Source:
Kong, Kim and Bae, "HiFi-GAN: Generative Adversarial Networks for Efficient and High Fidelity Speech Synthesis" (NeurIPS
2020): the generator and its multi-receptive field fusion (MRF) in Section 2.2 and Figure 1, the discriminators in
Section 2.3 and Figure 2, the losses in Section 2.4 (Eqs. 1-6), the V1/V2/V3 settings in Appendix A. Sizes the paper
leaves out (the discriminators' channels, kernels and strides, the generator's convolutions before and after the
upsampling) are those of the authors' implementation. Mels are ``(B, n_mels, frames)``; audio ``(B, 1, samples)`` in
[-1, 1]."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

LRELU_SLOPE = 0.1
"""Negative slope of the leaky ReLUs inside the networks (Section 2.2)."""

FINAL_LRELU_SLOPE = 0.01
"""Slope of the generator's last activation: PyTorch's default, which the authors' implementation uses there (trained
weights expect it)."""


def same_padding(kernel_size: int, dilation: int = 1) -> int:
    """Padding that keeps a stride-1 convolution's length: ``dilation * (kernel_size - 1) // 2``."""
    return dilation * (kernel_size - 1) // 2


def _dilated_convs(channels: int, kernel_size: int, dilations: Sequence[int]) -> nn.ModuleList:
    return nn.ModuleList(
        weight_norm(nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=same_padding(kernel_size, d)))
        for d in dilations)


class ResBlock1(nn.Module):
    """An MRF residual block of type 1 (V1, V2; Figure 1), ``(B, channels, T) -> (B, channels, T)``: for each dilation
    ``d`` (V1: ``(1, 3, 5)``), ``x = x + conv_1(lrelu(conv_d(lrelu(x))))``, both convolutions of the odd
    ``kernel_size``."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]):
        super().__init__()
        self.dilated = _dilated_convs(channels, kernel_size, dilations)
        self.plain = nn.ModuleList(
            weight_norm(nn.Conv1d(channels, channels, kernel_size, padding=same_padding(kernel_size)))
            for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for dilated, plain in zip(self.dilated, self.plain):
            x = x + plain(F.leaky_relu(dilated(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class ResBlock2(nn.Module):
    """An MRF residual block of type 2 (V3, dilations ``(1, 2)``, ``(2, 6)``, ``(3, 12)``): for each dilation ``d``,
    ``x = x + conv_d(lrelu(x))``; shapes as :class:`ResBlock1`."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]):
        super().__init__()
        self.dilated = _dilated_convs(channels, kernel_size, dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for dilated in self.dilated:
            x = x + dilated(F.leaky_relu(x, LRELU_SLOPE))
        return x


class MRF(nn.Module):
    """Multi-receptive field fusion (Section 2.2), ``(B, channels, T) -> (B, channels, T)``: residual blocks of
    different kernels and dilations on the same input, averaged (the paper says summed; the authors' code divides the
    sum by the number of blocks, which trained weights expect)."""

    def __init__(self, channels: int, kernel_sizes: Sequence[int], dilations: Sequence[Sequence[int]],
                 resblock: int = 1):
        super().__init__()
        block = ResBlock1 if resblock == 1 else ResBlock2
        self.blocks = nn.ModuleList(block(channels, k, d) for k, d in zip(kernel_sizes, dilations))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self.blocks[0](x)
        for block in self.blocks[1:]:
            total = total + block(x)
        return total / len(self.blocks)


class Generator(nn.Module):
    """HiFi-GAN's generator (Section 2.2, Figure 1): mel ``(B, n_mels, frames)`` -> audio ``(B, 1, frames * hop)``.

    A kernel-7 convolution to ``upsample_initial_channel`` (``h_u``) channels; per stage a leaky ReLU, a transposed
    convolution of stride ``upsample_rates[i]`` and kernel ``upsample_kernel_sizes[i]`` (``kernel - rate`` even, so the
    length grows exactly by the rate) that halves the channels, and an :class:`MRF` (``resblock_kernel_sizes``:
    ``k_r``, ``resblock_dilation_sizes``: ``D_r``, blocks of type ``resblock``); last a leaky ReLU, a kernel-7
    convolution to one channel and ``tanh``. All weight-normalised; the hop is the product of the rates; no noise input.

    Raises:
        ValueError: lists of different lengths, an empty list, an even residual kernel, a transposed kernel smaller
            than its rate or of another parity, channels that halve below 1, an unknown block type.
    """

    def __init__(self, n_mels: int, upsample_rates: Sequence[int], upsample_kernel_sizes: Sequence[int],
                 upsample_initial_channel: int, resblock_kernel_sizes: Sequence[int],
                 resblock_dilation_sizes: Sequence[Sequence[int]], resblock: int = 1):
        super().__init__()
        _check_generator(upsample_rates, upsample_kernel_sizes, upsample_initial_channel, resblock_kernel_sizes,
                         resblock_dilation_sizes, resblock)
        self.upsample_rates = tuple(upsample_rates)
        self.conv_pre = weight_norm(nn.Conv1d(n_mels, upsample_initial_channel, 7, padding=3))
        self.ups = nn.ModuleList()
        self.mrfs = nn.ModuleList()
        channels = upsample_initial_channel
        for rate, kernel in zip(upsample_rates, upsample_kernel_sizes):
            self.ups.append(weight_norm(nn.ConvTranspose1d(channels, channels // 2, kernel, stride=rate,
                                                           padding=(kernel - rate) // 2)))
            channels //= 2
            self.mrfs.append(MRF(channels, resblock_kernel_sizes, resblock_dilation_sizes, resblock))
        self.conv_post = weight_norm(nn.Conv1d(channels, 1, 7, padding=3))

    @property
    def hop_length(self) -> int:
        """Audio samples per mel frame: the product of the upsampling rates."""
        return math.prod(self.upsample_rates)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Natural-log mel ``(B, n_mels, frames)`` -> audio ``(B, 1, frames * hop_length)`` in [-1, 1]."""
        x = self.conv_pre(mel)
        for up, mrf in zip(self.ups, self.mrfs):
            x = mrf(up(F.leaky_relu(x, LRELU_SLOPE)))
        return torch.tanh(self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)))


def _check_generator(rates, kernels, channels, res_kernels, res_dilations, resblock) -> None:
    """Raise ValueError, one line naming the setting, for generator settings that cannot build or that would not give
    ``frames * prod(rates)`` samples."""
    if resblock not in (1, 2):
        raise ValueError(f"hifigan.resblock must be 1 or 2, got {resblock!r}")
    if not rates or len(rates) != len(kernels):
        raise ValueError(f"hifigan.upsample_rates ({len(rates)} values) and hifigan.upsample_kernel_sizes "
                         f"({len(kernels)} values) must be non-empty and of the same length")
    for rate, kernel in zip(rates, kernels):
        if rate < 1 or kernel < rate or (kernel - rate) % 2:
            raise ValueError(f"hifigan.upsample_kernel_sizes: kernel {kernel} for rate {rate} must be >= the rate "
                             "and differ from it by an even number (else the output length is not frames * hop)")
    if channels >> len(rates) < 1:
        raise ValueError(f"hifigan.upsample_initial_channel={channels} halves below 1 channel in {len(rates)} "
                         f"upsampling stages; use at least {2 ** len(rates)}")
    if not res_kernels or len(res_kernels) != len(res_dilations):
        raise ValueError(f"hifigan.resblock_kernel_sizes ({len(res_kernels)} values) and "
                         f"hifigan.resblock_dilation_sizes ({len(res_dilations)} lists) must be non-empty and of "
                         "the same length")
    if any(k < 1 or k % 2 == 0 for k in res_kernels):
        raise ValueError(f"hifigan.resblock_kernel_sizes must be odd and positive, got {list(res_kernels)}")
    if any(not d or min(d) < 1 for d in res_dilations):
        raise ValueError(f"hifigan.resblock_dilation_sizes: each block needs dilations >= 1, got "
                         f"{[list(d) for d in res_dilations]}")


# --- discriminators -------------------------------------------------------------------------------------------------

Scores = list[torch.Tensor]
"""One ``(B, n)`` tensor of realness scores per sub-discriminator (LSGAN: 1 real, 0 generated)."""
FeatureMaps = list[list[torch.Tensor]]
"""Per sub-discriminator, the output of each of its layers (what the feature-matching loss compares)."""


def scores_and_features(convs: nn.ModuleList, conv_post: nn.Module, x: torch.Tensor
                        ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A sub-discriminator's pass: each of ``convs`` then a leaky ReLU, then ``conv_post``. Returns the scores flattened
    to ``(B, n)`` and every layer's output (the feature maps of the feature-matching loss, Eq. 4)."""
    fmaps = []
    for conv in convs:
        x = F.leaky_relu(conv(x), LRELU_SLOPE)
        fmaps.append(x)
    x = conv_post(x)
    fmaps.append(x)
    return x.flatten(1), fmaps


class PeriodDiscriminator(nn.Module):
    """One sub-discriminator of the MPD (Section 2.3, Figure 2b), audio ``(B, 1, T)`` -> ``(scores (B, n), [feature map
    per layer])``: it sees every ``period``-th sample. The audio is reflect-padded at the end to a multiple of
    ``period`` and folded to ``(B, 1, T / period, period)``; weight-normalised 2-D convolutions of kernel ``(5, 1)``
    (each phase of the period separately) to each of ``channels`` (the authors': 32, 128, 512, 1024, 1024), stride 3 but
    the last, a leaky ReLU after each, then a ``(3, 1)`` convolution to one channel.
    """

    def __init__(self, period: int, channels: Sequence[int]):
        super().__init__()
        self.period = period
        strides = (3,) * (len(channels) - 1) + (1,)
        self.convs = nn.ModuleList(weight_norm(nn.Conv2d(i, o, (5, 1), (s, 1), padding=(2, 0)))
                                   for i, o, s in zip((1, *channels[:-1]), channels, strides))
        self.conv_post = weight_norm(nn.Conv2d(channels[-1], 1, (3, 1), padding=(1, 0)))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, ch, samples = audio.shape
        if samples % self.period:
            extra = self.period - samples % self.period
            audio = F.pad(audio, (0, extra), mode="reflect" if extra < samples else "replicate")
            samples += extra
        folded = audio.view(batch, ch, samples // self.period, self.period)
        return scores_and_features(self.convs, self.conv_post, folded)


class MultiPeriodDiscriminator(nn.Module):
    """MPD (Section 2.3): one :class:`PeriodDiscriminator` per period (the paper's 2, 3, 5, 7, 11: primes, so that the
    sub-discriminators overlap little). Audio ``(B, 1, T)`` -> ``(scores, feature maps)``, one entry per period."""

    def __init__(self, periods: Sequence[int] = (2, 3, 5, 7, 11),
                 channels: Sequence[int] = (32, 128, 512, 1024, 1024)):
        super().__init__()
        self.discriminators = nn.ModuleList(PeriodDiscriminator(p, channels) for p in periods)

    def forward(self, audio: torch.Tensor) -> tuple[Scores, FeatureMaps]:
        outputs = [d(audio) for d in self.discriminators]
        return [score for score, _ in outputs], [fmaps for _, fmaps in outputs]


SCALE_KERNELS = (15, 41, 41, 41, 41, 41, 5)
SCALE_STRIDES = (1, 2, 2, 4, 4, 1, 1)
SCALE_GROUPS = (1, 4, 16, 16, 16, 16, 1)
"""Kernels, strides and groups of a :class:`ScaleDiscriminator`'s 7 convolutions (MelGAN's, as the authors' have
them)."""


class ScaleDiscriminator(nn.Module):
    """One sub-discriminator of the MSD (Section 2.3, Figure 2a; MelGAN's discriminator block), audio ``(B, 1, T)`` ->
    ``(scores (B, n), [feature map per layer])``: seven 1-D convolutions (:data:`SCALE_KERNELS`, :data:`SCALE_STRIDES`,
    :data:`SCALE_GROUPS`) to ``channels`` (the authors': 128, 128, 256, 512, 1024, 1024, 1024; multiples of each layer's
    groups) with a leaky ReLU after each, then a kernel-3 convolution to one channel. Spectral norm instead of weight
    norm when ``spectral`` (the MSD's raw-audio scale).
    """

    def __init__(self, channels: Sequence[int], spectral: bool = False):
        super().__init__()
        norm = spectral_norm if spectral else weight_norm
        self.convs = nn.ModuleList(
            norm(nn.Conv1d(i, o, k, s, groups=g, padding=(k - 1) // 2))
            for i, o, k, s, g in zip((1, *channels[:-1]), channels, SCALE_KERNELS, SCALE_STRIDES, SCALE_GROUPS))
        self.conv_post = norm(nn.Conv1d(channels[-1], 1, 3, padding=1))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return scores_and_features(self.convs, self.conv_post, audio)


class MultiScaleDiscriminator(nn.Module):
    """MSD (Section 2.3): ``scales`` :class:`ScaleDiscriminator` s on the raw audio (the first, spectral-normed), then
    on the audio average-pooled (kernel 4, stride 2, padding 2) once, twice, ... Audio ``(B, 1, T)`` -> ``(scores,
    feature maps)``, one entry per scale."""

    def __init__(self, scales: int = 3, channels: Sequence[int] = (128, 128, 256, 512, 1024, 1024, 1024)):
        super().__init__()
        self.discriminators = nn.ModuleList(ScaleDiscriminator(channels, spectral=i == 0) for i in range(scales))
        self.pool = nn.AvgPool1d(4, 2, padding=2)

    def forward(self, audio: torch.Tensor) -> tuple[Scores, FeatureMaps]:
        outputs = []
        for i, d in enumerate(self.discriminators):
            audio = self.pool(audio) if i else audio
            outputs.append(d(audio))
        return [score for score, _ in outputs], [fmaps for _, fmaps in outputs]


class Discriminator(nn.Module):
    """The MPD (``periods``, ``mpd_channels``: a period discriminator's 5 widths) and the MSD (``scales``,
    ``msd_channels``: a scale discriminator's 7 widths) as one module: one optimizer, one DDP wrapper. Audio ``(B, 1,
    T)`` or ``(B, T)`` -> ``(scores, feature maps)``: the MPD's entries (one per period, in order), then the MSD's.

    Raises:
        ValueError: no period or scale, a period < 1, a width list of the wrong length, or a width that is not a
            multiple of its convolution's groups.
    """

    def __init__(self, periods: Sequence[int] = (2, 3, 5, 7, 11),
                 mpd_channels: Sequence[int] = (32, 128, 512, 1024, 1024), scales: int = 3,
                 msd_channels: Sequence[int] = (128, 128, 256, 512, 1024, 1024, 1024)):
        super().__init__()
        if not periods or min(periods) < 1:
            raise ValueError(f"hifigan.mpd_periods must be a non-empty list of periods >= 1, got {list(periods)}")
        if scales < 1:
            raise ValueError(f"hifigan.msd_scales must be >= 1, got {scales}")
        if len(mpd_channels) != 5 or min(mpd_channels) < 1:
            raise ValueError(f"hifigan.mpd_channels must be 5 positive widths, got {list(mpd_channels)}")
        if len(msd_channels) != len(SCALE_GROUPS) or min(msd_channels) < 1:
            raise ValueError(f"hifigan.msd_channels must be {len(SCALE_GROUPS)} positive widths, got "
                             f"{list(msd_channels)}")
        for i, (c_in, c_out, g) in enumerate(zip((1, *msd_channels[:-1]), msd_channels, SCALE_GROUPS)):
            if c_in % g or c_out % g:
                raise ValueError(f"hifigan.msd_channels: layer {i} ({c_in} -> {c_out} channels) has {g} groups; "
                                 f"its channels in and out must be multiples of {g}")
        self.mpd = MultiPeriodDiscriminator(periods, mpd_channels)
        self.msd = MultiScaleDiscriminator(scales, msd_channels)

    def forward(self, audio: torch.Tensor) -> tuple[Scores, FeatureMaps]:
        if audio.dim() == 2:
            audio = audio.unsqueeze(1)
        mpd_scores, mpd_fmaps = self.mpd(audio)
        msd_scores, msd_fmaps = self.msd(audio)
        return mpd_scores + msd_scores, mpd_fmaps + msd_fmaps


# --- losses (Section 2.4), summed over sub-discriminators, computed in float32 ---------------------------------------

def discriminator_loss(real_scores: Scores, fake_scores: Scores) -> torch.Tensor:
    """LSGAN discriminator loss (Eq. 1): ``sum_k mean((D_k(x) - 1)^2) + mean(D_k(G(s))^2)``; 0 when every real score
    is 1 and every generated one 0."""
    return sum(torch.mean((1 - r.float()) ** 2) + torch.mean(f.float() ** 2)
               for r, f in zip(real_scores, fake_scores))


def generator_adversarial_loss(fake_scores: Scores) -> torch.Tensor:
    """LSGAN generator loss (Eq. 2): ``sum_k mean((D_k(G(s)) - 1)^2)``; 0 when every generated score is 1."""
    return sum(torch.mean((1 - f.float()) ** 2) for f in fake_scores)


def feature_matching_loss(real_fmaps: FeatureMaps, fake_fmaps: FeatureMaps) -> torch.Tensor:
    """Feature-matching loss (Eq. 4) before its weight ``lambda_fm`` (2, Eq. 5): the mean absolute difference of each
    layer's real and generated features, summed over layers and sub-discriminators."""
    return sum(torch.mean(torch.abs(r.float() - f.float()))
               for real, fake in zip(real_fmaps, fake_fmaps) for r, f in zip(real, fake))
