"""The models this project trains, and the small contract ``train.py`` and ``inference.py`` rely on.

This is the file you edit. ``train.py`` never names a model: it looks one up in :data:`MODELS` and uses
the :class:`ModelSpec` found there. To train your own network, write a config dataclass, an
``nn.Module`` whose ``forward`` takes a batch dict, a loss and a dataset builder, then register a
``ModelSpec`` under a new name and give it a section of the same name in ``config.json``.

The contract, for a batch dict ``batch`` of tensors (plus an ``"ids"`` list of utterance ids):

* ``model(batch)`` returns the model's outputs (any structure the loss understands);
* ``criterion(outputs, batch)`` returns a scalar loss tensor;
* ``count_items(batch)`` returns the number of items the batch holds (audio samples, mel frames),
  for the items/s figure;
* the model's config dataclass has ``batch_size`` (per process), ``learning_rate`` and
  ``weight_decay`` (Adam) fields, which the loop reads;
* ``build_datasets(cfg)`` returns ``(train_dataset, val_dataset)``; ``collate_fn`` turns a list of
  items into a batch dict (``None`` for PyTorch's default collation).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from utils.config import Config

Batch = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything the training loop and inference need to know about one model.

    Attributes:
        config_cls: dataclass describing this model's section of ``config.json``.
        build_model: ``cfg -> nn.Module``; the module's ``forward`` takes a batch dict.
        build_criterion: ``cfg -> callable(outputs, batch) -> scalar loss``.
        build_datasets: ``cfg -> (train_dataset, val_dataset)``.
        collate_fn: list of dataset items -> batch dict, or ``None`` for the default collation.
        count_items: batch -> number of items (audio samples or mel frames) it holds.
        log_validation: optional rank-0 hook ``(model, batch, outputs, step, writer, output_dir)`` that
            draws pictures of a validation batch (alignments, mels).
        synthetic_batch: optional ``(cfg, batch_size, generator, **shape) -> batch``: random CPU tensors
            with the keys, shapes and dtypes of a real training batch (``scripts/benchmark.py``, tests);
            ``shape`` keywords are model-specific (segment length, text and mel length ranges).
        optimize_for_training: optional ``(model, cfg, **compile_kwargs) -> model``: switch the model to
            its fast path in place (what ``train.compile=true`` asks for); the mathematics must stay
            those of the eager path. ``compile_kwargs`` go to ``torch.compile`` (tests pass
            ``backend="aot_eager"``).
    """

    config_cls: type
    build_model: Callable[[Config], nn.Module]
    build_criterion: Callable[[Config], Callable[[Any, Batch], torch.Tensor]]
    build_datasets: Callable[[Config], tuple[Dataset, Dataset]]
    collate_fn: Optional[Callable[[list], Batch]]
    count_items: Callable[[Batch], int]
    log_validation: Optional[Callable[..., None]] = None
    synthetic_batch: Optional[Callable[..., Batch]] = None
    optimize_for_training: Optional[Callable[..., nn.Module]] = None


MODELS: dict[str, ModelSpec] = {}

# >>> waveglow
from modules.waveglow import WN, Invertible1x1Conv, at_least_fp32
from utils.data_utils import AudioMelDataset, collate_audio_mel, load_splits


@dataclasses.dataclass
class WaveGlowConfig:
    """The ``waveglow`` section of ``config.json`` (defaults: NVIDIA's published LJSpeech model).

    ``n_group`` audio samples are squeezed into channels; every ``n_early_every`` flows,
    ``n_early_size`` channels leave the flow early. ``segment_length`` (samples) is the training crop.
    ``sigma`` is the standard deviation of the Gaussian prior during training; ``infer_sigma`` the one
    sampled from at inference (NVIDIA uses 0.6 for cleaner audio).
    """

    n_flows: int = 12
    n_group: int = 8
    n_early_every: int = 4
    n_early_size: int = 2
    wn_layers: int = 8
    wn_channels: int = 256
    wn_kernel_size: int = 3
    sigma: float = 1.0
    infer_sigma: float = 0.6
    segment_length: int = 16000
    batch_size: int = 12
    learning_rate: float = 1e-4
    weight_decay: float = 0.0


