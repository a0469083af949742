"""A complete model file with two optimizers to start from: ``gan_vocoder``, a small GAN vocoder (mel -> audio).

Copy it into ``models/``, list it in ``models/__init__.py`` (two lines: ``from models import gan_vocoder`` and
``gan_vocoder.SPEC,`` in the registry's list) and it trains like the example models (this copy is never imported)::

    cp docs/two_optimizer_example.py models/gan_vocoder.py
    python multiproc.py train.py --config config.json --model gan_vocoder --tiny --dataset-path data/demo --max-steps 50
    python inference.py --checkpoint output/checkpoint_last.pt --wav data/demo/wavs/LJ_DEMO_0001.wav --output copy.wav

It is the shape of a GAN: two networks, each with its own optimizer, updated one after the other in every training step.
``Phases.names`` lists the optimizers in update order (``"discriminator"``, then ``"generator"``), ``build_optimizer``
returns one per phase, ``Phases.networks`` says which network each one trains and ``Phases.train_step`` computes a
phase's loss. ``train.py`` does the rest for every phase: DDP (each network is wrapped on its own, so the generator's
step all-reduces no discriminator gradient), the frozen other network, accumulation, AMP, clipping, the skip/stop of
non-finite steps, checkpoints (both optimizers and schedulers) and exact resume. It logs each phase's loss as
``loss_<phase>``, its gradient norm as ``grad_norm_<phase>`` and the named scalars ``train_step`` returns (``losses`` in
``metrics.jsonl``, TensorBoard's ``train/<name>``, the progress bar); ``loss`` is the last phase's.

The defaults are small (a step of both phases takes a fraction of a second on a CPU): the file works without a section
in ``config.json`` (``--tiny`` changes only the shared sections). To train it for real, add one with larger values::

    "gan_vocoder": {"channels": 256, "discriminator_channels": 64, "segment_frames": 32, "batch_size": 16}

For a model of your own, rename the file, the ``gan_vocoder`` section and the classes, and change the networks, the
losses and the data. What each part is for:

* :class:`GANVocoderConfig`: the ``gan_vocoder`` section of ``config.json`` (optional; ``batch_size`` is a required
  field of every model's section; the learning rate and weight decay are the shared ``optimizer`` section's).
* :class:`Generator` (log-mel -> audio, and the log-mel of that audio) and :class:`Discriminator` (audio ->
  real/fake scores); :class:`GANVocoder` holds both, and its ``forward(batch)`` is what validation runs.
* :func:`networks`, :func:`build_optimizer`, :func:`build_scheduler`: one network, one optimizer and one
  learning-rate schedule per phase (the schedule is optional: without it, ``optimizer.schedule`` applies).
* :func:`train_step`: ``(phase, nets, batch) -> (loss, {name: scalar})``, the loss of one phase.
* :func:`mel_l1`: the validation criterion (``criterion(outputs, batch) -> scalar``): the number to compare
  between runs, since the adversarial losses of a GAN do not fall steadily.
* :func:`build_datasets`: ``(train, val)`` crops of the corpus (any layout ``data.format`` reads), batched by ``collate_audio_mel``
  into ``{"mel": (B, n_mels, frames), "audio": (B, frames * hop_length), "ids": [str] * B}``.
* :func:`add_inference_args`, :func:`infer` (``inference.py``) and :func:`vocode` (another model's mels to
  audio), all optional; ``Inference.modules``, ``("generator",)``: the sub-modules inference uses. A release
  checkpoint (``scripts/export.py --format release``) keeps only their weights and ``train.ema_decay`` averages
  only them; left out, both would hold the discriminator too.
* ``SPEC = ModelSpec(...)`` at the end: the model's name (``--model gan_vocoder``) and everything above.

Optional parts it leaves out, each skipped with a line saying so where it would be used: of ``Training`` (see
``model.py``), a fast path, ``log_validation``; what the optional parts' tools need of a model (synthetic batches,
...), registered in ``parts.py``. A full GAN
vocoder adds several discriminators (periods, scales), feature-matching losses and larger networks; the training
contract stays this one.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from distributed import unwrap_model
from model import Inference, ModelSpec, Phases, Training
from utils.config import Config, ModelSection
from utils.data.audio import AudioConfig, MelSpectrogram, check_wav_output, save_wav
from utils.data.corpora import load_splits
from utils.data.datasets import AudioMelDataset, Crop, collate_audio_mel, read_mel

PHASES = ("discriminator", "generator")
"""The optimizers, in update order: the discriminator learns from the current generator first."""
Beta = Annotated[float, Field(ge=0, lt=1)]  # an Adam beta, in [0, 1): the bound of each item of ``adam_betas``


class GANVocoderConfig(ModelSection):
    """The ``gan_vocoder`` section of ``config.json``.

    ``upsample_rates``: the generator's transposed convolutions, each multiplying the length by its rate (each
    at least 2; their product must be ``audio.hop_length``, 256 samples per mel frame). ``channels``: the
    generator's width after its input convolution, halved at every upsampling. ``discriminator_channels``:
    the discriminator's first width (it grows to 4x). ``segment_frames``: training crops in mel frames
    (``audio.hop_length`` samples each). ``batch_size``: crops per process and step. ``adam_betas``: Adam's, the
    same for both networks (at ``optimizer.lr`` and ``optimizer.weight_decay``). ``lr_decay``: the learning rate is
    multiplied by it after every epoch. ``mel_loss_weight``: the generator's loss is its adversarial loss plus
    this times the mel L1.
    """

    upsample_rates: tuple[Annotated[int, Field(ge=2)], ...] = (8, 8, 4)
    channels: int = Field(64, ge=1)
    discriminator_channels: int = Field(16, ge=1)
    segment_frames: int = Field(16, ge=1)
    batch_size: int = Field(4, ge=1)
    adam_betas: tuple[Beta, Beta] = (0.8, 0.99)
    lr_decay: float = Field(0.999, gt=0, le=1)
    mel_loss_weight: float = Field(45.0, ge=0)


class ResidualBlock(nn.Module):
    """``x + conv(leaky_relu(x))``: a kernel-3 convolution that keeps the shape ``(B, channels, samples)``."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(F.leaky_relu(x, 0.2))


