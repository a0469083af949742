"""Tacotron2 (text -> mel): config, model, loss, data, fast path, inference, benchmark shapes, registration.

Source: Shen et al. 2018, "Natural TTS synthesis by conditioning WaveNet on mel spectrogram predictions"
(ICASSP); sizes, initialisation and dropout follow NVIDIA's reference implementation. The layers are in
``modules/tacotron2.py`` (encoder, attention decoder, post-net); the text front end in ``utils/text``; the
text/mel dataset in ``utils/text_mel_data.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from model import MODELS, Batch, BenchmarkCase, ModelSpec, register
from modules.tacotron2 import Decoder, Encoder, Postnet, get_padding_mask
from utils.audio_processing import check_wav_output, griffin_lim, save_wav
from utils.config import AudioConfig, Config, setting
from utils.data_utils import DataError, load_splits
from utils.onnx_export import ExportPart
from utils.published import Weights
from utils.plotting import add_audio, first_time, fixed_random_state, plot_alignment, plot_gate, plot_spectrogram
from utils.text import sequence_to_text, text_to_sequence
from utils.text.symbols import symbols
from utils.text_mel_data import TextMelCollate, TextMelDataset, mel_cache_path


@dataclasses.dataclass
class Tacotron2Config:
    """The ``tacotron2`` section of ``config.json`` (defaults: NVIDIA's LJSpeech hyper-parameters).

    Sizes are in units/channels; ``*_kernel_size`` in characters (encoder), encoder steps (attention
    location filters) or mel frames (post-net). ``max_decoder_steps`` caps free-running synthesis (in mel
    frames, ~11.6 ms each at 22050 Hz / hop 256); ``gate_threshold`` is the stop probability that ends it.
    ``max_mel_frames`` drops longer training/validation clips (0: keep all). ``mel_cache_dir``: where
    ``scripts/preprocess.py`` caches mels (inside ``data.dataset_path``, or absolute; empty: no cache); used
    when it exists. ``mask_padding`` zeroes the
    outputs at padded frames (the loss ignores them either way). ``n_mels`` comes from the ``audio``
    section. ``batch_size`` is per process; ``learning_rate`` and ``weight_decay`` are Adam's.
    """

    n_symbols: int = setting(len(symbols), ge=1)
    symbols_embedding_dim: int = setting(512, ge=1)
    encoder_n_convolutions: int = setting(3, ge=0)
    encoder_embedding_dim: int = setting(512, ge=2)
    encoder_kernel_size: int = setting(5, ge=1)
    attention_rnn_dim: int = setting(1024, ge=1)
    attention_dim: int = setting(128, ge=1)
    attention_location_n_filters: int = setting(32, ge=1)
    attention_location_kernel_size: int = setting(31, ge=1)
    decoder_rnn_dim: int = setting(1024, ge=1)
    prenet_dim: int = setting(256, ge=1)
    max_decoder_steps: int = setting(1000, ge=1)
    gate_threshold: float = setting(0.5, gt=0, lt=1)
    p_attention_dropout: float = setting(0.1, ge=0, lt=1)
    p_decoder_dropout: float = setting(0.1, ge=0, lt=1)
    postnet_embedding_dim: int = setting(512, ge=1)
    postnet_kernel_size: int = setting(5, ge=1)
    postnet_n_convolutions: int = setting(5, ge=2)
    text_cleaners: list[str] = dataclasses.field(default_factory=lambda: ["english_cleaners"])
    max_mel_frames: int = setting(1000, ge=0)
    mel_cache_dir: str = "mels"
    mask_padding: bool = True
    batch_size: int = setting(64, ge=1)
    learning_rate: float = setting(1e-3, gt=0)
    weight_decay: float = setting(1e-6, ge=0)


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
        if cfg.n_symbols < len(symbols):
            raise ValueError(f"tacotron2.n_symbols={cfg.n_symbols} is smaller than the symbol table "
                             f"({len(symbols)} symbols)")
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
    def inference(self, text: torch.Tensor, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor,
                                                                          torch.Tensor]:
        """Synthesize from symbol ids without a target (free-running decoder, see ``Decoder.inference``).

        Call ``model.eval()`` first (batch norm statistics, no decoder dropout); the pre-net keeps its
        dropout by design. Stops when the stop gate fires, or at ``max_decoder_steps`` with a warning.

        Args:
            text: ``(1, L)`` long symbol ids (``(B, L)`` without padding also works).
            progress: show a progress bar of the frames decoded.

        Returns:
            ``(mel_postnet (1, n_mels, T), gate logits (1, T), alignments (1, T, L))``.

        Raises:
            ValueError: ``text`` is not a 2-D integer tensor with at least one symbol.
        """
        if text.dim() != 2 or text.size(1) == 0 or text.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Tacotron2.inference expects symbol ids of shape (1, L), L >= 1, got "
                             f"{tuple(text.shape)} {text.dtype}")
        memory = self.encoder(self.embedding(text).transpose(1, 2))
        mel_out, gate_out, alignments = self.decoder.inference(memory, progress=progress)
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


def build_datasets(cfg: Config) -> tuple[Dataset, Dataset]:
    """Train and validation :class:`utils.text_mel_data.TextMelDataset` from ``cfg.data`` splits.

    Clips longer than ``tacotron2.max_mel_frames`` (when > 0) are left out of both (whole clips: teacher
    forcing needs the whole mel), with one warning line per split saying how many and the setting's value.

    Raises:
        DataError: the splits cannot be read (:func:`utils.data_utils.load_splits`), or the setting leaves no
            training or no validation utterance (the message names ``tacotron2.max_mel_frames``, its value and
            the longest clip's frame count).
    """
    train_utts, val_utts = load_splits(cfg.data)
    model_cfg = cfg.tacotron2
    max_frames = model_cfg.max_mel_frames if model_cfg.max_mel_frames > 0 else None
    cache = mel_cache_path(cfg.data.dataset_path, model_cfg.mel_cache_dir)
    return tuple(TextMelDataset(utts, cfg.audio, cache, text_cleaners=model_cfg.text_cleaners,
                                max_mel_frames=max_frames, split=split, setting_prefix="tacotron2.")
                 for utts, split in ((train_utts, "training"), (val_utts, "validation")))


def count_items(batch: Batch) -> int:
    """Mel frames in the batch (padding excluded)."""
    return int(batch["mel_lengths"].sum())


def check_text(text: str, cfg: Config) -> str | None:
    """The start-up corpus check for a transcript: ``None`` if some character maps to a symbol after cleaning."""
    with warnings.catch_warnings():  # the reason below says it; the front end's warning would repeat it
        warnings.simplefilter("ignore")
        if text_to_sequence(text, cfg.tacotron2.text_cleaners):
            return None
    return f"transcript {text!r} has no symbol of the Tacotron2 symbol table after cleaning"


def log_validation(model: nn.Module, batch: Batch, outputs: dict[str, torch.Tensor], step: int,
                   writer: Any, output_dir: Any, cfg: Config | None = None) -> None:
    """Pictures and audio of the first utterance of a validation batch.

    Always saves ``output_dir/alignment_<step>.png``; with a TensorBoard ``writer`` also adds the figures
    ``alignment``, ``mel_target``, ``mel_predicted`` (post-net output) and ``gate``. Padding is cut off.

    With a ``writer`` and the run's ``cfg``, also audio made with Griffin-Lim (:func:`griffin_lim_clip`; no
    vocoder needed), at most :data:`LOG_AUDIO_SECONDS` of each, at ``audio.sampling_rate`` Hz:
    ``audio/teacher_forced_griffin_lim`` (the post-net mel ``outputs["mel_postnet"][0]``),
    ``audio/free_running_griffin_lim`` (:meth:`Tacotron2.inference` from the item's text, the same pre-net
    dropout at every validation, see :func:`free_running_mel`), and at the first validation of the run only
    ``audio/target_griffin_lim`` (the target mel: what Griffin-Lim makes of a perfect mel) and the text
    ``audio/utterance`` (id and transcript). The validation loader does not shuffle and the collate sorts a
    batch by text length, so the first item is the same utterance at every validation.

    Args:
        model: the :class:`Tacotron2` (unwrapped, in eval mode).
        batch: from :class:`utils.text_mel_data.TextMelCollate`: ``{"text": (B, L), "text_lengths": (B,),
            "mel": (B, n_mels, T), "gate": (B, T), "mel_lengths": (B,), "ids": [str] * B}``.
        outputs: :meth:`Tacotron2.forward` of ``batch``: ``{"mel_postnet": (B, n_mels, T), "gate": (B, T),
            "alignments": (B, T, L), ...}``.
        step: the training step.
        writer: a ``SummaryWriter`` or ``None``.
        output_dir: the run's folder.
        cfg: the run's config (its ``audio`` section); ``None``: no audio.
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
    if cfg is None:
        return
    audio_cfg = cfg.audio
    max_frames = max(2, int(LOG_AUDIO_SECONDS * audio_cfg.sampling_rate / audio_cfg.hop_length))
    crop = min(frames, max_frames)
    text = batch["text"][0, :text_len]
    if first_time(writer, "audio/target_griffin_lim"):
        writer.add_text("audio/utterance", f"{utt}: {sequence_to_text(text.tolist())}", step)
        _add_griffin_lim(writer, "audio/target_griffin_lim", batch["mel"][0, :, :crop], step, audio_cfg)
    _add_griffin_lim(writer, "audio/teacher_forced_griffin_lim", outputs["mel_postnet"][0, :, :crop], step,
                     audio_cfg)
    _add_griffin_lim(writer, "audio/free_running_griffin_lim", free_running_mel(model, text, max_frames), step,
                     audio_cfg)


LOG_AUDIO_SECONDS = 3.0
"""Longest clip :func:`log_validation` turns into audio, in seconds (Griffin-Lim of 3 s with
:data:`LOG_GRIFFIN_LIM_ITERS` iterations takes about a second of CPU time)."""
LOG_GRIFFIN_LIM_ITERS = 32
"""Griffin-Lim iterations of the validation clips: enough to hear the words, far from vocoder quality."""


def griffin_lim_clip(log_mel: torch.Tensor, audio_cfg: AudioConfig,
                     n_iter: int = LOG_GRIFFIN_LIM_ITERS) -> torch.Tensor:
    """A log-mel ``(n_mels, frames)`` made audible: ``(frames * hop_length,)`` float32 samples on the CPU at
    ``audio_cfg.sampling_rate`` Hz, clipped to [-1, 1].

    :func:`utils.audio_processing.griffin_lim` (``inference.py``'s Griffin-Lim) gives ``(frames - 1) *
    hop_length`` samples (librosa's frames are centred on their first sample); the last hop is filled with
    zeros so that the clip lasts as long as the mel. A mel too short for that to fill one STFT window
    (``(frames - 1) * hop_length < n_fft``, 4 frames or fewer by default) gives silence.

    Raises:
        ValueError: see :func:`utils.audio_processing.griffin_lim` (wrong shape, NaN or inf).
    """
    samples = log_mel.shape[1] * audio_cfg.hop_length
    if (log_mel.shape[1] - 1) * audio_cfg.hop_length < audio_cfg.n_fft:
        return torch.zeros(samples)
    audio = torch.from_numpy(griffin_lim(log_mel, audio_cfg, n_iter)).clamp(-1.0, 1.0)
    return F.pad(audio, (0, max(0, samples - audio.numel())))[:samples]


def free_running_mel(model: Tacotron2, text: torch.Tensor, max_frames: int) -> torch.Tensor:
    """The post-net mel ``(n_mels, T)`` that :meth:`Tacotron2.inference` makes of symbol ids ``text`` ``(L,)``,
    cut at ``max_frames`` frames (``T <= max_frames``; decoding stops there, without the usual warning).

    Runs under :func:`utils.plotting.fixed_random_state`: the pre-net's dropout (on at inference too) draws
    the same masks at every call, and the training run's random stream is left as it was.
    """
    decoder = model.decoder
    limit = decoder.max_decoder_steps
    decoder.max_decoder_steps = min(limit, max_frames)
    try:
        with fixed_random_state(text.device), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tacotron2 decoder reached max_decoder_steps")
            mel = model.inference(text.unsqueeze(0))[0][0]
    finally:
        decoder.max_decoder_steps = limit
    return mel.float()


def _add_griffin_lim(writer: Any, tag: str, log_mel: torch.Tensor, step: int, audio_cfg: AudioConfig) -> None:
    """Add :func:`griffin_lim_clip` of ``log_mel`` ``(n_mels, frames)`` to TensorBoard as ``tag``; a mel with NaN
    or inf (a diverged model) is left out with a warning instead."""
    if not torch.isfinite(log_mel).all():
        warnings.warn(f"step {step}: the mel of '{tag}' holds NaN or infinite values; no audio")
        return
    add_audio(writer, tag, griffin_lim_clip(log_mel, audio_cfg), step, audio_cfg.sampling_rate)


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                              text_lengths: tuple[int, int] = (60, 160), mel_lengths: tuple[int, int] = (300, 800),
                              longest_mel: int = 800) -> Batch:
    """Random padded Tacotron2 batch, laid out as :class:`utils.text_mel_data.TextMelCollate` lays it out.

    Lengths are drawn exactly as NVIDIA's reference benchmark harness draws them (same calls
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
        raise ValueError(f"synthetic_batch: batch_size must be >= 1, got {batch_size}")
    for name, (low, high) in (("text_lengths", text_lengths), ("mel_lengths", mel_lengths)):
        if not 1 <= low < high:
            raise ValueError(f"synthetic_batch: {name} must be a range [low, high) with 1 <= low < high, "
                             f"got ({low}, {high})")
    if longest_mel < mel_lengths[1] - 1:
        raise ValueError(f"synthetic_batch: longest_mel={longest_mel} is below the mel length range "
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


TEXT_BUCKET = 32
"""Symbols the fast path pads the text axis to a multiple of: LJSpeech's texts (<= ~190 symbols) give 6
shapes, and the padding (masked, so it changes no output) adds at most 31 positions to the attention's
per-step tensors, which autograd keeps for every decoder step (at batch 128, 159 symbols: 160)."""


def optimize_for_training(model: nn.Module, cfg: Config, text_bucket: int = TEXT_BUCKET,
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
        raise TypeError(f"optimize_for_training expects a Tacotron2, got {type(model).__name__}")
    import torch._dynamo  # noqa: F401  (makes torch._dynamo.config reachable)
    dynamo_config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(dynamo_config, limit, max(getattr(dynamo_config, limit), 64))
    model.decoder.enable_fast_path(text_bucket, **compile_kwargs)
    return model




# --- inference.py --------------------------------------------------------------------------------------------

def add_inference_args(parser: argparse.ArgumentParser) -> None:
    """Tacotron2's ``inference.py`` options: the text, and a vocoder when this project has a vocoder model."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--text", help="the sentence to speak")
    source.add_argument("--text-file", help="a UTF-8 file of sentences, one wav per line (--output: a folder)")
    vocoders = [name for name, spec in MODELS.items() if spec.vocode is not None]
    if vocoders:
        parser.add_argument("--vocoder", help=f"a {' or '.join(vocoders)} checkpoint to vocode with "
                                              "(default: Griffin-Lim)")


