"""HiFi-GAN (mel -> audio): config, model, losses, two-phase training step, data, inference, benchmark shapes.

Source: Kong, Kim and Bae, "HiFi-GAN: Generative Adversarial Networks for Efficient and High Fidelity Speech
Synthesis" (NeurIPS 2020); defaults are the paper's V1 (Appendix A; 13.92M generator parameters, Table 1)
and its training set-up (Section 3: AdamW with betas 0.8/0.99 and weight decay 0.01, learning rate 2e-4
decayed by 0.999 every epoch, batch 16; 8192-sample crops as in the authors' V1 configuration). The
layers are in ``modules/hifigan.py``; this file assembles them and tells ``train.py`` and ``inference.py``
how to use them.

The mel front end is the project's shared one (``utils.audio_processing.MelSpectrogram`` with the ``audio``
section: 22050 Hz, hop 256, 80 mels), the same as Tacotron2's and WaveGlow's, so one HiFi-GAN checkpoint
vocodes Tacotron2's mels. The mel L1 loss compares mels made by that same front end (the authors' code
takes the loss's mel up to the Nyquist frequency instead; here one front end serves both).

Training alternates two optimizers (``ModelSpec.phases``): the discriminator step (MPD + MSD on real audio and
on the generator's output, LSGAN loss), then the generator step (LSGAN adversarial loss, feature matching x2,
mel L1 x45). :data:`TINY_OVERRIDES` is the ``hifigan`` entry of ``config.json``'s ``tiny`` block (a CPU smoke
run: a full discriminator + generator step pair takes a fraction of a second)::

    "hifigan": {"upsample_initial_channel": 32, "resblock_kernel_sizes": [3, 7],
                "resblock_dilation_sizes": [[1, 3], [1, 3]], "mpd_channels": [4, 8, 16, 32, 32],
                "msd_channels": [16, 16, 16, 32, 32, 32, 32], "segment_length": 2048, "batch_size": 2,
                "learning_rate": 0.001}
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from model import Batch, BenchmarkCase, ModelSpec, register
from modules.hifigan import (Discriminator, Generator, discriminator_loss, feature_matching_loss,
                             generator_adversarial_loss)
from utils.audio_processing import MelSpectrogram, check_wav_output, save_wav
from utils.config import AudioConfig, Config, setting
from utils.data_utils import AudioMelDataset, collate_audio_mel, load_splits, read_mel
from utils.onnx_export import ExportPart
from utils.plotting import add_audio, first_time
from utils.published import Weights, weight_norm_key

PHASES = ("discriminator", "generator")
"""Optimizer names in update order: the discriminator learns from the current generator first."""


@dataclasses.dataclass
class HiFiGANConfig:
    """The ``hifigan`` section of ``config.json`` (defaults: the paper's V1 and training set-up).

    Generator (Section 2.2, Appendix A): ``upsample_rates`` and ``upsample_kernel_sizes`` of the transposed
    convolutions (their product must be ``audio.hop_length``), ``upsample_initial_channel`` (``h_u``),
    ``resblock`` type (1: V1/V2, 2: V3), ``resblock_kernel_sizes`` (``k_r``) and ``resblock_dilation_sizes``
    (``D_r``) of the MRF blocks. Discriminators (Section 2.3): ``mpd_periods``, ``mpd_channels`` (a period
    discriminator's 5 widths), ``msd_scales``, ``msd_channels`` (a scale discriminator's 7 widths; the
    defaults are the authors' implementation's, smaller ones make CPU runs fast). ``segment_length``:
    training crop in samples, a multiple of ``audio.hop_length``. ``batch_size`` per process. AdamW for both
    networks: ``learning_rate``, ``adam_betas``, ``weight_decay``; the learning rate is multiplied by
    ``lr_decay`` after every epoch. Generator loss weights (Eq. 5): ``feature_loss_weight`` (``lambda_fm``)
    and ``mel_loss_weight`` (``lambda_mel``). ``mel_on_device``: the DataLoader workers only decode and crop
    the audio; the batch's mels are computed on the device in the step.
    """

    upsample_rates: tuple[int, ...] = setting((8, 8, 2, 2), ge=1)
    upsample_kernel_sizes: tuple[int, ...] = setting((16, 16, 4, 4), ge=1)
    upsample_initial_channel: int = setting(512, ge=1)
    resblock: Literal[1, 2] = 1
    resblock_kernel_sizes: tuple[int, ...] = setting((3, 7, 11), ge=1)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = setting(((1, 3, 5), (1, 3, 5), (1, 3, 5)), ge=1)
    mpd_periods: tuple[int, ...] = setting((2, 3, 5, 7, 11), ge=1)
    mpd_channels: tuple[int, int, int, int, int] = setting((32, 128, 512, 1024, 1024), ge=1)
    msd_scales: int = setting(3, ge=1)
    msd_channels: tuple[int, int, int, int, int, int, int] = setting((128, 128, 256, 512, 1024, 1024, 1024), ge=1)
    segment_length: int = setting(8192, ge=1)
    batch_size: int = setting(16, ge=1)
    learning_rate: float = setting(2e-4, gt=0)
    adam_betas: tuple[float, float] = setting((0.8, 0.99), ge=0, lt=1)
    weight_decay: float = setting(0.01, ge=0)
    lr_decay: float = setting(0.999, gt=0, le=1)
    mel_loss_weight: float = setting(45.0, ge=0)
    feature_loss_weight: float = setting(2.0, ge=0)
    mel_on_device: bool = False


TINY_OVERRIDES: dict[str, Any] = {
    "upsample_initial_channel": 32,
    "resblock_kernel_sizes": [3, 7],
    "resblock_dilation_sizes": [[1, 3], [1, 3]],
    "mpd_channels": [4, 8, 16, 32, 32],
    "msd_channels": [16, 16, 16, 32, 32, 32, 32],
    "segment_length": 2048,
    "batch_size": 2,
    "learning_rate": 0.001,
}
"""The ``hifigan`` entry of ``config.json``'s ``tiny`` block (JSON values, as the file holds them)."""


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """What :func:`train_step` needs besides the networks: the mel front end's settings and the loss weights."""

    audio: AudioConfig
    mel_loss_weight: float
    feature_loss_weight: float


class HiFiGAN(nn.Module):
    """HiFi-GAN: ``generator`` (mel -> audio) and ``discriminator`` (the MPD and the MSD in one module).

    Args:
        cfg: a :class:`HiFiGANConfig`.
        audio_cfg: the ``audio`` section (``n_mels``, ``hop_length`` and the mel front end of the losses).

    Raises:
        ValueError: settings the layers refuse (see :class:`modules.hifigan.Generator` and
            :class:`modules.hifigan.Discriminator`), upsampling rates whose product is not
            ``audio.hop_length``, or a ``segment_length`` that is not a multiple of it.
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
        self.cfg = cfg
        self.generator = Generator(audio_cfg.n_mels, cfg.upsample_rates, cfg.upsample_kernel_sizes,
                                   cfg.upsample_initial_channel, cfg.resblock_kernel_sizes,
                                   cfg.resblock_dilation_sizes, cfg.resblock)
        self.discriminator = Discriminator(cfg.mpd_periods, cfg.mpd_channels, cfg.msd_scales, cfg.msd_channels)
        # train_step sees only the networks, so the settings of its losses travel with the generator (a plain
        # attribute: no parameters, no buffers, nothing in the state dict).
        self.generator.loss_settings = LossSettings(audio_cfg, cfg.mel_loss_weight, cfg.feature_loss_weight)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Vocode ``batch["mel"]`` ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1]."""
        return self.generator(batch["mel"]).squeeze(1)


def networks(model: nn.Module) -> dict[str, nn.Module]:
    """The network each optimizer trains (``ModelSpec.networks``)."""
    return {"discriminator": model.discriminator, "generator": model.generator}


def build_optimizer(model: nn.Module, model_cfg: HiFiGANConfig,
                    device: torch.device) -> dict[str, torch.optim.Optimizer]:
    """One AdamW per network (Section 3: betas 0.8/0.99, weight decay 0.01, learning rate 2e-4), fused on CUDA."""
    return {name: torch.optim.AdamW(net.parameters(), lr=model_cfg.learning_rate, betas=tuple(model_cfg.adam_betas),
                                    weight_decay=model_cfg.weight_decay, fused=device.type == "cuda")
            for name, net in networks(model).items()}


def build_scheduler(phase: str, optimizer: torch.optim.Optimizer, cfg: Config) -> tuple[Any, str]:
    """The learning rate times ``hifigan.lr_decay`` (0.999) after every epoch, for either network (Section 3)."""
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.hifigan.lr_decay), "epoch"