class Generator(nn.Module):
    """Log-mel ``(B, n_mels, frames)`` -> audio ``(B, frames * hop_length)`` in [-1, 1].

    An input convolution, then per upsampling rate a transposed convolution (length times the rate, width
    halved) and a residual block, then a convolution to one channel and ``tanh``. It also holds the project's
    mel front end (no parameters) and returns the log-mel of the audio it made, which the loss compares with
    the input mel; and it keeps ``mel_loss_weight``, since :func:`train_step` sees the networks, not the config.

    Raises:
        ValueError: the upsampling rates' product is not ``audio.hop_length``.
    """

    def __init__(self, cfg: GANVocoderConfig, audio_cfg: AudioConfig):
        super().__init__()
        if math.prod(cfg.upsample_rates) != audio_cfg.hop_length:
            raise ValueError(f"upsample_rates {list(cfg.upsample_rates)} multiply to "
                             f"{math.prod(cfg.upsample_rates)}; their product must be audio.hop_length "
                             f"({audio_cfg.hop_length})")
        width = cfg.channels
        layers: list[nn.Module] = [nn.Conv1d(audio_cfg.n_mels, width, kernel_size=7, padding=3)]
        for rate in cfg.upsample_rates:
            narrower = max(1, width // 2)
            # kernel 2 * rate with this padding makes exactly rate times more samples, for even and odd rates
            layers += [nn.LeakyReLU(0.2),
                       nn.ConvTranspose1d(width, narrower, kernel_size=2 * rate, stride=rate,
                                          padding=(rate + 1) // 2, output_padding=rate % 2),
                       ResidualBlock(narrower)]
            width = narrower
        layers += [nn.LeakyReLU(0.2), nn.Conv1d(width, 1, kernel_size=7, padding=3), nn.Tanh()]
        self.layers = nn.Sequential(*layers)
        self.analysis = MelSpectrogram(audio_cfg)
        self.mel_loss_weight = cfg.mel_loss_weight

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(audio (B, frames * hop_length), its log-mel (B, n_mels, frames))``; the log-mel in float32."""
        audio = self.layers(mel).squeeze(1)
        with torch.autocast(audio.device.type, enabled=False):  # the STFT in float32, also under AMP
            return audio, self.analysis(audio.float())


class Discriminator(nn.Module):
    """Audio ``(B, 1, samples)`` -> real/fake scores ``(B, 1, samples // 16)``: one score per 16 samples.

    Kernel-15 convolutions, two of them with stride 4, widths ``d, 2d, 4d, 4d``, then a score channel.
    """

    def __init__(self, channels: int):
        super().__init__()
        d = channels
        self.layers = nn.Sequential(
            nn.Conv1d(1, d, kernel_size=15, padding=7), nn.LeakyReLU(0.2),
            nn.Conv1d(d, 2 * d, kernel_size=15, stride=4, padding=7), nn.LeakyReLU(0.2),
            nn.Conv1d(2 * d, 4 * d, kernel_size=15, stride=4, padding=7), nn.LeakyReLU(0.2),
            nn.Conv1d(4 * d, 4 * d, kernel_size=5, padding=2), nn.LeakyReLU(0.2),
            nn.Conv1d(4 * d, 1, kernel_size=3, padding=1))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.layers(audio)


class GANVocoder(nn.Module):
    """The two networks the optimizers train: ``generator`` and ``discriminator``."""

    def __init__(self, cfg: GANVocoderConfig, audio_cfg: AudioConfig):
        super().__init__()
        self.generator = Generator(cfg, audio_cfg)
        self.discriminator = Discriminator(cfg.discriminator_channels)

    def forward(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Vocode ``batch["mel"]``: the generator's ``(audio, log-mel of the audio)`` (what validation runs)."""
        return self.generator(batch["mel"])


def networks(model: GANVocoder) -> dict[str, nn.Module]:
    """``Phases.networks``: the network each phase's optimizer trains."""
    return {"discriminator": model.discriminator, "generator": model.generator}


def build_optimizer(model: GANVocoder, cfg: Config, device: torch.device) -> dict[str, torch.optim.Optimizer]:
    """``{phase: Adam}``, one per network, at ``optimizer.lr`` and ``optimizer.weight_decay`` with the section's
    betas."""
    return {phase: torch.optim.Adam(net.parameters(), lr=cfg.optimizer.lr, betas=tuple(cfg.gan_vocoder.adam_betas),
                                    weight_decay=cfg.optimizer.weight_decay, fused=device.type == "cuda")
            for phase, net in networks(model).items()}


def build_scheduler(phase: str, optimizer: torch.optim.Optimizer, cfg: Config) -> tuple[Any, str]:
    """Either phase's learning rate times ``gan_vocoder.lr_decay`` after every epoch (``"epoch"``; a scheduler
    returned with ``"step"`` is stepped after every optimizer step instead)."""
    return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=cfg.gan_vocoder.lr_decay), "epoch"


def train_step(phase: str, nets: dict[str, nn.Module], batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one phase (``Phases.train_step``), least-squares GAN losses.

    Args:
        phase: ``"discriminator"`` or ``"generator"``.
        nets: ``{"discriminator": ..., "generator": ...}``. The phase's own network may be wrapped in DDP
            (call it; its attributes are on ``unwrap_model(net)``); the other one is the plain module with its
            parameters frozen, so gradients flow through it but it is not updated.
        batch: ``{"mel": (B, n_mels, frames), "audio": (B, frames * hop_length), "ids": [...]}``.

    Returns:
        ``(loss, named scalars)``. Discriminator: ``mean((D(real) - 1)^2) + mean(D(fake)^2)`` on the real audio and
        on the generator's audio (made without gradients), with ``d_real`` and ``d_fake``, the mean scores.
        Generator: ``g_adv + mel_loss_weight * mel_l1``, with both terms unweighted: ``g_adv``,
        ``mean((D(fake) - 1)^2)``, and ``mel_l1``, the mean absolute difference between the log-mel of its audio
        and the input log-mel (log-mel units).

    Raises:
        ValueError: an unknown phase.
    """
    generator, discriminator = nets["generator"], nets["discriminator"]
    mel, real = batch["mel"], batch["audio"]
    if phase == "discriminator":
        with torch.no_grad():
            fake, _ = generator(mel)
        scores = discriminator(torch.cat([real, fake.to(real.dtype)]).unsqueeze(1)).float()  # one pass over both
        real_scores, fake_scores = scores[:real.shape[0]], scores[real.shape[0]:]
        loss = torch.mean((real_scores - 1) ** 2) + torch.mean(fake_scores ** 2)
        return loss, {"d_real": real_scores.mean().detach(), "d_fake": fake_scores.mean().detach()}
    if phase == "generator":
        fake, fake_mel = generator(mel)
        g_adv = torch.mean((discriminator(fake.unsqueeze(1)).float() - 1) ** 2)
        loss_mel = F.l1_loss(fake_mel, mel.float())
        loss = g_adv + unwrap_model(generator).mel_loss_weight * loss_mel
        return loss, {"g_adv": g_adv.detach(), "mel_l1": loss_mel.detach()}
    raise ValueError(f"gan_vocoder train_step: unknown phase {phase!r}, expected one of {', '.join(PHASES)}")


def mel_l1(outputs: tuple[torch.Tensor, torch.Tensor], batch: dict) -> torch.Tensor:
    """The validation criterion: mean absolute difference between the log-mel of the generated audio
    (``outputs[1]``, ``(B, n_mels, frames)``) and ``batch["mel"]``, in float32 (log-mel units)."""
    return F.l1_loss(outputs[1].float(), batch["mel"].float())


def build_datasets(cfg: Config) -> tuple[AudioMelDataset, AudioMelDataset]:
    """Training and validation sets of ``cfg.data``'s corpus: crops of ``gan_vocoder.segment_frames *
    audio.hop_length`` samples with their log-mels of ``segment_frames`` frames (random crops for training, a new
    one each epoch, seeded by ``train.seed``; the first crop of each clip for validation)."""
    train_utts, val_utts = load_splits(cfg.data)
    crop_samples = cfg.gan_vocoder.segment_frames * cfg.audio.hop_length
    return (AudioMelDataset(train_utts, cfg.audio, Crop(crop_samples, seed=cfg.train.seed)),
            AudioMelDataset(val_utts, cfg.audio, Crop(crop_samples, random=False)))


@torch.no_grad()
def vocode(model: GANVocoder, mel: torch.Tensor, cfg: Config) -> torch.Tensor:
    """Log-mel ``(n_mels, frames)`` -> audio ``(frames * hop_length,)`` in [-1, 1], float32 on the CPU."""
    device = next(model.generator.parameters()).device
    audio, _ = model.generator(mel.unsqueeze(0).to(device))
    return audio[0].float().cpu()


def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """``inference.py``'s option for this model: the wav whose log-mel is vocoded."""
    parser.add_argument("--wav", help="wav file whose log-mel is vocoded (copy-synthesis)")


def infer(model: GANVocoder, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """Vocode the log-mel of ``--wav`` into the wav ``--output`` (16-bit PCM at ``audio.sampling_rate``).

    Raises:
        ValueError: no ``--wav``, or an ``--output`` that is not a ``.wav`` file name.
        DataError: the wav cannot be read or is too short for one STFT window (``MelSpectrogram.min_samples``).
    """
    if not args.wav:
        raise ValueError("gan_vocoder needs --wav FILE: the wav whose log-mel is vocoded")
    output = check_wav_output(args.output)
    with torch.no_grad():
        vocoded = vocode(model, read_mel(args, cfg), cfg)  # the project's own --wav -> log-mel, with its checks
    save_wav(output, vocoded, cfg.audio.sampling_rate)
    print(f"wrote {output} ({vocoded.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]


SPEC = ModelSpec(
    name="gan_vocoder",                                           # --model gan_vocoder; its section of config.json
    config_cls=GANVocoderConfig,
    build_model=lambda cfg: GANVocoder(cfg.gan_vocoder, cfg.audio),
    training=Training(
        build_criterion=lambda cfg: mel_l1,                       # validation's loss
        build_datasets=build_datasets,
        collate_fn=collate_audio_mel,
        count_items=lambda batch: batch["audio"].numel(),         # audio samples, for items/s
        build_optimizer=build_optimizer,                          # {phase: optimizer}
        phases=Phases(names=PHASES,                               # the optimizers, in update order
                      networks=networks,                          # phase -> the network it trains
                      train_step=train_step,                      # phase's loss and named scalars
                      build_scheduler=build_scheduler)),          # optional: per-phase LR schedule
    inference=Inference(infer=infer, add_args=add_inference_args,  # optional: checkpoint -> files, inference.py's
                        vocode=vocode,                             # options, mel -> audio for another model,
                        modules=("generator",)),                   # what a release keeps and the EMA averages
)