def read_lines(args: argparse.Namespace) -> tuple[list[str], list[Path]]:
    """The sentences to speak and the wav each goes to (``--text`` -> ``--output``; ``--text-file`` -> one wav a
    line in the folder ``--output``).

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


def load_vocoder(args: argparse.Namespace, cfg: Config, device: torch.device) -> Any:
    """``(spec, model, config)`` of the ``--vocoder`` checkpoint, or ``None`` (Griffin-Lim).

    Raises:
        CheckpointError: the checkpoint holds a model that cannot vocode, or other audio settings than ``cfg``.
    """
    if not getattr(args, "vocoder", None):
        return None
    from inference import load_trained  # inference.py imports model.py, which imports this module
    from utils.checkpoint import CheckpointError

    name, vocoder, voc_cfg = load_trained(args.vocoder, device)
    if MODELS[name].vocode is None:
        raise CheckpointError(f"--vocoder {args.vocoder} holds a '{name}' model, which is not a vocoder")
    if voc_cfg.audio != cfg.audio:
        raise CheckpointError(f"--vocoder {args.vocoder} was trained with other audio settings than "
                              f"{args.checkpoint}: {voc_cfg.audio} vs {cfg.audio}")
    return MODELS[name], vocoder, voc_cfg


def infer(model: nn.Module, cfg: Config, args: argparse.Namespace, device: torch.device) -> list[Path]:
    """``inference.py`` for Tacotron2: each text -> mel -> audio (``--vocoder`` or Griffin-Lim) -> wav.

    Raises:
        ValueError, DataError: see :func:`read_lines`; a text with no character the model knows.
        CheckpointError: see :func:`load_vocoder`.
    """
    lines, outputs = read_lines(args)
    vocoder = load_vocoder(args, cfg, device)
    for text, out in zip(lines, outputs):
        ids = torch.tensor(text_to_sequence(text, cfg.tacotron2.text_cleaners), dtype=torch.long)
        if ids.numel() == 0:
            raise DataError(f"text {text!r} has no character the model knows")
        mel = model.inference(ids.unsqueeze(0).to(device), progress=True)[0][0].float().cpu()
        if vocoder is not None:
            spec, voc_model, voc_cfg = vocoder
            audio = spec.vocode(voc_model, mel, voc_cfg)
        else:
            audio = torch.from_numpy(griffin_lim(mel, cfg.audio))
        save_wav(out, audio, cfg.audio.sampling_rate)
        print(f"wrote {out} ({audio.numel() / cfg.audio.sampling_rate:.2f} s)")
    return outputs


# --- scripts/benchmark.py: NVIDIA's published shapes (those of its reference benchmark harness) -----------------

_FULL = {"text_lengths": (60, 160), "mel_lengths": (300, 800), "longest_mel": 800}
_TINY = {"text_lengths": (6, 16), "mel_lengths": (20, 40), "longest_mel": 40}
BENCHMARK_CASES = (
    BenchmarkCase("tacotron2_b128", (), 128, _FULL, tiny=BenchmarkCase("", (), 4, _TINY)),
    BenchmarkCase("tacotron2_b64", (), 64, _FULL, tiny=BenchmarkCase("", (), 2, _TINY)),
)

def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """NVIDIA/tacotron2's checkpoints (``tacotron2_statedict.pt``; ``{"state_dict", "iteration", "optimizer",
    "learning_rate"}``), or ``None`` for another format. The same network as this one: NVIDIA wraps each convolution
    and linear layer in a ``ConvNorm``/``LinearNorm`` (``.conv.``, ``.linear_layer.`` in its keys) and names the
    attention ``attention_layer``, with a ``location_layer`` inside. (Read from NVIDIA's checkpoint code for the
    layout; its outputs from the same weights equal this model's.)"""
    state = loaded.get("state_dict") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or "embedding.weight" not in state or not any(".linear_layer." in k for k in state):
        return None
    renamed = {}
    for key, value in state.items():
        key = key.replace("attention_layer.location_layer.", "attention.").replace("attention_layer.", "attention.")
        renamed[re.sub(r"\.(linear_layer|conv)\.", ".", key)] = value
    return Weights("NVIDIA/tacotron2's checkpoint", "tacotron2", renamed)


# --- scripts/export.py --format onnx ------------------------------------------------------------------------------
# Split as NVIDIA deploys Tacotron2 (DeepLearningExamples, PyTorch/SpeechSynthesis/Tacotron2/tensorrt/
# convert_tacotron22onnx.py, inference_trt.py): the encoder runs once per text, the decoder step once per mel frame
# in a loop the caller runs (run_onnx below), the post-net once on the whole mel.

DECODER_STATE = ("attention_hidden", "attention_cell", "decoder_hidden", "decoder_cell", "attention_weights",
                 "attention_weights_cum", "attention_context")
"""The decoder step's recurrent inputs, in order; its outputs carry the same names with ``next_`` in front."""
_STATE_KEYS = {"attention_weights": "weights", "attention_weights_cum": "weights_cum", "attention_context": "context"}


class EncoderExport(nn.Module):
    """Embedding, encoder and the attention's memory projection: ``text`` ``(B, L)`` int64 symbol ids and
    ``text_lengths`` ``(B,)`` int64 -> ``memory`` ``(B, L, encoder_dim)``, ``processed_memory`` ``(B, L,
    attention_dim)``, ``mask`` ``(B, L)`` bool (``True`` at padded positions).

    The same result as ``Encoder.forward(embedded, text_lengths)`` (zeros past each length) without
    ``pack_padded_sequence``, which does not export: the bidirectional LSTM runs as two one-way LSTMs sharing its
    weights, the backward one on each text reversed within its length (a gather), its outputs put back in order
    by the same gather. For one unpadded text (what :meth:`Tacotron2.inference` encodes) that is the plain BiLSTM.
    """

    def __init__(self, model: Tacotron2):
        super().__init__()
        self.embedding = model.embedding
        self.convolutions = model.encoder.convolutions
        self.memory_layer = model.decoder.attention.memory_layer
        lstm = model.encoder.lstm
        self.forward_lstm = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
        self.backward_lstm = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True)
        for weight in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            setattr(self.forward_lstm, weight, getattr(lstm, weight))
            setattr(self.backward_lstm, weight, getattr(lstm, weight + "_reverse"))

    def forward(self, text: torch.Tensor, text_lengths: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        positions = torch.arange(text.shape[1], device=text.device).unsqueeze(0)  # (1, L)
        lengths = text_lengths.unsqueeze(1)  # (B, 1)
        keep = positions < lengths  # (B, L)
        x = self.embedding(text).transpose(1, 2)  # (B, E, L)
        for conv in self.convolutions:  # evaluation mode: no dropout
            x = F.relu(conv(x * keep.unsqueeze(1)))
        x = x.transpose(1, 2)  # (B, L, E)
        order = torch.where(keep, lengths - 1 - positions, positions).unsqueeze(2)  # reversal within each length
        forward_out = self.forward_lstm(x)[0]
        backward_out = self.backward_lstm(x.gather(1, order.expand_as(x)))[0]
        backward_out = backward_out.gather(1, order.expand_as(backward_out))
        memory = torch.cat((forward_out, backward_out), dim=2) * keep.unsqueeze(2)
        return memory, self.memory_layer(memory), ~keep


class DecoderStepExport(nn.Module):
    """One decoder step (``Decoder._step``) with the pre-net in front and every state an input and an output.

    Inputs: ``previous_frame`` ``(B, n_mels)`` (zeros at the first step), ``prenet_noise`` ``(2, B, prenet_dim)``
    uniform in [0, 1) (fresh at every step), the :data:`DECODER_STATE` (``(B, attention_rnn_dim)`` x2, ``(B,
    decoder_rnn_dim)`` x2, attention weights and their running sum ``(B, L)``, context ``(B, encoder_dim)``; zeros
    at the first step), then the encoder's ``memory``, ``processed_memory`` and ``mask``. Outputs: ``frame`` ``(B,
    n_mels)``, ``gate`` ``(B,)`` (stop logit) and the ``next_`` state.

    The pre-net's dropout stays on at inference (Shen et al.; :class:`modules.tacotron2.Prenet`): the random draw
    is the ``prenet_noise`` input, a unit kept where its noise is >= the dropout probability and scaled by
    ``1 / (1 - p)``, so the file is deterministic and checkable and the caller owns the random numbers. NVIDIA's
    export draws the mask inside the graph instead.
    """

    def __init__(self, decoder: Decoder):
        super().__init__()
        self.decoder = decoder

    def forward(self, previous_frame: torch.Tensor, prenet_noise: torch.Tensor, *state_and_memory: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        *state, memory, processed_memory, mask = state_and_memory
        p = self.decoder.prenet.dropout
        x = previous_frame
        for i, linear in enumerate(self.decoder.prenet.layers):
            keep = (prenet_noise[i] >= p).to(x.dtype) * (1.0 / (1.0 - p) if p < 1 else 0.0)
            x = F.relu(linear(x)) * keep
        state = {_STATE_KEYS.get(name, name): value for name, value in zip(DECODER_STATE, state)}
        frame, gate, state = self.decoder._step(x, state, memory, processed_memory, mask)
        return (frame, gate, *(state[_STATE_KEYS.get(name, name)] for name in DECODER_STATE))


class PostnetExport(nn.Module):
    """The post-net residual: ``mel`` ``(B, n_mels, T)`` (the decoder's frames) -> ``mel_postnet`` ``(B, n_mels, T)``."""

    def __init__(self, postnet: Postnet):
        super().__init__()
        self.postnet = postnet

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return mel + self.postnet(mel)


def export_parts(model: Tacotron2, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: ``encoder``, ``decoder_step`` and ``postnet`` (:class:`EncoderExport`,
    :class:`DecoderStepExport`, :class:`PostnetExport`); batch, text length and mel frames dynamic, each checked
    on one unpadded item and on a padded batch of two. The encoder is checked against ``Encoder.forward`` with
    packed sequences; :func:`run_onnx` runs the three files as :meth:`Tacotron2.inference` runs the model."""
    gen = torch.Generator().manual_seed(0)
    c, n_mels = cfg.tacotron2, cfg.audio.n_mels
    decoder = model.decoder

    def text(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(1, c.n_symbols, (len(lengths), max(lengths)), generator=gen)
        lengths = torch.tensor(lengths)
        return ids.masked_fill(get_padding_mask(lengths), 0), lengths

    def encoder_reference(ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory = model.encoder(model.embedding(ids).transpose(1, 2), lengths)
        return memory, decoder.attention.process_memory(memory), get_padding_mask(lengths, ids.shape[1])

    def step(lengths: list[int]) -> tuple[torch.Tensor, ...]:
        batch, length = len(lengths), max(lengths)
        mask = get_padding_mask(torch.tensor(lengths), length)
        weights = torch.rand(batch, length, generator=gen).masked_fill(mask, 0.0)
        weights = weights / weights.sum(1, keepdim=True)
        memory = torch.randn(batch, length, c.encoder_embedding_dim, generator=gen).masked_fill(mask.unsqueeze(2), 0)
        return (torch.randn(batch, n_mels, generator=gen), torch.rand(2, batch, c.prenet_dim, generator=gen),
                *(torch.randn(batch, size, generator=gen) for size in (c.attention_rnn_dim, c.attention_rnn_dim,
                                                                       c.decoder_rnn_dim, c.decoder_rnn_dim)),
                weights, 3 * weights, torch.randn(batch, c.encoder_embedding_dim, generator=gen),
                memory, decoder.attention.process_memory(memory).detach(), mask)

    step_axes = {name: {0: "batch"} for name in ("previous_frame", "frame", "gate")}
    for name in DECODER_STATE:
        step_axes[name] = step_axes[f"next_{name}"] = {0: "batch", 1: "text"} if "weights" in name else {0: "batch"}
    step_axes.update({name: {0: "batch", 1: "text"} for name in ("memory", "processed_memory", "mask")})
    step_axes["prenet_noise"] = {1: "batch"}
    return [
        ExportPart(name="encoder", module=EncoderExport(model), inputs=text([13]), other_inputs=text([9, 5]),
                   input_names=("text", "text_lengths"), output_names=("memory", "processed_memory", "mask"),
                   dynamic_axes={"text": {0: "batch", 1: "text"}, "text_lengths": {0: "batch"},
                                 **{name: {0: "batch", 1: "text"} for name in ("memory", "processed_memory", "mask")}},
                   reference=encoder_reference,
                   description="text (B, L) int64, text_lengths (B,) -> memory, processed_memory (B, L, *), mask"),
        ExportPart(name="decoder_step", module=DecoderStepExport(decoder), inputs=step([12]),
                   other_inputs=step([7, 4]),
                   input_names=("previous_frame", "prenet_noise", *DECODER_STATE, "memory", "processed_memory",
                                "mask"),
                   output_names=("frame", "gate", *(f"next_{name}" for name in DECODER_STATE)),
                   dynamic_axes=step_axes,
                   description=f"previous frame (B, {n_mels}), prenet noise, state, memory -> frame, gate, state"),
        ExportPart(name="postnet", module=PostnetExport(model.postnet),
                   inputs=(torch.randn(1, n_mels, 30, generator=gen),),
                   other_inputs=(torch.randn(2, n_mels, 17, generator=gen),),
                   input_names=("mel",), output_names=("mel_postnet",),
                   dynamic_axes={"mel": {0: "batch", 2: "frames"}, "mel_postnet": {0: "batch", 2: "frames"}},
                   description=f"mel (B, {n_mels}, T) -> mel_postnet (B, {n_mels}, T)"),
    ]


def run_onnx(folder: Path, text: torch.Tensor, text_lengths: torch.Tensor, cfg: Config,
             max_steps: int | None = None, gate_threshold: float | None = None,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthesize with the exported files (``encoder.onnx``, ``decoder_step.onnx``, ``postnet.onnx`` in ``folder``)
    and ONNX Runtime on the CPU, as :meth:`Tacotron2.inference` does with the model: the free-running decoder loop,
    stopped after the step at which every item's ``sigmoid(gate)`` exceeded ``gate_threshold``, or at ``max_steps``.
    A reference for deploying the files elsewhere (NVIDIA's ``tensorrt/inference_trt.py`` runs the same loop).

    Args:
        folder: where :func:`utils.onnx_export.export_model` wrote the files.
        text: ``(B, L)`` int64 symbol ids (zeros past each length).
        text_lengths: ``(B,)`` int64 symbols per text.
        cfg: the model's config (``tacotron2`` sizes, ``audio.n_mels``).
        max_steps: most frames decoded (default ``tacotron2.max_decoder_steps``).
        gate_threshold: stop probability (default ``tacotron2.gate_threshold``).
        generator: draws the pre-net's dropout noise (default: torch's global one).

    Returns:
        ``(mel_postnet (B, n_mels, T), gate logits (B, T))``; items that stopped early run on to the batch's last
        step (trim each at its first gate crossing).

    Raises:
        ImportError: onnxruntime is not installed.
    """
    import onnxruntime

    c = cfg.tacotron2
    max_steps = c.max_decoder_steps if max_steps is None else max_steps
    gate_threshold = c.gate_threshold if gate_threshold is None else gate_threshold

    def session(name: str) -> Any:
        return onnxruntime.InferenceSession(str(Path(folder) / f"{name}.onnx"), providers=["CPUExecutionProvider"])

    encoder, step, postnet = session("encoder"), session("decoder_step"), session("postnet")
    memory, processed_memory, mask = encoder.run(None, {"text": text.numpy(), "text_lengths": text_lengths.numpy()})
    batch, length = mask.shape
    sizes = {"attention_hidden": c.attention_rnn_dim, "attention_cell": c.attention_rnn_dim,
             "decoder_hidden": c.decoder_rnn_dim, "decoder_cell": c.decoder_rnn_dim, "attention_weights": length,
             "attention_weights_cum": length, "attention_context": c.encoder_embedding_dim}
    feed = {name: torch.zeros(batch, sizes[name]).numpy() for name in DECODER_STATE}
    feed.update(previous_frame=torch.zeros(batch, cfg.audio.n_mels).numpy(), memory=memory,
                processed_memory=processed_memory, mask=mask)
    frames, gates = [], []
    stopped = torch.zeros(batch, dtype=torch.bool)
    while len(frames) < max_steps and not bool(stopped.all()):
        feed["prenet_noise"] = torch.rand(2, batch, c.prenet_dim, generator=generator).numpy()
        frame, gate, *state = step.run(None, feed)
        feed.update(zip(DECODER_STATE, state), previous_frame=frame)
        frames.append(torch.from_numpy(frame))
        gates.append(torch.from_numpy(gate))
        stopped |= torch.sigmoid(gates[-1]) > gate_threshold
    mel = torch.stack(frames, dim=2)
    mel_postnet = postnet.run(None, {"mel": mel.numpy()})[0]
    return torch.from_numpy(mel_postnet), torch.stack(gates, dim=1)


register("tacotron2", ModelSpec(
    config_cls=Tacotron2Config,
    build_model=lambda cfg: Tacotron2(cfg.tacotron2, cfg.audio.n_mels),
    build_criterion=lambda cfg: Tacotron2Loss(),
    build_datasets=build_datasets,
    collate_fn=TextMelCollate(),
    count_items=count_items,
    add_inference_args=add_inference_args,
    infer=infer,
    log_validation=log_validation,
    synthetic_batch=synthetic_batch,
    optimize_for_training=optimize_for_training,
    benchmark_cases=BENCHMARK_CASES,
    check_text=check_text,
    blocks=lambda model: [model.encoder, model.decoder, model.postnet],
    data_advice="raise data.num_workers, or cache the mels once with scripts/preprocess.py",
    read_published=read_published,
    variable_length=True,
    export_parts=export_parts,
))
