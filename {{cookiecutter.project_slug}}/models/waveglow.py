"""WaveGlow (mel -> audio): config, model, loss, data, fast path, inference, benchmark shapes, registration.

Source: Prenger, Valle and Catanzaro, "WaveGlow: a flow-based generative network for speech synthesis"
(ICASSP 2019); layer sizes and defaults from NVIDIA's reference implementation. The layers are in
``modules/waveglow.py``; this file assembles them and tells ``train.py`` and ``inference.py`` how to use them.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from model import Batch, BenchmarkCase, ModelSpec, register
from modules.waveglow import WN, Invertible1x1Conv, at_least_fp32
from utils.audio_processing import MelSpectrogram, check_wav_output, save_wav
from utils.config import Config, setting
from utils.data_utils import AudioMelDataset, collate_audio_mel, load_splits, read_mel
from utils.onnx_export import ExportPart
from utils.plotting import add_audio, first_time, fixed_random_state
from utils.published import Record, Weights, record_parameters, weight_norm_key


@dataclasses.dataclass
class WaveGlowConfig:
    """The ``waveglow`` section of ``config.json`` (defaults: NVIDIA's published LJSpeech model).

    ``n_group`` audio samples are squeezed into channels; every ``n_early_every`` flows,
    ``n_early_size`` channels leave the flow early. ``segment_length`` (samples) is the training crop.
    ``sigma`` is the standard deviation of the Gaussian prior during training; ``infer_sigma`` the one
    sampled from at inference (NVIDIA uses 0.6 for cleaner audio). ``batch_size`` is per process;
    ``learning_rate`` and ``weight_decay`` are Adam's. ``mel_on_device``: the DataLoader workers only decode
    and crop the audio; the mels of the batch's crops are computed on the device in the training step (one
    batched ``torch.stft``: microseconds on a GPU, and the workers' heaviest work gone).
    """

    n_flows: int = setting(12, ge=1)
    n_group: int = setting(8, ge=2)
    n_early_every: int = setting(4, ge=1)
    n_early_size: int = setting(2, ge=0)
    wn_layers: int = setting(8, ge=1)
    wn_channels: int = setting(256, ge=1)
    wn_kernel_size: int = setting(3, ge=1)
    sigma: float = setting(1.0, ge=0)
    infer_sigma: float = setting(0.6, ge=0)
    segment_length: int = setting(16000, ge=1)
    batch_size: int = setting(12, ge=1)
    learning_rate: float = setting(1e-4, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    mel_on_device: bool = False


class WaveGlow(nn.Module):
    """WaveGlow: a normalising flow from audio to Gaussian noise, conditioned on mel spectrograms.

    Args:
        cfg: a :class:`WaveGlowConfig`.
        n_mels: mel channels of the conditioning spectrogram.
        hop_length: audio samples per mel frame (the upsampler's stride).
        win_length: the STFT window in samples (the upsampler's kernel).

    Raises:
        ValueError: ``n_group`` odd, or early outputs that would leave fewer than 2 channels.
    """

    def __init__(self, cfg: WaveGlowConfig, n_mels: int, hop_length: int, win_length: int):
        super().__init__()
        if cfg.n_group % 2:
            raise ValueError(f"waveglow.n_group must be even, got {cfg.n_group}")
        self.cfg = cfg
        self.upsample = nn.ConvTranspose1d(n_mels, n_mels, win_length, stride=hop_length)
        self.flows = nn.ModuleList()
        self.convs = nn.ModuleList()
        channels = cfg.n_group
        for k in range(cfg.n_flows):
            if k > 0 and k % cfg.n_early_every == 0:
                channels -= cfg.n_early_size
            if channels < 2:
                raise ValueError(f"waveglow: {cfg.n_flows} flows with n_early_every={cfg.n_early_every} and "
                                 f"n_early_size={cfg.n_early_size} leave {channels} channels; need >= 2")
            self.convs.append(Invertible1x1Conv(channels))
            self.flows.append(WN(channels // 2, n_mels * cfg.n_group, cfg.wn_layers, cfg.wn_channels,
                                 cfg.wn_kernel_size))
        self.n_remaining = channels

    def _grouped_mel(self, mel: torch.Tensor, samples: int) -> torch.Tensor:
        """Upsample ``(B, n_mels, frames)`` to audio rate and fold it to ``(B, n_mels * n_group, samples // n_group)``."""
        g = self.cfg.n_group
        mel = self.upsample(mel)[:, :, :samples]
        batch, n_mels, _ = mel.shape
        return mel.unfold(2, g, g).permute(0, 1, 3, 2).reshape(batch, n_mels * g, -1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Map audio to noise.

        Args:
            batch: ``{"mel": (B, n_mels, frames), "audio": (B, samples)}``, samples a multiple of
                ``n_group`` and at most ``frames * hop_length``.

        Returns:
            ``(z, log_s_list, log_det_list)``: ``z`` is ``(B, n_group, samples // n_group)``; the lists
            hold each coupling's ``log s`` and each 1x1 convolution's log-determinant.
        """
        audio = batch["audio"]
        g = self.cfg.n_group
        cond = self._grouped_mel(batch["mel"], audio.shape[1])
        x = audio.unfold(1, g, g).transpose(1, 2)  # (B, n_group, samples // n_group)
        early, log_s_list, log_det_list = [], [], []
        for k, (conv, wn) in enumerate(zip(self.convs, self.flows)):
            if k > 0 and k % self.cfg.n_early_every == 0:
                early.append(x[:, :self.cfg.n_early_size])
                x = x[:, self.cfg.n_early_size:]
            x, log_det = conv(x)
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = wn(x_a, cond)
            shift, log_s = out[:, :half], out[:, half:]
            x = torch.cat([x_a, torch.exp(log_s) * x_b + shift], dim=1)
            log_s_list.append(log_s)
            log_det_list.append(log_det)
        early.append(x)
        return torch.cat(early, dim=1), log_s_list, log_det_list

    def reverse(self, mel: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Invert :meth:`forward`: noise ``z`` ``(B, n_group, samples // n_group)`` -> audio ``(B, samples)``.

        ``z`` is laid out as :meth:`forward` returns it (early outputs first), so
        ``reverse(mel, forward(batch)[0])`` gives ``batch["audio"]`` back up to rounding.
        """
        batch, _, steps = z.shape
        cond = self._grouped_mel(mel, steps * self.cfg.n_group)
        offset = z.shape[1] - self.n_remaining  # channels that left early sit before this offset
        x = z[:, offset:]
        for k in reversed(range(self.cfg.n_flows)):
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = self.flows[k](x_a, cond)
            shift, log_s = out[:, :half], out[:, half:]
            x = self.convs[k].inverse(torch.cat([x_a, (x_b - shift) * torch.exp(-log_s)], dim=1))
            if k > 0 and k % self.cfg.n_early_every == 0:
                offset -= self.cfg.n_early_size
                x = torch.cat([z[:, offset:offset + self.cfg.n_early_size], x], dim=1)
        return x.transpose(1, 2).reshape(batch, -1)

    @torch.no_grad()
    def infer(self, mel: torch.Tensor, sigma: float = 0.6) -> torch.Tensor:
        """Vocode: mel ``(B, n_mels, frames)`` -> audio ``(B, samples)`` in [-1, 1], samples ~ frames * hop_length.

        Draws Gaussian noise of standard deviation ``sigma`` and runs the flows backwards (:meth:`reverse`).
        """
        g = self.cfg.n_group
        samples = mel.shape[2] * self.upsample.stride[0]  # hop_length samples per frame
        z = sigma * torch.randn(mel.shape[0], g, samples // g, device=mel.device, dtype=mel.dtype)
        return self.reverse(mel, z).clamp(-1.0, 1.0)


class WaveGlowLoss(nn.Module):
    """Negative log-likelihood of the flow per audio sample (NVIDIA's reference normalisation).

    ``loss = (sum z^2 / (2 sigma^2) - sum log s - sum log|det W|) / (B * samples)``.
    """

    def __init__(self, sigma: float = 1.0):
        super().__init__()
        self.sigma = sigma

    def forward(self, outputs, batch: Batch) -> torch.Tensor:
        z, log_s_list, log_det_list = outputs
        z = at_least_fp32(z)  # half-precision sums of squares lose too much
        log_s_total = sum(at_least_fp32(log_s).sum() for log_s in log_s_list)
        log_det_total = sum(log_det_list)
        nll = (z * z).sum() / (2 * self.sigma ** 2) - log_s_total - log_det_total
        return nll / z.numel()


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` (random crops for training, first crop for validation).

    With ``data.mel_dir`` the mels are read from that folder (e.g. Tacotron2's teacher-forced mels, to fine-tune on
    what Tacotron2 predicts: Shen et al. 2018's recipe for its vocoder) and cropped with the audio on frame
    boundaries.

    Raises:
        DataError: see :class:`AudioMelDataset` (``data.mel_dir`` missing a mel, made with other settings).
        ValueError: with ``data.mel_dir``, ``waveglow.segment_length`` not a multiple of ``audio.hop_length``.
    """
    train_utts, val_utts = load_splits(cfg.data)
    seg = cfg.waveglow.segment_length
    with_mel, mel_dir = not cfg.waveglow.mel_on_device, cfg.data.mel_dir
    return (AudioMelDataset(train_utts, cfg.audio, seg, random_crop=True, seed=cfg.train.seed, with_mel=with_mel,
                            mel_dir=mel_dir),
            AudioMelDataset(val_utts, cfg.audio, seg, random_crop=False, with_mel=with_mel, mel_dir=mel_dir))


_MELS: dict = {}  # (device, audio settings) -> MelSpectrogram on that device


def mel_on_device(batch: Batch, cfg: Config) -> Batch:
    """Add ``batch["mel"]`` ``(B, n_mels, frames)``, the log-mel of ``batch["audio"]`` ``(B, samples)``, on the
    audio's device (``waveglow.mel_on_device``); a batch that has its mel already is returned as it is.
    The same :class:`MelSpectrogram` as the workers' (equal to float32 rounding: batched vs single STFT)."""
    if "mel" in batch:
        return batch
    key = (str(batch["audio"].device), dataclasses.astuple(cfg.audio))
    if key not in _MELS:
        _MELS[key] = MelSpectrogram.from_config(cfg.audio).to(batch["audio"].device)
    with torch.no_grad():
        return {**batch, "mel": _MELS[key](batch["audio"])}


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random WaveGlow batch with the shapes of NVIDIA's reference benchmark harness.

    ``{"mel": (B, n_mels, segment // hop_length + 1) standard normal, "audio": (B, segment) normal with
    standard deviation 0.1, "ids": [str] * B}``, float32 on the CPU. (The data pipeline's centred STFT
    gives one frame fewer; the reference's count is kept so both benchmarks run the same shapes.)

    Args:
        cfg: the config (``audio.n_mels``, ``audio.hop_length``, ``waveglow.segment_length``, ``waveglow.n_group``).
        batch_size: items ``B``.
        generator: the random stream (seeded by the caller).
        segment_length: samples per item; ``None``: ``waveglow.segment_length``.

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``n_group``.
    """
    segment = cfg.waveglow.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"waveglow synthetic_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.waveglow.n_group:
        raise ValueError(f"waveglow synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"waveglow.n_group={cfg.waveglow.n_group}")
    frames = segment // cfg.audio.hop_length + 1
    mel = torch.randn(batch_size, cfg.audio.n_mels, frames, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}


def optimize_for_training(model: nn.Module, cfg: Config, **compile_kwargs) -> nn.Module:
    """WaveGlow's fast path: ``torch.compile`` of the whole flow, in place (``nn.Module.compile``).

    One graph for the training crop's static shape (``dynamic=False`` by default): Inductor fuses each
    layer's gate (:func:`modules.waveglow.add_gated_activation`), the residual and skip sums, the
    weight-norm arithmetic and the affine couplings, and recomputes cheap elementwise results in the
    backward instead of storing them. Not per WN block: weight norm gives every parametrized convolution
    a class of its own, so per-block compilation would compile each of the ``n_flows`` blocks separately.
    The module, its parameters and its state-dict keys stay the same (checkpoints load either way); call
    it before wrapping the model in DistributedDataParallel. Inductor may sum in another order than eager
    mode (float32 losses agree to ~1e-7 relative, see ``tests/test_fast_path.py``).

    Args:
        model: a :class:`WaveGlow`.
        cfg: the run's config (unused; part of the ``ModelSpec.optimize_for_training`` contract).
        **compile_kwargs: passed to ``torch.compile``.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not a :class:`WaveGlow`.
    """
    if not isinstance(model, WaveGlow):
        raise TypeError(f"waveglow optimize_for_training expects a WaveGlow, got {type(model).__name__}")
    compile_kwargs.setdefault("dynamic", False)
    model.compile(**compile_kwargs)
    return model


# --- inference.py --------------------------------------------------------------------------------------------

def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """WaveGlow's ``inference.py`` options: what to vocode (``--mel`` or ``--wav``) and ``--sigma``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--mel", help="a torch tensor file (n_mels, frames) to vocode")
    source.add_argument("--wav", help="a wav whose mel is vocoded (copy-synthesis)")
    parser.add_argument("--sigma", type=float, help="noise scale (default: waveglow.infer_sigma, 0.6)")


def vocode(model: nn.Module, mel: torch.Tensor, cfg: Config, sigma: Optional[float] = None) -> torch.Tensor:
    """Mel ``(n_mels, frames)`` -> audio ``(samples,)`` in [-1, 1] on the CPU (``sigma``: ``waveglow.infer_sigma``)."""
    device = next(model.parameters()).device
    sigma = cfg.waveglow.infer_sigma if sigma is None else sigma
    return model.infer(mel.unsqueeze(0).to(device), sigma=sigma)[0].float().cpu()


LOG_AUDIO_SECONDS = 2.0
"""Longest clip vocoded for TensorBoard at each validation, in seconds (the validation crop,
``waveglow.segment_length`` samples, is usually shorter)."""


def log_validation(model: nn.Module, batch: Batch, outputs, step: int, writer: Any, output_dir: Any,
                   cfg: Optional[Config] = None) -> None:
    """Audio of the first utterance of a validation batch, for TensorBoard's audio tab.

    ``audio/vocoded``: the mel of that item ``batch["mel"][0]`` ``(n_mels, frames)``, at most
    :data:`LOG_AUDIO_SECONDS` of it, vocoded by :func:`vocode` (``waveglow.infer_sigma``) with the same noise
    at every validation (:func:`utils.plotting.fixed_random_state`): ``frames * hop_length`` samples at
    ``audio.sampling_rate`` Hz. ``audio/ground_truth``: the item's audio ``batch["audio"][0]``, as many
    samples, at the first validation of the run only. The validation set's crops are the first
    ``segment_length`` samples of each clip and its loader does not shuffle, so it is the same utterance
    and the same crop every time. Nothing is written without a ``writer`` or a ``cfg`` (``output_dir`` and
    ``outputs`` are not used).

    Args:
        model: the :class:`WaveGlow` (unwrapped, in eval mode).
        batch: ``{"mel": (B, n_mels, frames), "audio": (B, samples), ...}`` on the model's device.
        outputs: the model's outputs for ``batch`` (unused).
        step: the training step.
        writer: a ``SummaryWriter`` or ``None``.
        output_dir: the run's folder (unused).
        cfg: the run's config (``audio`` and ``waveglow`` sections).
    """
    if writer is None or cfg is None:
        return
    rate, hop = cfg.audio.sampling_rate, cfg.audio.hop_length
    frames = max(1, min(batch["mel"].shape[2], int(LOG_AUDIO_SECONDS * rate / hop)))
    mel = batch["mel"][0, :, :frames].float()
    with fixed_random_state(mel.device):
        audio = vocode(model, mel, cfg)
    add_audio(writer, "audio/vocoded", audio, step, rate)
    if first_time(writer, "audio/ground_truth"):
        add_audio(writer, "audio/ground_truth", batch["audio"][0, :frames * hop], step, rate)


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for WaveGlow: vocode ``--mel`` or the mel of ``--wav`` into the wav ``--output``.

    Raises:
        ValueError: neither ``--mel`` nor ``--wav``, a bad ``--sigma``, or an output that is not a .wav path.
        DataError: see :func:`read_mel`.
    """
    if not (args.mel or args.wav):
        raise ValueError(f"{args.checkpoint} is a WaveGlow checkpoint: give --mel or --wav")
    if args.sigma is not None and not 0 <= args.sigma < float("inf"):
        raise ValueError(f"--sigma must be a finite number >= 0, got {args.sigma}")
    output = check_wav_output(args.output)
    audio = vocode(model, read_mel(args, cfg), cfg, args.sigma)
    save_wav(output, audio, cfg.audio.sampling_rate)
    print(f"wrote {output} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return [output]


# --- scripts/benchmark.py: NVIDIA's published shapes (those of its reference benchmark harness) -----------------

_TINY = ("waveglow.n_flows=4", "waveglow.n_early_every=2", "waveglow.wn_layers=2")
BENCHMARK_CASES = (
    BenchmarkCase("waveglow256_b12_s16000", ("waveglow.wn_channels=256", "waveglow.segment_length=16000"), 12,
                  {"segment_length": 16000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=16", "waveglow.segment_length=2048"), 2,
                                     {"segment_length": 2048})),
    BenchmarkCase("waveglow512_b10_s8000", ("waveglow.wn_channels=512", "waveglow.segment_length=8000"), 10,
                  {"segment_length": 8000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=32", "waveglow.segment_length=1024"), 2,
                                     {"segment_length": 1024})),
)

PICKLED_CLASSES = ("glow.WaveGlow", "glow.WN", "glow.Invertible1x1Conv", "torch.nn.modules.conv.Conv1d",
                   "torch.nn.modules.conv.ConvTranspose1d", "torch.nn.modules.container.ModuleList",
                   "torch.nn.utils.weight_norm.WeightNorm")
"""What NVIDIA's published WaveGlow file pickles: its ``glow`` classes, torch's modules and old weight norm hook."""


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """NVIDIA/waveglow's checkpoints (``waveglow_256channels_*.pt``; ``{"model": <the pickled glow.WaveGlow>,
    "iteration", "optimizer", "learning_rate"}``), or ``None`` for another format. The pickled module arrives as
    records (:data:`PICKLED_CLASSES`, never run); its parameters are renamed: ``WN.<i>`` -> ``flows.<i>``
    (``in_layers`` -> ``dilated``, ``res_skip_layers`` -> ``res_skip``, ``cond_layer`` -> ``cond``), old weight norm's
    ``weight_g``/``weight_v`` -> the parametrization, and ``convinv.<i>.conv``'s ``(c, c, 1)`` weight -> the ``(c, c)``
    matrix ``convs.<i>``. (Read from NVIDIA's checkpoint code for the layout; its forward pass from the same weights
    equals this model's.)"""
    if not isinstance(loaded, dict) or not isinstance(loaded.get("model"), Record):
        return None
    renamed, parts = {}, {"in_layers": "dilated", "res_skip_layers": "res_skip", "cond_layer": "cond"}
    for key, value in record_parameters(loaded["model"]).items():
        match = re.match(r"^WN\.(\d+)\.(\w+)\.(.*)$", key)
        if match:
            key = f"flows.{match.group(1)}.{parts.get(match.group(2), match.group(2))}.{match.group(3)}"
        elif re.match(r"^convinv\.\d+\.conv\.weight$", key):
            key, value = re.sub(r"^convinv\.(\d+)\.conv\.", r"convs.\1.", key), value.squeeze(-1)
        renamed[weight_norm_key(key)] = value
    return Weights("NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow)", "waveglow", renamed)


# --- scripts/export.py --format onnx ------------------------------------------------------------------------------

class WaveGlowInferExport(nn.Module):
    """:meth:`WaveGlow.infer` with the noise as an input, as it is exported: ``mel`` ``(B, n_mels, frames)`` and ``z``
    ``(B, n_group, steps)`` -> ``audio`` ``(B, steps * n_group)`` in [-1, 1].

    The flows run backwards as in :meth:`WaveGlow.reverse`, with two changes that leave the result as it is (up to
    float32 rounding) and make the graph simpler: each invertible 1x1 convolution's inverse weight is computed
    once, here (a constant of the file, not a matrix inverse per call; NVIDIA's export does the same), and the
    upsampled mel is grouped by a reshape instead of ``unfold``. ``steps`` is ``frames * hop_length // n_group``
    for the whole mel (what ``infer`` draws); fewer steps vocode a prefix.
    """

    def __init__(self, model: WaveGlow):
        super().__init__()
        self.cfg = model.cfg
        self.n_remaining = model.n_remaining
        self.upsample = model.upsample
        self.flows = model.flows
        for k, conv in enumerate(model.convs):
            with torch.no_grad():
                inverse = torch.linalg.inv(at_least_fp32(conv.weight)).to(conv.weight.dtype)
            self.register_buffer(f"inverse_{k}", inverse.unsqueeze(-1), persistent=False)

    def forward(self, mel: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        batch, g, steps = z.shape
        mel = self.upsample(mel)[:, :, :steps * g]  # (B, n_mels, samples): win_length >= hop_length leaves enough
        cond = mel.reshape(batch, mel.shape[1], steps, g).transpose(2, 3).reshape(batch, -1, steps)
        offset = g - self.n_remaining
        x = z[:, offset:]
        for k in reversed(range(self.cfg.n_flows)):
            half = x.shape[1] // 2
            x_a, x_b = x[:, :half], x[:, half:]
            out = self.flows[k](x_a, cond)
            x = torch.cat([x_a, (x_b - out[:, :half]) * torch.exp(-out[:, half:])], dim=1)
            x = torch.nn.functional.conv1d(x, getattr(self, f"inverse_{k}"))
            if k > 0 and k % self.cfg.n_early_every == 0:
                offset -= self.cfg.n_early_size
                x = torch.cat([z[:, offset:offset + self.cfg.n_early_size], x], dim=1)
        return x.transpose(1, 2).reshape(batch, -1).clamp(-1.0, 1.0)


def export_parts(model: WaveGlow, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: one part, ``waveglow``: ``mel`` ``(B, n_mels, frames)`` and the noise ``z``
    ``(B, n_group, frames * hop_length // n_group)``, drawn by the caller from N(0, sigma^2) (sigma:
    ``waveglow.infer_sigma``, 0.6) -> ``audio`` ``(B, samples)`` in [-1, 1]; batch, frames and steps dynamic (checked
    at 1 x 24 and 2 x 13 frames). Checked against :meth:`WaveGlow.reverse` on the same noise (what ``infer`` runs).
    Source: NVIDIA DeepLearningExamples, ``tensorrt/convert_waveglow2onnx.py`` (inputs ``mel`` and ``z``)."""
    gen = torch.Generator().manual_seed(0)
    n_mels, g, hop = cfg.audio.n_mels, cfg.waveglow.n_group, cfg.audio.hop_length
    sigma = cfg.waveglow.infer_sigma

    def example(batch: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch, n_mels, frames, generator=gen),
                sigma * torch.randn(batch, g, frames * hop // g, generator=gen))

    return [ExportPart(
        name="waveglow", module=WaveGlowInferExport(model), inputs=example(1, 24), other_inputs=example(2, 13),
        input_names=("mel", "z"), output_names=("audio",),
        dynamic_axes={"mel": {0: "batch", 2: "frames"}, "z": {0: "batch", 2: "steps"},
                      "audio": {0: "batch", 1: "samples"}},
        reference=lambda mel, z: model.reverse(mel, z).clamp(-1.0, 1.0),
        description=f"mel (B, {n_mels}, frames), z (B, {g}, frames * {hop} // {g}) -> audio (B, samples)")]


register("waveglow", ModelSpec(
    config_cls=WaveGlowConfig,
    build_model=lambda cfg: WaveGlow(cfg.waveglow, cfg.audio.n_mels, cfg.audio.hop_length, cfg.audio.win_length),
    build_criterion=lambda cfg: WaveGlowLoss(cfg.waveglow.sigma),
    build_datasets=build_datasets,
    collate_fn=collate_audio_mel,
    count_items=lambda batch: batch["audio"].numel(),
    add_inference_args=add_inference_args,
    infer=infer,
    vocode=vocode,
    log_validation=log_validation,
    synthetic_batch=synthetic_batch,
    optimize_for_training=optimize_for_training,
    benchmark_cases=BENCHMARK_CASES,
    on_device=mel_on_device,
    data_advice="raise data.num_workers, or compute the mels on the device with waveglow.mel_on_device=true",
    blocks=lambda model: list(model.flows),  # the WN coupling networks: nearly all weights and activations
    read_published=read_published,
    pickled_classes=PICKLED_CLASSES,
    export_parts=export_parts,
))