_MELS: dict = {}  # (device, audio settings) -> MelSpectrogram on that device


def mel_function(audio_cfg: AudioConfig, device: torch.device) -> MelSpectrogram:
    """The project's :class:`MelSpectrogram` for ``audio_cfg``, built once per device."""
    key = (str(device), dataclasses.astuple(audio_cfg))
    if key not in _MELS:
        _MELS[key] = MelSpectrogram.from_config(audio_cfg).to(device)
    return _MELS[key]


def aligned(real: torch.Tensor, fake: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both audio tensors (any shape ending in samples) cut to the shorter one's length. The generator gives
    ``frames * hop_length`` samples; the dataset's crops are ``segment_length``, the same number when
    ``segment_length`` is a multiple of the hop, so this cuts nothing then."""
    n = min(real.shape[-1], fake.shape[-1])
    return real[..., :n], fake[..., :n]


def mel_l1(fake: torch.Tensor, real: torch.Tensor, audio_cfg: AudioConfig) -> torch.Tensor:
    """Mel L1 loss (Eq. 3), unweighted: mean absolute difference of the log-mels of ``fake`` and ``real``
    audio ``(B, samples)`` (cut to a common length), in float32 outside autocast. Gradients reach ``fake``;
    the real audio's mel is a constant."""
    real, fake = aligned(real, fake)
    mel = mel_function(audio_cfg, fake.device)
    with torch.autocast(fake.device.type, enabled=False):
        with torch.no_grad():
            target = mel(real.float())
        return F.l1_loss(mel(fake.float()), target)


class MelL1Loss(nn.Module):
    """The validation criterion: ``(generated audio (B, samples), batch) -> mel L1`` against ``batch["audio"]``.

    The generator step's own losses are in :func:`train_step`; validation has no discriminator step, and the
    mel L1 (unweighted, in log-mel units) is the number to compare between runs.
    """

    def __init__(self, audio_cfg: AudioConfig):
        super().__init__()
        self.audio_cfg = audio_cfg

    def forward(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return mel_l1(outputs, batch["audio"], self.audio_cfg)


def train_step(phase: str, nets: dict[str, nn.Module], batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One phase of the GAN step (``ModelSpec.train_step``; Section 2.4).

    Args:
        phase: ``"discriminator"`` or ``"generator"``.
        nets: ``{"discriminator": ..., "generator": ...}``; the phase's network may be DDP-wrapped, the other
            is the plain module with frozen parameters.
        batch: ``{"mel": (B, n_mels, frames), "audio": (B, samples), ...}``, samples = frames * hop_length.

    Returns:
        ``(loss, metrics)``. Discriminator phase: the LSGAN loss of the MPD and MSD on the real audio and on
        the generator's output (made under ``no_grad``), no metrics (``train.py`` logs each phase's loss as
        ``loss_<phase>``). Generator phase: ``g_adv + feature_loss_weight * g_fm + mel_loss_weight * mel_l1``,
        metrics ``{"g_adv", "g_fm", "mel_l1"}`` (the three terms unweighted, detached).

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
        loss = discriminator_loss([s[:n] for s in scores], [s[n:] for s in scores])
        return loss, {}
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


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` of ``hifigan.segment_length`` crops (random for training,
    the first crop for validation); mels ``(n_mels, segment_length // hop_length)``.

    With ``data.mel_dir`` the mels are read from that folder and cropped with the audio on frame boundaries:
    fine-tuning on Tacotron2's teacher-forced mels (``scripts/dump_gta_mels.py``), as jik876/hifi-gan's
    ``--fine_tuning`` does with its ``ft_dataset`` mels.

    Raises:
        ValueError: ``segment_length`` not a multiple of ``audio.hop_length`` (the generator's output would
            not line up with the crop).
        DataError: see :class:`AudioMelDataset` (``data.mel_dir`` missing a mel, made with other settings).
    """
    seg = cfg.hifigan.segment_length
    if seg % cfg.audio.hop_length:
        raise ValueError(f"hifigan.segment_length ({seg}) must be a multiple of audio.hop_length "
                         f"({cfg.audio.hop_length})")
    train_utts, val_utts = load_splits(cfg.data)
    with_mel, mel_dir = not cfg.hifigan.mel_on_device, cfg.data.mel_dir
    return (AudioMelDataset(train_utts, cfg.audio, seg, random_crop=True, seed=cfg.train.seed, with_mel=with_mel,
                            mel_dir=mel_dir),
            AudioMelDataset(val_utts, cfg.audio, seg, random_crop=False, with_mel=with_mel, mel_dir=mel_dir))


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the
    audio's device (``hifigan.mel_on_device``); a batch that has its mel already is returned as it is."""
    if "mel" in batch:
        return batch
    with torch.no_grad():
        return {**batch, "mel": mel_function(cfg.audio, batch["audio"].device)(batch["audio"])}


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random HiFi-GAN batch of the training shapes.

    ``{"mel": (B, n_mels, segment // hop_length) standard normal, "audio": (B, segment) normal with standard
    deviation 0.1, "ids": [str] * B}``, float32 on the CPU.

    Args:
        cfg: the config (``audio.n_mels``, ``audio.hop_length``, ``hifigan.segment_length``).
        batch_size: items ``B``.
        generator: the random stream (seeded by the caller).
        segment_length: samples per item; ``None``: ``hifigan.segment_length``.

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``audio.hop_length``.
    """
    segment = cfg.hifigan.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"hifigan synthetic_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.audio.hop_length:
        raise ValueError(f"hifigan synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"audio.hop_length={cfg.audio.hop_length}")
    mel = torch.randn(batch_size, cfg.audio.n_mels, segment // cfg.audio.hop_length, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}


# --- inference.py --------------------------------------------------------------------------------------------

def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """HiFi-GAN's ``inference.py`` options: what to vocode, ``--mel`` or ``--wav``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mel", help="a torch tensor file (n_mels, frames) to vocode")
    source.add_argument("--wav", help="a wav whose mel is vocoded (copy-synthesis)")


@torch.no_grad()
def vocode(model: nn.Module, mel: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Mel ``(n_mels, frames)`` -> audio ``(frames * hop_length,)`` in [-1, 1] (tanh output), float32 on the CPU."""
    device = next(model.generator.parameters()).device
    return model.generator(mel.unsqueeze(0).to(device))[0, 0].float().cpu()


def log_validation(model: nn.Module, batch: Batch, outputs: torch.Tensor, step: int, writer: Any, output_dir: Any,
                   cfg: Optional[Config] = None) -> None:
    """Audio of the first utterance of a validation batch, for TensorBoard's audio tab.

    ``audio/vocoded``: the generator's output for that item, ``outputs[0]`` ``(samples,)`` (the validation crop:
    the first ``hifigan.segment_length`` samples of the clip; the loader does not shuffle, so it is the same
    utterance at every validation), at ``audio.sampling_rate`` Hz. ``audio/ground_truth``: the item's audio
    ``batch["audio"][0]``, at the first validation of the run only. Nothing is written without a ``writer`` or
    a ``cfg``.

    Args:
        model: the :class:`HiFiGAN` (unused: ``outputs`` holds its audio).
        batch: ``{"mel": (B, n_mels, frames), "audio": (B, samples), ...}``.
        outputs: the generator's audio for ``batch``, ``(B, samples)`` in [-1, 1].
        step: the training step.
        writer: a ``SummaryWriter`` or ``None``.
        output_dir: the run's folder (unused).
        cfg: the run's config (``audio.sampling_rate``).
    """
    if writer is None or cfg is None:
        return
    add_audio(writer, "audio/vocoded", outputs[0].float(), step, cfg.audio.sampling_rate)
    if first_time(writer, "audio/ground_truth"):
        add_audio(writer, "audio/ground_truth", batch["audio"][0].float(), step, cfg.audio.sampling_rate)


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for HiFi-GAN: vocode ``--mel`` or the mel of ``--wav`` into the wav ``--output``.

    Raises:
        ValueError: neither ``--mel`` nor ``--wav``, or an output that is not a .wav path.
        DataError: see :func:`read_mel`.
    """
    if not (args.mel or args.wav):
        raise ValueError(f"{args.checkpoint} is a HiFi-GAN checkpoint: give --mel or --wav")
    output = check_wav_output(args.output)
    audio = vocode(model, read_mel(args, cfg), cfg)
    save_wav(output, audio, cfg.audio.sampling_rate)
    print(f"wrote {output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]


def blocks(model: HiFiGAN) -> list[nn.Module]:
    """``ModelSpec.blocks``: the generator's multi-receptive-field blocks, the period discriminators and the scale
    discriminators but the first. That one uses spectral norm, whose power iteration updates a buffer in every
    training forward: recomputed for activation checkpointing it would step twice and give other gradients, so it
    stays with the discriminator's root (sharded with it, never recomputed)."""
    return [*model.generator.mrfs, *model.discriminator.mpd.discriminators,
            *model.discriminator.msd.discriminators[1:]]


# --- scripts/benchmark.py: the V1 training shape (batch 16 of 8192-sample crops) ---------------------------------

_TINY = tuple(f"hifigan.{key}={value}".replace(" ", "") for key, value in TINY_OVERRIDES.items()
              if key not in ("segment_length", "batch_size", "learning_rate"))
BENCHMARK_CASES = (
    BenchmarkCase("hifigan_v1_b16_s8192", ("hifigan.segment_length=8192",), 16, {"segment_length": 8192},
                  tiny=BenchmarkCase("", _TINY + ("hifigan.segment_length=2048",), 2, {"segment_length": 2048})),
)

def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """jik876/hifi-gan's generator files (``g_<step>``; ``{"generator": state_dict}``), or ``None`` for another
    format. The generator of this model; its residual blocks ``resblocks.<i * kernels + j>.convs1``/``convs2`` are
    ``mrfs.<i>.blocks.<j>.dilated``/``plain`` here (``kernels``: ``hifigan.resblock_kernel_sizes``), and old weight
    norm's ``weight_g``/``weight_v`` the parametrization. Such a file holds no discriminator: those start afresh.
    (Read from jik876's checkpoint code for the layout; its generator's output from the same weights equals this
    one's.)"""
    state = loaded.get("generator") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "conv_pre.weight_v" not in state:
        return None
    kernels = len(cfg.hifigan.resblock_kernel_sizes)
    renamed = {}
    for key, value in state.items():
        match = re.match(r"^resblocks\.(\d+)\.convs([12])\.(.*)$", key)
        if match:
            index, kind = int(match.group(1)), "dilated" if match.group(2) == "1" else "plain"
            key = f"mrfs.{index // kernels}.blocks.{index % kernels}.{kind}.{match.group(3)}"
        renamed["generator." + weight_norm_key(key)] = value
    return Weights("jik876/hifi-gan's generator file", "hifigan", renamed, partial=("discriminator.",))


# --- scripts/export.py --format onnx ------------------------------------------------------------------------------

class GeneratorExport(nn.Module):
    """The generator as it is exported: mel ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1]
    (:meth:`HiFiGAN.forward` without the batch dict)."""

    def __init__(self, generator: Generator):
        super().__init__()
        self.generator = generator

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.generator(mel).squeeze(1)


def export_parts(model: HiFiGAN, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: one part, ``generator``: ``mel`` ``(B, n_mels, frames)`` (natural-log mel) ->
    ``audio`` ``(B, frames * hop_length)``, batch and frames dynamic (checked at 1 x 32 and 2 x 19 frames). No
    noise input: the generator is deterministic (Section 2.2)."""
    gen = torch.Generator().manual_seed(0)
    n_mels = cfg.audio.n_mels
    return [ExportPart(
        name="generator", module=GeneratorExport(model.generator),
        inputs=(torch.randn(1, n_mels, 32, generator=gen),), other_inputs=(torch.randn(2, n_mels, 19, generator=gen),),
        input_names=("mel",), output_names=("audio",),
        dynamic_axes={"mel": {0: "batch", 2: "frames"}, "audio": {0: "batch", 1: "samples"}},
        description=f"mel (B, {n_mels}, frames) -> audio (B, frames * {model.generator.hop_length})")]


register("hifigan", ModelSpec(
    config_cls=HiFiGANConfig,
    build_model=lambda cfg: HiFiGAN(cfg.hifigan, cfg.audio),
    build_criterion=lambda cfg: MelL1Loss(cfg.audio),
    build_datasets=build_datasets,
    collate_fn=collate_audio_mel,
    count_items=lambda batch: batch["audio"].numel(),
    build_optimizer=build_optimizer,
    add_inference_args=add_inference_args,
    infer=infer,
    vocode=vocode,
    log_validation=log_validation,
    synthetic_batch=synthetic_batch,
    benchmark_cases=BENCHMARK_CASES,
    on_device=mel_on_device,
    data_advice="raise data.num_workers, or compute the mels on the device with hifigan.mel_on_device=true",
    phases=PHASES,
    networks=networks,
    train_step=train_step,
    build_scheduler=build_scheduler,
    blocks=blocks,
    read_published=read_published,
    inference_modules=("generator",),
    export_parts=export_parts,
))