class WaveGlow(nn.Module):
    """WaveGlow: a normalising flow from audio to Gaussian noise, conditioned on mel spectrograms.

    Source: Prenger, Valle and Catanzaro, "WaveGlow" (ICASSP 2019); NVIDIA's reference for sizes.

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


def build_waveglow_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`AudioMelDataset` (random crops for training, first crop for validation)."""
    train_utts, val_utts = load_splits(cfg.data)
    seg = cfg.waveglow.segment_length
    return (AudioMelDataset(train_utts, cfg.audio, seg, random_crop=True, seed=cfg.train.seed),
            AudioMelDataset(val_utts, cfg.audio, seg, random_crop=False))


def synthetic_waveglow_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                             segment_length: Optional[int] = None) -> Batch:
    """Random WaveGlow batch with the shapes of NVIDIA's reference benchmark (``shared/bench``).

    ``{"mel": (B, n_mels, segment // hop_length + 1) standard normal, "audio": (B, segment) normal with
    standard deviation 0.1, "ids": [str] * B}``, float32 on the CPU. (The data pipeline's centred STFT
    gives one frame fewer; the reference's count is kept so both benchmarks run the same shapes.)

    Args:
        cfg: the config (``audio.n_mels``, ``audio.hop_length``, ``waveglow.segment_length``,
            ``waveglow.n_group``).
        batch_size: items ``B``.
        generator: the random stream (seeded by the caller).
        segment_length: samples per item; ``None``: ``waveglow.segment_length``.

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``n_group``.
    """
    segment = cfg.waveglow.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"synthetic_waveglow_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.waveglow.n_group:
        raise ValueError(f"synthetic_waveglow_batch: segment_length {segment} must be a positive multiple of "
                         f"waveglow.n_group={cfg.waveglow.n_group}")
    frames = segment // cfg.audio.hop_length + 1
    mel = torch.randn(batch_size, cfg.audio.n_mels, frames, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}


def optimize_waveglow_for_training(model: nn.Module, cfg: Config, **compile_kwargs) -> nn.Module:
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
        raise TypeError(f"optimize_waveglow_for_training expects a WaveGlow, got {type(model).__name__}")
    compile_kwargs.setdefault("dynamic", False)
    model.compile(**compile_kwargs)
    return model


MODELS["waveglow"] = ModelSpec(
    config_cls=WaveGlowConfig,
    build_model=lambda cfg: WaveGlow(cfg.waveglow, cfg.audio.n_mels, cfg.audio.hop_length, cfg.audio.win_length),
    build_criterion=lambda cfg: WaveGlowLoss(cfg.waveglow.sigma),
    build_datasets=build_waveglow_datasets,
    collate_fn=collate_audio_mel,
    count_items=lambda batch: batch["audio"].numel(),
    synthetic_batch=synthetic_waveglow_batch,
    optimize_for_training=optimize_waveglow_for_training,
)
# <<< waveglow


# >>> tacotron2
from pathlib import Path

import torch.nn.functional as F

from modules.tacotron2 import Decoder, Encoder, Postnet, get_padding_mask
from utils.data_utils import load_splits
from utils.plotting import plot_alignment, plot_gate, plot_spectrogram
from utils.text.symbols import symbols as tacotron2_symbols
from utils.text_mel_data import TextMelCollate, TextMelDataset


