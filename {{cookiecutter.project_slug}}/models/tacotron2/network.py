"""Tacotron2's config section, model, loss and fast path. Source: Shen et al., "Natural TTS Synthesis by Conditioning
WaveNet on Mel Spectrogram Predictions" (ICASSP 2018), and NVIDIA's Tacotron2 for sizes and defaults."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from model import Batch
from models.tacotron2.text.symbols import symbols
from modules.tacotron2 import Decoder, Encoder, Postnet, get_padding_mask
from utils.config import Config, ModelSection


class Tacotron2Config(ModelSection):
    """The ``tacotron2`` section of ``config.json`` (defaults: NVIDIA's LJSpeech hyper-parameters).

    ``*_kernel_size`` in characters (encoder), encoder steps (attention location filters) or mel frames (post-net).
    ``max_decoder_steps`` caps free-running synthesis in mel frames; ``gate_threshold`` is the stop probability that
    ends it. ``max_mel_frames`` drops longer clips (0: keep all). ``mel_cache_dir``: where ``scripts/preprocess.py``
    caches mels (inside ``data.dataset_path``, or absolute; empty: no cache). ``mask_padding`` zeroes the outputs at
    padded frames. ``val_audio_seconds``: the longest validation clip rank 0 turns into Griffin-Lim audio for
    TensorBoard (0: pictures only, as ``--tiny``). ``batch_size`` is per process. ``speaker_embedding_dim``: the
    width of the speaker embedding concatenated to the encoder outputs where ``data.speakers`` names more than one
    speaker (NVIDIA's Mellotron: 128; 0: none).
    """

    n_symbols: int = Field(len(symbols), ge=1)
    symbols_embedding_dim: int = Field(512, ge=1)
    encoder_n_convolutions: int = Field(3, ge=0)
    encoder_embedding_dim: int = Field(512, ge=2)
    encoder_kernel_size: int = Field(5, ge=1)
    attention_rnn_dim: int = Field(1024, ge=1)
    attention_dim: int = Field(128, ge=1)
    attention_location_n_filters: int = Field(32, ge=1)
    attention_location_kernel_size: int = Field(31, ge=1)
    decoder_rnn_dim: int = Field(1024, ge=1)
    prenet_dim: int = Field(256, ge=1)
    max_decoder_steps: int = Field(1000, ge=1)
    gate_threshold: float = Field(0.5, gt=0, lt=1)
    p_attention_dropout: float = Field(0.1, ge=0, lt=1)
    p_decoder_dropout: float = Field(0.1, ge=0, lt=1)
    postnet_embedding_dim: int = Field(512, ge=1)
    postnet_kernel_size: int = Field(5, ge=1)
    postnet_n_convolutions: int = Field(5, ge=2)
    text_cleaners: list[str] = Field(default_factory=lambda: ["english_cleaners"])
    max_mel_frames: int = Field(1000, ge=0)
    mel_cache_dir: str = "mels"
    mask_padding: bool = True
    val_audio_seconds: float = Field(3.0, ge=0)
    batch_size: int = Field(64, ge=1)
    speaker_embedding_dim: int = Field(128, ge=0)


def speaker_table(cfg: Tacotron2Config, n_speakers: int) -> int:
    """The rows of the speaker embedding of a Tacotron2 of ``cfg`` trained on ``n_speakers`` speakers: 0 (none) with
    one speaker or ``speaker_embedding_dim`` 0, else ``n_speakers``."""
    return n_speakers if n_speakers > 1 and cfg.speaker_embedding_dim > 0 else 0


class Tacotron2(nn.Module):
    """Tacotron2 (Shen et al. 2018): characters -> mel spectrogram of ``n_mels`` channels, with a stop gate and the
    attention alignments: symbol embedding, encoder, attention decoder, post-net residual. Sizes, initialisation and
    dropout follow NVIDIA's reference (28.19 M parameters with the defaults and 148 symbols). With ``n_speakers`` > 1
    (and ``speaker_embedding_dim`` > 0) a speaker embedding ``(n_speakers, speaker_embedding_dim)`` is concatenated to
    every encoder output, the decoder attending to the wider memory (NVIDIA's Mellotron and Flowtron; made after the
    other layers, so that without it every weight is drawn as before). Raises ValueError: ``n_symbols`` smaller than
    the symbol table, or ``symbols_embedding_dim`` different from ``encoder_embedding_dim`` (the encoder convolutions
    take the embedding directly)."""

    def __init__(self, cfg: Tacotron2Config, n_mels: int, n_speakers: int = 0):
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
        rows = speaker_table(cfg, n_speakers)
        self.decoder = Decoder(n_mels, cfg, cfg.encoder_embedding_dim + (cfg.speaker_embedding_dim if rows else 0))
        self.postnet = Postnet(n_mels, cfg.postnet_embedding_dim, cfg.postnet_kernel_size, cfg.postnet_n_convolutions)
        self.speaker_embedding = nn.Embedding(rows, cfg.speaker_embedding_dim) if rows else None  # N(0, 1) rows

    def with_speaker(self, memory: torch.Tensor, speaker: Optional[torch.Tensor]) -> torch.Tensor:
        """The encoder outputs ``memory`` ``(B, L, E)`` with each item's speaker embedding (``speaker``: ``(B,)`` long
        indices of ``data.speakers``) concatenated at every step: ``(B, L, E + speaker_embedding_dim)``; ``memory``
        as it is without a speaker embedding. Raises ValueError: a multi-speaker model given no ``speaker``."""
        if self.speaker_embedding is None:
            return memory
        if speaker is None:
            raise ValueError(f"Tacotron2 of {self.speaker_embedding.num_embeddings} speakers: the batch has no "
                             "'speaker' indices")
        embedded = self.speaker_embedding(speaker.to(memory.device)).to(memory.dtype)  # (B, speaker_embedding_dim)
        return torch.cat([memory, embedded.unsqueeze(1).expand(-1, memory.size(1), -1)], dim=2)

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Teacher-forced pass over a padded batch (``{"text": (B, L) long, "text_lengths": (B,), "mel": (B, n_mels, T),
        "mel_lengths": (B,), "speaker": (B,) long (a multi-speaker model's), ...}``) -> ``{"mel": (B, n_mels, T), "mel_postnet": (B, n_mels, T), "gate": (B, T) logits,
        "alignments": (B, T, L)}``. With ``mask_padding``, mels are 0 and gate logits 1e3 at padded frames. Raises
        ValueError: the mel does not have ``n_mels`` channels or the lengths do not fit the padding."""
        text, text_lengths = batch["text"], batch["text_lengths"]
        mels, mel_lengths = batch["mel"], batch["mel_lengths"]
        text_mask = get_padding_mask(text_lengths, text.size(1))
        memory = self.encoder(self.embedding(text).transpose(1, 2), text_lengths)  # embedded: (B, E, L)
        memory = self.with_speaker(memory, batch.get("speaker"))
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
    def inference(self, text: torch.Tensor, progress: bool = False, speaker: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Synthesize from symbol ids ``text`` ``(1, L)`` (``(B, L)`` without padding also works), in the voice of
        ``speaker`` ``(1,)`` (or ``(B,)``) long, a multi-speaker model's index of ``data.speakers``, with
        ``Decoder.inference`` -> ``(mel_postnet (1, n_mels, T), gate logits (1, T), alignments (1, T, L))``. Call
        ``model.eval()`` first; the pre-net keeps its dropout by design. Raises ValueError: ``text`` is not a 2-D
        integer tensor with at least one symbol, or a multi-speaker model given no ``speaker``."""
        if text.dim() != 2 or text.size(1) == 0 or text.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Tacotron2.inference expects symbol ids of shape (1, L), L >= 1, got "
                             f"{tuple(text.shape)} {text.dtype}")
        memory = self.with_speaker(self.encoder(self.embedding(text).transpose(1, 2)), speaker)
        mel_out, gate_out, alignments = self.decoder.inference(memory, progress=progress)
        return mel_out + self.postnet(mel_out), gate_out, alignments


class Tacotron2Loss(nn.Module):
    """``MSE(mel) + MSE(post-net mel) + BCE-with-logits(gate)``: the Tacotron2 objective (Shen et al. 2018; NVIDIA's
    reference), except that padded frames (``t >= mel_lengths``) are left out of the averages. Computed in float32;
    returns ``(loss, terms)``, ``terms`` its three summands ``mel``, ``mel_postnet``, ``gate`` (detached) for the loop to
    log. Raises ValueError: (on call) the predicted and target mels differ in shape."""

    def forward(self, outputs: dict[str, torch.Tensor], batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
        terms = {"mel": mel_loss.detach(), "mel_postnet": postnet_loss.detach(), "gate": gate_loss.detach()}
        return mel_loss + postnet_loss + gate_loss, terms


TEXT_BUCKET = 32  # the fast path pads the text axis to a multiple of it: 6 shapes for LJSpeech's texts


def optimize_for_training(model: nn.Module, cfg: Config, text_bucket: int = TEXT_BUCKET,
                          **compile_kwargs) -> nn.Module:
    """Tacotron2's fast path, in place: the decoder step compiled once (``Decoder.enable_fast_path``; ``compile_kwargs``
    go to ``torch.compile``), the rest eager. Also raises Dynamo's process-wide recompile limit to 64 graphs, room for
    every text bucket. State-dict keys are unchanged; ``cfg`` is unused (the ``ModelSpec.optimize_for_training``
    contract). Returns ``model``. Raises TypeError: not a :class:`Tacotron2`; ValueError: ``text_bucket < 1``."""
    if not isinstance(model, Tacotron2):
        raise TypeError(f"optimize_for_training expects a Tacotron2, got {type(model).__name__}")
    dynamo_config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.6
    setattr(dynamo_config, limit, max(getattr(dynamo_config, limit), 64))
    model.decoder.enable_fast_path(text_bucket, **compile_kwargs)
    return model