@dataclasses.dataclass
class Tacotron2Config:
    """The ``tacotron2`` section of ``config.json`` (defaults: NVIDIA's LJSpeech hyper-parameters).

    Sizes are in units/channels; ``*_kernel_size`` in characters (encoder), encoder steps (attention
    location filters) or mel frames (post-net). ``max_decoder_steps`` caps free-running synthesis (in mel
    frames, ~11.6 ms each at 22050 Hz / hop 256); ``gate_threshold`` is the stop probability that ends it.
    ``max_mel_frames`` drops longer training/validation clips (0: keep all). ``mask_padding`` zeroes the
    outputs at padded frames (the loss ignores them either way). ``n_mels`` comes from the ``audio``
    section. ``batch_size`` is per process; ``learning_rate`` and ``weight_decay`` are Adam's.
    """

    n_symbols: int = len(tacotron2_symbols)
    symbols_embedding_dim: int = 512
    encoder_n_convolutions: int = 3
    encoder_embedding_dim: int = 512
    encoder_kernel_size: int = 5
    attention_rnn_dim: int = 1024
    attention_dim: int = 128
    attention_location_n_filters: int = 32
    attention_location_kernel_size: int = 31
    decoder_rnn_dim: int = 1024
    prenet_dim: int = 256
    max_decoder_steps: int = 1000
    gate_threshold: float = 0.5
    p_attention_dropout: float = 0.1
    p_decoder_dropout: float = 0.1
    postnet_embedding_dim: int = 512
    postnet_kernel_size: int = 5
    postnet_n_convolutions: int = 5
    text_cleaners: list[str] = dataclasses.field(default_factory=lambda: ["english_cleaners"])
    max_mel_frames: int = 1000
    mask_padding: bool = True
    batch_size: int = 64
    learning_rate: float = 1e-3
    weight_decay: float = 1e-6


class Tacotron2(nn.Module):
    """Tacotron2: characters -> mel spectrogram, with a stop gate and attention alignments.

    Source: Shen et al. 2018, "Natural TTS synthesis by conditioning WaveNet on mel spectrogram
    predictions"; sizes, initialisation and dropout follow NVIDIA's reference (28.19 M parameters with
    the defaults and 148 symbols). Symbol embedding -> :class:`modules.tacotron2.Encoder` ->
    location-sensitive attention :class:`modules.tacotron2.Decoder` (one frame per step) ->
    :class:`modules.tacotron2.Postnet` residual.

    Args:
        cfg: a :class:`Tacotron2Config`.
        n_mels: mel channels (``cfg.audio.n_mels``).

    Raises:
        ValueError: ``n_symbols`` smaller than the symbol table, or ``symbols_embedding_dim`` different
            from ``encoder_embedding_dim`` (the encoder convolutions take the embedding directly).
    """

    def __init__(self, cfg: Tacotron2Config, n_mels: int):
        super().__init__()
        if cfg.n_symbols < len(tacotron2_symbols):
            raise ValueError(f"tacotron2.n_symbols={cfg.n_symbols} is smaller than the symbol table "
                             f"({len(tacotron2_symbols)} symbols)")
        if cfg.symbols_embedding_dim != cfg.encoder_embedding_dim:
            raise ValueError(f"tacotron2.symbols_embedding_dim ({cfg.symbols_embedding_dim}) must equal "
                             f"tacotron2.encoder_embedding_dim ({cfg.encoder_embedding_dim})")
        self.cfg = cfg
        self.n_mels = n_mels
        self.mask_padding = cfg.mask_padding
        self.embedding = nn.Embedding(cfg.n_symbols, cfg.symbols_embedding_dim)
        # Uniform with the variance of Xavier init for a (n_symbols, dim) matrix (NVIDIA's reference).
        bound = (3.0 * 2.0 / (cfg.n_symbols + cfg.symbols_embedding_dim)) ** 0.5
        nn.init.uniform_(self.embedding.weight, -bound, bound)
        self.encoder = Encoder(cfg.encoder_embedding_dim, cfg.encoder_n_convolutions, cfg.encoder_kernel_size)
        self.decoder = Decoder(
            n_mels, encoder_dim=cfg.encoder_embedding_dim, attention_rnn_dim=cfg.attention_rnn_dim,
            decoder_rnn_dim=cfg.decoder_rnn_dim, prenet_dim=cfg.prenet_dim, attention_dim=cfg.attention_dim,
            attention_location_n_filters=cfg.attention_location_n_filters,
            attention_location_kernel_size=cfg.attention_location_kernel_size,
            max_decoder_steps=cfg.max_decoder_steps, gate_threshold=cfg.gate_threshold,
            p_attention_dropout=cfg.p_attention_dropout, p_decoder_dropout=cfg.p_decoder_dropout)
        self.postnet = Postnet(n_mels, cfg.postnet_embedding_dim, cfg.postnet_kernel_size,
                               cfg.postnet_n_convolutions)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Teacher-forced pass over a padded batch from :class:`utils.text_mel_data.TextMelCollate`.

        Args:
            batch: ``{"text": (B, L) long, "text_lengths": (B,), "mel": (B, n_mels, T),
                "mel_lengths": (B,), ...}``.

        Returns:
            ``{"mel": (B, n_mels, T), "mel_postnet": (B, n_mels, T), "gate": (B, T) logits,
            "alignments": (B, T, L)}``. With ``mask_padding``, mels are 0 and gate logits 1e3 (certain
            stop) at padded frames, and the post-net sees zeros there.

        Raises:
            ValueError: the mel does not have ``n_mels`` channels or the lengths do not fit the padding.
        """
        text, text_lengths = batch["text"], batch["text_lengths"]
        mels, mel_lengths = batch["mel"], batch["mel_lengths"]
        text_mask = get_padding_mask(text_lengths, text.size(1))
        embedded = self.embedding(text).transpose(1, 2)  # (B, E, L)
        memory = self.encoder(embedded, text_lengths)
        mel_out, gate_out, alignments = self.decoder(memory, mels, text_mask)
        frame_mask = get_padding_mask(mel_lengths, mels.size(2)) if self.mask_padding else None
        if frame_mask is not None:
            mel_out = mel_out.masked_fill(frame_mask.unsqueeze(1), 0.0)
        mel_postnet = mel_out + self.postnet(mel_out, frame_mask)
        if frame_mask is not None:
            mel_postnet = mel_postnet.masked_fill(frame_mask.unsqueeze(1), 0.0)
            gate_out = gate_out.masked_fill(frame_mask, 1e3)
        return {"mel": mel_out, "mel_postnet": mel_postnet, "gate": gate_out, "alignments": alignments}

    @torch.no_grad()
    def inference(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Synthesize from symbol ids without a target (free-running decoder, see ``Decoder.inference``).

        Call ``model.eval()`` first (batch norm statistics, no decoder dropout); the pre-net keeps its
        dropout by design. Stops when the stop gate fires, or at ``max_decoder_steps`` with a warning.

        Args:
            text: ``(1, L)`` long symbol ids (``(B, L)`` without padding also works).

        Returns:
            ``(mel_postnet (1, n_mels, T), gate logits (1, T), alignments (1, T, L))``.

        Raises:
            ValueError: ``text`` is not a 2-D integer tensor with at least one symbol.
        """
        if text.dim() != 2 or text.size(1) == 0 or text.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Tacotron2.inference expects symbol ids of shape (1, L), L >= 1, got "
                             f"{tuple(text.shape)} {text.dtype}")
        memory = self.encoder(self.embedding(text).transpose(1, 2))
        mel_out, gate_out, alignments = self.decoder.inference(memory)
        mel_postnet = mel_out + self.postnet(mel_out)
        return mel_postnet, gate_out, alignments


class Tacotron2Loss(nn.Module):
    """``MSE(mel) + MSE(post-net mel) + BCE-with-logits(gate)``, each averaged over real frames only.

    The Tacotron2 objective (Shen et al. 2018; NVIDIA's reference), except that padded frames
    (``t >= mel_lengths``) are excluded from the averages instead of being counted as zero-error frames,
    so the value does not depend on how much padding a batch has. Computed in float32 (safe under
    autocast). The last terms are kept, detached, in :attr:`last_terms` for logging.
    """

    def __init__(self):
        super().__init__()
        self.last_terms: dict[str, torch.Tensor] = {}

    def forward(self, outputs: dict[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        """Scalar loss for :meth:`Tacotron2.forward` ``outputs`` and the batch they came from.

        Raises:
            ValueError: the predicted and target mels differ in shape.
        """
        target, gate_target = batch["mel"].float(), batch["gate"].float()
        if outputs["mel"].shape != target.shape:
            raise ValueError(f"Tacotron2Loss: predicted mel {tuple(outputs['mel'].shape)} vs target "
                             f"{tuple(target.shape)}")
        keep = (~get_padding_mask(batch["mel_lengths"], target.size(2))).float()  # (B, T)
        n_frames = keep.sum().clamp(min=1.0)
        n_values = n_frames * target.size(1)

        def masked_mse(pred: torch.Tensor) -> torch.Tensor:
            return ((pred.float() - target) ** 2 * keep.unsqueeze(1)).sum() / n_values

        mel_loss = masked_mse(outputs["mel"])
        postnet_loss = masked_mse(outputs["mel_postnet"])
        gate_loss = (F.binary_cross_entropy_with_logits(outputs["gate"].float(), gate_target, reduction="none")
                     * keep).sum() / n_frames
        self.last_terms = {"mel": mel_loss.detach(), "mel_postnet": postnet_loss.detach(),
                           "gate": gate_loss.detach()}
        return mel_loss + postnet_loss + gate_loss


def build_tacotron2_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`utils.text_mel_data.TextMelDataset` from ``cfg.data`` splits.

    Clips longer than ``tacotron2.max_mel_frames`` (when > 0) are skipped in both, with a warning.
    """
    train_utts, val_utts = load_splits(cfg.data)
    model_cfg = cfg.tacotron2
    max_frames = model_cfg.max_mel_frames if model_cfg.max_mel_frames > 0 else None
    return tuple(TextMelDataset(utts, cfg.audio, cfg.data, text_cleaners=model_cfg.text_cleaners,
                                max_mel_frames=max_frames)
                 for utts in (train_utts, val_utts))


def tacotron2_count_items(batch: Batch) -> int:
    """Mel frames in the batch (padding excluded)."""
    return int(batch["mel_lengths"].sum())


def log_tacotron2_validation(model: nn.Module, batch: Batch, outputs: dict[str, torch.Tensor], step: int,
                             writer: Any, output_dir: Any) -> None:
    """Pictures of the first utterance of a validation batch.

    Always saves ``output_dir/alignment_<step>.png``; with a TensorBoard ``writer`` also adds the figures
    ``alignment``, ``mel_target``, ``mel_predicted`` (post-net output) and ``gate``. Padding is cut off.
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


def synthetic_tacotron2_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                              text_lengths: tuple[int, int] = (60, 160), mel_lengths: tuple[int, int] = (300, 800),
                              longest_mel: int = 800) -> Batch:
    """Random padded Tacotron2 batch, laid out as :class:`utils.text_mel_data.TextMelCollate` lays it out.

    Lengths are drawn exactly as NVIDIA's reference benchmark draws them (``shared/bench``; same calls
    on the same generator, so a generator seeded 0 gives the same lengths and the same mel-frame count):
    text lengths uniform in ``[text_lengths[0], text_lengths[1])`` sorted descending, mel lengths uniform
    in ``[mel_lengths[0], mel_lengths[1])`` with the first set to ``longest_mel``. Symbols are uniform in
    ``[1, n_symbols)``, mels standard normal; padding is zero, the gate target 1 from each last frame on.

    Returns:
        ``{"text": (B, L) long, "text_lengths": (B,), "mel": (B, n_mels, T), "gate": (B, T),
        "mel_lengths": (B,), "ids": [str] * B}`` on the CPU, ``L``/``T`` the longest lengths.

    Raises:
        ValueError: ``batch_size < 1``, an empty or non-positive length range, or ``longest_mel`` below
            the mel range.
    """
    if batch_size < 1:
        raise ValueError(f"synthetic_tacotron2_batch: batch_size must be >= 1, got {batch_size}")
    for name, (low, high) in (("text_lengths", text_lengths), ("mel_lengths", mel_lengths)):
        if not 1 <= low < high:
            raise ValueError(f"synthetic_tacotron2_batch: {name} must be a range [low, high) with 1 <= low < high, "
                             f"got ({low}, {high})")
    if longest_mel < mel_lengths[1] - 1:
        raise ValueError(f"synthetic_tacotron2_batch: longest_mel={longest_mel} is below the mel length range "
                         f"{mel_lengths}")
    text_lens = torch.randint(text_lengths[0], text_lengths[1], (batch_size,), generator=generator)
    text_lens = text_lens.sort(descending=True).values
    mel_lens = torch.randint(mel_lengths[0], mel_lengths[1], (batch_size,), generator=generator)
    mel_lens[0] = longest_mel
    max_text, max_frames = int(text_lens.max()), int(mel_lens.max())
    text = torch.randint(1, cfg.tacotron2.n_symbols, (batch_size, max_text), generator=generator)
    mel = torch.randn(batch_size, cfg.audio.n_mels, max_frames, generator=generator)
    text = text.masked_fill(get_padding_mask(text_lens, max_text), 0)
    frame_pad = get_padding_mask(mel_lens, max_frames)
    mel = mel.masked_fill(frame_pad.unsqueeze(1), 0.0)
    gate = (torch.arange(max_frames).unsqueeze(0) >= (mel_lens - 1).unsqueeze(1)).float()
    return {"text": text, "text_lengths": text_lens, "mel": mel, "gate": gate, "mel_lengths": mel_lens,
            "ids": [f"synthetic_{i}" for i in range(batch_size)]}


TACOTRON2_TEXT_BUCKET = 32
"""Symbols the fast path pads the text axis to a multiple of: LJSpeech's texts (<= ~190 symbols) give 6
shapes, and the padding (masked, so it changes no output) adds at most 31 positions to the attention's
per-step tensors, which autograd keeps for every decoder step (at batch 128, 159 symbols: 160)."""


def optimize_tacotron2_for_training(model: nn.Module, cfg: Config, text_bucket: int = TACOTRON2_TEXT_BUCKET,
                                    **compile_kwargs) -> nn.Module:
    """Tacotron2's fast path: the decoder step compiled once and reused at every step, in place.

    See :meth:`modules.tacotron2.Decoder.enable_fast_path`: ``torch.compile`` of the per-step function
    (``fullgraph=True``, static shapes: the text axis padded to a multiple of ``text_bucket`` and masked,
    which leaves the outputs unchanged), step 0 eager. The encoder, pre-net (one batched call over all
    frames), post-net and loss stay eager: they run once per batch, the step runs ``T`` (~800) times.
    Also raises Dynamo's recompile limit to 64 graphs (a process-wide setting), room for every text
    bucket in training and validation (whose last batch may be smaller). Parameters and state-dict keys
    are unchanged.

    Args:
        model: a :class:`Tacotron2`.
        cfg: the run's config (unused; part of the ``ModelSpec.optimize_for_training`` contract).
        text_bucket: symbols the text axis is padded to a multiple of.
        **compile_kwargs: passed to ``torch.compile``.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not a :class:`Tacotron2`.
        ValueError: ``text_bucket < 1``.
    """
    if not isinstance(model, Tacotron2):
        raise TypeError(f"optimize_tacotron2_for_training expects a Tacotron2, got {type(model).__name__}")
    import torch._dynamo  # noqa: F401  (makes torch._dynamo.config reachable)
    dynamo_config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(dynamo_config, limit, max(getattr(dynamo_config, limit), 64))
    model.decoder.enable_fast_path(text_bucket, **compile_kwargs)
    return model


MODELS["tacotron2"] = ModelSpec(
    config_cls=Tacotron2Config,
    build_model=lambda cfg: Tacotron2(cfg.tacotron2, cfg.audio.n_mels),
    build_criterion=lambda cfg: Tacotron2Loss(),
    build_datasets=build_tacotron2_datasets,
    collate_fn=TextMelCollate(),
    count_items=tacotron2_count_items,
    log_validation=log_tacotron2_validation,
    synthetic_batch=synthetic_tacotron2_batch,
    optimize_for_training=optimize_tacotron2_for_training,
)
# <<< tacotron2
