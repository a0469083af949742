"""Matcha-TTS's network: the text encoder and duration predictor, the optimal-transport conditional flow matching
(OT-CFM) decoder with its Euler sampler, the alignment of text to frames (monotonic alignment search in training,
rounded-up predicted durations in synthesis) and the three training losses. Source: Mehta, Tu, Beskow, Székely and
Henter, "Matcha-TTS: A fast TTS architecture with conditional flow matching" (ICASSP 2024), Sections 2.2 and 3
(Eqs. 1-4; the prior and duration losses of Glow-TTS, Kim et al., NeurIPS 2020), with the sizes, defaults and masking
of the authors' implementation (shivammehta25/Matcha-TTS, ``configs/model/matcha.yaml``). Mels are normalised
(``(log_mel - mel_mean) / mel_std`` over the corpus) ``(B, n_feats, frames)`` at 22.05 kHz, hop 256 (jik876's
frames); text is token ids ``(B, T_text)``."""

from __future__ import annotations

import math
import re
from typing import Optional

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from model import Batch
from models.matcha.monotonic_align import maximum_path
from models.matcha.text import SYMBOLS
from modules.matcha import TextEncoder, generate_path, sequence_mask
from modules.matcha_decoder import UNetDecoder
from utils.config import Config, ModelSection

SIGMA_MIN = 1e-4
"""OT-CFM's ``sigma_min`` (Eq. 3): the width of the conditional path at ``t = 1``."""


class MatchaConfig(ModelSection):
    """The ``matcha`` section of ``config.json`` (defaults: the authors' LJSpeech model, ``configs/model/matcha.yaml``
    and ``configs/experiment/ljspeech.yaml``).

    The encoder: ``n_channels`` wide, ``n_layers`` rotary-attention layers of ``n_heads`` heads, feed-forward
    ``filter_channels``, convolutions of ``kernel_size`` tokens, dropout ``p_dropout``, a duration predictor of
    ``filter_channels_dp``; ``spk_emb_dim``: the speaker vectors where ``data.speakers`` names more than one. The
    decoder: U-Net ``decoder_channels`` per level, ``n_blocks`` transformer blocks per level of ``num_heads`` x
    ``attention_head_dim``, ``num_mid_blocks`` middle levels, dropout ``decoder_dropout``. ``sigma_min``: OT-CFM's
    path width at ``t = 1``. Synthesis: ``n_timesteps`` Euler steps from noise times ``temperature``, durations times
    ``length_scale``. ``out_size``: the flow matching and prior losses of a random segment of that many frames per
    item (a multiple of 4; null: the whole mels). ``mel_mean`` / ``mel_std``: the corpus's log-mel statistics the mels
    are normalised by (null: computed over the training split when a run starts, and recorded in its checkpoints'
    config; ``python -m scripts.mel_statistics`` prints them to set here). ``phonemizer`` / ``espeak_ng``: the
    versions of the text front end's programs a run phonemized its corpus with, recorded by the run (a value given is
    replaced), which inference compares with its own. ``val_audio_seconds``: the longest validation clip rank 0 turns
    into audio (0: none; ``models.matcha.validation``); ``val_vocoder``: the vocoder checkpoint that makes it, as
    ``inference.py --vocoder`` takes one (refused where the project has no vocoder model), loaded once at the run's
    start (null: Griffin-Lim). ``batch_size`` is per process.
    """

    spk_emb_dim: int = Field(64, ge=1)
    n_channels: int = Field(192, ge=2)
    filter_channels: int = Field(768, ge=1)
    filter_channels_dp: int = Field(256, ge=1)
    n_heads: int = Field(2, ge=1)
    n_layers: int = Field(6, ge=1)
    kernel_size: int = Field(3, ge=1)
    p_dropout: float = Field(0.1, ge=0, lt=1)
    decoder_channels: list[int] = Field(default_factory=lambda: [256, 256], min_length=1)
    decoder_dropout: float = Field(0.05, ge=0, lt=1)
    attention_head_dim: int = Field(64, ge=1)
    n_blocks: int = Field(1, ge=1)
    num_mid_blocks: int = Field(2, ge=0)
    num_heads: int = Field(2, ge=1)
    sigma_min: float = Field(SIGMA_MIN, ge=0, lt=1)
    n_timesteps: int = Field(10, ge=1)
    temperature: float = Field(0.667, ge=0)
    length_scale: float = Field(1.0, gt=0)
    out_size: Optional[int] = Field(None, ge=4, multiple_of=4)
    mel_mean: Optional[float] = None
    mel_std: Optional[float] = Field(None, gt=0)
    phonemizer: Optional[str] = None
    espeak_ng: Optional[str] = None
    val_audio_seconds: float = Field(3.0, ge=0)
    val_vocoder: Optional[str] = Field(None, min_length=1)
    batch_size: int = Field(32, ge=1)


def build_matcha(cfg: Config) -> MatchaTTS:
    """The :class:`MatchaTTS` of ``cfg.matcha`` over the table of :data:`models.matcha.text.SYMBOLS`, with
    ``audio.n_mels`` bands and a speaker table where ``data.speakers`` names more than one speaker."""
    section = cfg.matcha
    encoder = {key: getattr(section, key) for key in ("n_channels", "filter_channels", "filter_channels_dp",
                                                       "n_heads", "n_layers", "kernel_size", "p_dropout")}
    decoder = {"channels": tuple(section.decoder_channels), "dropout": section.decoder_dropout,
               "attention_head_dim": section.attention_head_dim, "n_blocks": section.n_blocks,
               "num_mid_blocks": section.num_mid_blocks, "num_heads": section.num_heads}
    return MatchaTTS(len(SYMBOLS), max(1, len(cfg.data.speakers)), section.spk_emb_dim, cfg.audio.n_mels, encoder,
                     decoder, sigma_min=section.sigma_min, out_size=section.out_size)


def fix_length(frames: int | torch.Tensor, downsamplings: int = 2) -> int | torch.Tensor:
    """``frames`` (>= 0; an int, or an integer tensor: traced into an exported graph) rounded up to a multiple of
    ``2^downsamplings`` (the authors' ``fix_len_compatibility``; the U-Net halves the frames ``len(channels) - 1``
    times, and 2 is their default)."""
    factor = 2 ** downsamplings
    return (frames + factor - 1) // factor * factor


def segment_offsets(mel_lengths: torch.Tensor, out_size: int) -> torch.Tensor:
    """Each item's first frame of its ``out_size``-frame segment, ``(B,)`` long on the CPU: uniform over ``0 .. length
    - out_size - 1`` (the authors' ``random.choice(range(0, length - out_size))``, which never starts at the last
    frame that fits), 0 for an item of at most ``out_size + 1`` frames. Drawn from torch's CPU generator: the same
    offsets wherever the same seed is set."""
    room = (mel_lengths.cpu() - out_size).clamp_min(0)
    return (torch.rand(room.shape) * room).long()


def cut_segments(mel: torch.Tensor, attn: torch.Tensor, mel_lengths: torch.Tensor, out_size: int,
                 offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The segments of ``out_size`` frames from ``offsets`` ``(B,)``: of ``mel`` ``(B, n_feats, T)`` and of the
    alignment ``attn`` ``(B, T_text, T)``, each item's ``min(out_size, length)`` frames then zeros, and those
    lengths ``(B,)``. Returns ``(mel (B, n_feats, out_size), attn (B, T_text, out_size), lengths)``. Source: the authors'
    ``MatchaTTS.forward`` (Grad-TTS's cut); ``T`` may be shorter than ``out_size``."""
    lengths = mel_lengths.clamp_max(out_size)
    steps = torch.arange(out_size, device=mel.device)
    keep = steps < lengths.unsqueeze(1)  # (B, out_size)
    frames = (offsets.to(mel.device).unsqueeze(1) + steps).clamp_max(mel.shape[-1] - 1) * keep

    def cut(x: torch.Tensor) -> torch.Tensor:
        return torch.gather(x, 2, frames.unsqueeze(1).expand(-1, x.shape[1], -1)) * keep.unsqueeze(1).to(x.dtype)
    return cut(mel), cut(attn), lengths


class MatchaTTS(nn.Module):
    """Text -> normalised mel. ``n_vocab`` token ids; ``n_spks`` speakers (more than 1: a table of ``spk_emb_dim``
    vectors, joined to the encoder's channels and to the decoder's input); ``n_feats`` mel bands. The encoder:
    ``n_channels`` wide, ``n_layers`` rotary-attention layers of ``n_heads`` heads, feed-forward ``filter_channels``,
    ``kernel_size``, dropout ``p_dropout``, a duration predictor of ``filter_channels_dp``. The decoder: U-Net
    ``channels`` per level, ``n_blocks`` transformer blocks per level of ``num_heads`` x ``attention_head_dim``,
    ``num_mid_blocks`` middle levels, dropout ``dropout``. Defaults: the authors' LJSpeech model (about 18 M
    parameters); ``sigma_min``: OT-CFM's (Eq. 3); ``out_size``: the training segment's frames (None: whole mels)."""

    def __init__(self, n_vocab: int = 178, n_spks: int = 1, spk_emb_dim: int = 64, n_feats: int = 80,
                 encoder: dict | None = None, decoder: dict | None = None, sigma_min: float = SIGMA_MIN,
                 out_size: int | None = None):
        super().__init__()
        self.sigma_min, self.out_size = sigma_min, out_size
        enc = {"n_channels": 192, "filter_channels": 768, "filter_channels_dp": 256, "n_heads": 2, "n_layers": 6,
               "kernel_size": 3, "p_dropout": 0.1, **(encoder or {})}
        dec = {"channels": (256, 256), "dropout": 0.05, "attention_head_dim": 64, "n_blocks": 1,
               "num_mid_blocks": 2, "num_heads": 2, **(decoder or {})}
        self.n_spks, self.n_feats = n_spks, n_feats
        speaker_channels = spk_emb_dim if n_spks > 1 else 0
        self.speakers = nn.Embedding(n_spks, spk_emb_dim) if n_spks > 1 else None
        self.encoder = TextEncoder(n_vocab, n_feats, enc["n_channels"], enc["filter_channels"], enc["n_heads"],
                                   enc["n_layers"], enc["kernel_size"], enc["p_dropout"], enc["filter_channels_dp"],
                                   speaker_channels)
        self.decoder = UNetDecoder(2 * n_feats + speaker_channels, n_feats, **dec)

    def encode(self, ids: torch.Tensor, lengths: torch.Tensor, speakers: torch.Tensor | None = None):
        """``(mu, logw, mask, speaker vectors)``: ``mu`` ``(B, n_feats, T_text)``, ``logw`` ``(B, 1, T_text)``,
        ``mask`` ``(B, 1, T_text)``; the speaker vectors ``(B, spk_emb_dim)`` of ids ``speakers`` ``(B,)`` (None with
        one speaker)."""
        vectors = self.speakers(speakers.long()) if self.speakers is not None else None
        mu, logw, mask = self.encoder(ids, lengths, vectors)
        return mu, logw, mask, vectors

    def euler(self, noise: torch.Tensor, mu: torch.Tensor, mask: torch.Tensor, n_timesteps: int,
              speakers: torch.Tensor | None = None, steps: list | None = None) -> torch.Tensor:
        """Integrate the decoder's vector field from ``x_0 = noise`` (``(B, n_feats, T)``, already times the
        temperature) over ``t`` in [0, 1] with ``n_timesteps`` Euler steps; returns ``x_1``. ``steps``, when given,
        gets ``x`` before each step (the noise first). ``speakers``: vectors ``(B, spk_emb_dim)`` or None."""
        t_span = torch.linspace(0, 1, n_timesteps + 1, device=mu.device)
        t, dt, x = t_span[0], t_span[1] - t_span[0], noise
        for step in range(1, n_timesteps + 1):
            if steps is not None:
                steps.append(x)
            x = x + dt * self.decoder(x, mask, mu, t, speakers)
            t = t + dt
            if step < n_timesteps:
                dt = t_span[step + 1] - t
        return x

    @torch.no_grad()
    def synthesise(self, ids: torch.Tensor, lengths: torch.Tensor, n_timesteps: int,
                   temperature: float | torch.Tensor = 1.0, speakers: torch.Tensor | None = None,
                   length_scale: float | torch.Tensor = 1.0, noise: torch.Tensor | None = None,
                   steps: list | None = None) -> dict:
        """Normalised mel of ``ids`` ``(B, T_text)``: each token lasts ``ceil(exp(logw)) * length_scale`` frames, the
        aligned ``mu`` conditions the sampler, started at ``temperature * noise`` (``(B, n_feats, T)``, ``T`` the
        longest item's frames rounded up by :func:`fix_length`; drawn from a standard normal when None; a longer
        ``noise`` gives its first ``T`` frames, a shorter one zeros after its own: the mean); ``steps``: as
        :meth:`euler`'s. ``temperature`` and ``length_scale``: floats or 0-d tensors (an exported graph's inputs: no
        size here is read into Python, so a trace keeps them variable). Returns
        ``mu_y`` and ``decoder_out`` ``(B, n_feats, T)`` (unpadded to the longest item: ``[..., :max(mel_lengths)]``),
        ``durations`` ``(B, 1, T_text)`` (the rounded ones), ``attn`` ``(B, T_text, T)``, ``mel_lengths`` ``(B,)``."""
        mu_x, logw, x_mask, vectors = self.encode(ids, lengths, speakers)
        durations = torch.ceil(torch.exp(logw) * x_mask) * length_scale
        mel_lengths = torch.clamp_min(torch.sum(durations, [1, 2]), 1).long()
        y_mask = sequence_mask(mel_lengths, fix_length(mel_lengths.max())).unsqueeze(1).to(x_mask.dtype)
        attn = generate_path(durations.squeeze(1), (x_mask.unsqueeze(-1) * y_mask.unsqueeze(2)).squeeze(1))
        mu_y = torch.matmul(attn.transpose(1, 2), mu_x.transpose(1, 2)).transpose(1, 2)
        if noise is None:
            noise = torch.randn_like(mu_y)
        else:  # T frames of it, zeros past its own
            noise = torch.cat([noise, torch.zeros_like(mu_y)], dim=2)[:, :, :mu_y.shape[2]]
        out = self.euler(noise * temperature, mu_y, y_mask, n_timesteps, vectors, steps)
        return {"mu_y": mu_y, "decoder_out": out, "durations": durations, "attn": attn, "mel_lengths": mel_lengths}

    def losses(self, ids: torch.Tensor, lengths: torch.Tensor, mel: torch.Tensor, mel_lengths: torch.Tensor,
               speakers: torch.Tensor | None = None, t: torch.Tensor | None = None,
               noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(duration, prior, flow_matching, attn)`` of one batch: ``mel`` ``(B, n_feats, T)`` normalised, zero past
        ``mel_lengths``. The alignment ``attn`` ``(B, T_text, T)`` is the monotonic alignment search's under the
        encoder's unit-variance Gaussians (no gradient). Duration: squared error of ``logw`` to ``log(1e-8 + frames
        per token)``, summed, over the number of tokens. Prior: the Gaussian negative log-likelihood of the frames
        under the aligned ``mu``, over the real frames times ``n_feats``. Flow matching (Eq. 4): squared error of the
        vector field at ``y = (1 - (1 - sigma_min) t) noise + t mel`` to ``mel - (1 - sigma_min) noise``, summed over
        the real frames (the field is masked; the target is not), over real frames times ``n_feats``. With ``out_size``
        set, the prior and flow matching read each item's segment of :func:`cut_segments` at offsets
        :func:`segment_offsets` draws (first, before ``t`` and ``noise``), and ``attn`` is the segment's ``(B, T_text,
        out_size)``. ``t`` ``(B, 1, 1)`` uniform and ``noise`` like ``mel`` (its segment) standard normal are drawn
        when None."""
        mu_x, logw, x_mask, vectors = self.encode(ids, lengths, speakers)
        y_mask = sequence_mask(mel_lengths, mel.shape[-1]).unsqueeze(1).to(x_mask)
        attn_mask = (x_mask.unsqueeze(-1) * y_mask.unsqueeze(2)).squeeze(1)
        with torch.no_grad():
            log_prior = (torch.matmul(-0.5 * torch.ones_like(mu_x).transpose(1, 2), mel ** 2)
                         - torch.matmul((-mu_x).transpose(1, 2), mel)
                         + torch.sum(-0.5 * mu_x ** 2, 1).unsqueeze(-1) - 0.5 * math.log(2 * math.pi) * self.n_feats)
            attn = maximum_path(log_prior, attn_mask).detach()
        target_logw = torch.log(1e-8 + torch.sum(attn.unsqueeze(1), -1)) * x_mask
        duration = torch.sum((logw - target_logw) ** 2) / torch.sum(lengths)
        if self.out_size is not None:  # the decoder and prior losses on a segment: a bigger batch fits
            offsets = segment_offsets(mel_lengths, self.out_size)
            mel, attn, mel_lengths = cut_segments(mel, attn, mel_lengths, self.out_size, offsets)
            y_mask = sequence_mask(mel_lengths, self.out_size).unsqueeze(1).to(x_mask)
        mu_y = torch.matmul(attn.transpose(1, 2), mu_x.transpose(1, 2)).transpose(1, 2)
        t = torch.rand(mel.shape[0], 1, 1, device=mel.device, dtype=mel.dtype) if t is None else t
        noise = torch.randn_like(mel) if noise is None else noise
        y = (1 - (1 - self.sigma_min) * t) * noise + t * mel
        u = mel - (1 - self.sigma_min) * noise
        field = self.decoder(y, y_mask, mu_y, t.squeeze(), vectors)
        flow = F.mse_loss(field, u, reduction="sum") / (torch.sum(y_mask) * u.shape[1])
        frames = torch.sum(y_mask) * self.n_feats
        prior = torch.sum(0.5 * ((mel - mu_y) ** 2 + math.log(2 * math.pi)) * y_mask) / frames
        return duration, prior, flow, attn

    def forward(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The training losses of :class:`models.matcha.data.MatchaCollate`'s ``batch`` (:meth:`losses`):
        ``{"duration", "prior", "flow": scalars, "attn": (B, T_text, T)}``."""
        duration, prior, flow, attn = self.losses(batch["text"], batch["text_lengths"], batch["mel"],
                                                  batch["mel_lengths"], batch.get("speaker"))
        return {"duration": duration, "prior": prior, "flow": flow, "attn": attn}


def blocks(model: MatchaTTS) -> list[nn.Module]:
    """``Training.blocks``: what a model split over the ranks splits and activation checkpointing recomputes one by one,
    in forward order. Each text encoder layer, the duration predictor, then each U-Net level of the decoder (down,
    middle, up: a resnet block, its transformer blocks and its resampling convolution, the resampling inside the level's
    ``forward``). At the default sizes they hold 16.1 of the 18.2 M weights, and nearly all activations: the levels run
    over the mel's frames (the decoder's attention is over frames), the encoder layers over the tokens. Left with the
    root: the time MLP (1.2 M, run once per forward on the ``(B,)`` times), the prenet (0.6 M), the embedding and
    speaker tables, the last conv block and the 1x1 projections, and the alignment search (no weights, nothing kept for
    the backward)."""
    return [*model.encoder.layers, model.encoder.durations, *model.decoder.down, *model.decoder.mid, *model.decoder.up]


class MatchaLoss:
    """The criterion: ``(duration + prior + flow, {"prior", "duration", "flow"})`` of :meth:`MatchaTTS.forward`'s
    outputs, as the authors' training step sums them (each term logged)."""

    def __call__(self, outputs: dict[str, torch.Tensor], batch: Batch) -> tuple[torch.Tensor, dict]:
        terms = {name: outputs[name] for name in ("prior", "duration", "flow")}
        return terms["prior"] + terms["duration"] + terms["flow"], terms


REFERENCE_NAMES = [  # (the authors' key pattern, ours), applied in order, each at most once per key
    (r"^spk_emb\.", "speakers."), (r"^encoder\.emb\.", "encoder.embedding."),
    (r"^encoder\.prenet\.conv_layers\.", "encoder.prenet.convs."),
    (r"^encoder\.prenet\.norm_layers\.", "encoder.prenet.norms."),
    (r"^encoder\.encoder\.attn_layers\.(\d+)\.conv_([qkvo])\.", r"encoder.layers.\1.attn.\2."),
    (r"^encoder\.encoder\.norm_layers_1\.(\d+)\.", r"encoder.layers.\1.norm_attn."),
    (r"^encoder\.encoder\.ffn_layers\.(\d+)\.", r"encoder.layers.\1.ffn."),
    (r"^encoder\.encoder\.norm_layers_2\.(\d+)\.", r"encoder.layers.\1.norm_ffn."),
    (r"^encoder\.proj_m\.", "encoder.to_mu."), (r"^encoder\.proj_w\.", "encoder.durations."),
    (r"^decoder\.estimator\.", "decoder."),
    (r"^decoder\.(down|up)_blocks\.(\d+)\.2\.(conv\.)?", r"decoder.\1.\2.resample."),
    (r"^decoder\.(down|mid|up)_blocks\.(\d+)\.0\.", r"decoder.\1.\2.resnet."),
    (r"^decoder\.(down|mid|up)_blocks\.(\d+)\.1\.", r"decoder.\1.\2.transformers."),
    (r"\.mlp\.1\.", ".time_proj."), (r"block(1|2)?\.block\.0\.", r"block\1.conv."),
    (r"block(1|2)?\.block\.1\.", r"block\1.norm."), (r"\.norm1\.", ".norm_attn."), (r"\.norm3\.", ".norm_ff."),
    (r"\.attn1\.to_(q|k|v)\.", r".attn.\1."), (r"\.attn1\.to_out\.0\.", ".attn.out."),
    (r"\.ff\.net\.0\.proj\.", ".ff.proj."), (r"\.ff\.net\.0\.(alpha|beta)$", r".ff.\1"),
    (r"\.ff\.net\.2\.", ".ff.out."),
]
"""How the authors' ``MatchaTTS`` state_dict names map to this network's (:func:`reference_key`)."""
SHORT = {"q": "query", "k": "key", "v": "value", "o": "out"}


def reference_key(key: str) -> str:
    """This network's name of the authors' ``MatchaTTS`` state_dict key ``key`` (its ``encoder.*``,
    ``decoder.estimator.*``, ``spk_emb.weight``); the key itself when no rule applies."""
    for pattern, replacement in REFERENCE_NAMES:
        key = re.sub(pattern, replacement, key, count=1)
    return re.sub(r"\.attn\.([qkvo])\.", lambda m: f".attn.{SHORT[m.group(1)]}.", key)


def from_reference(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The authors' ``MatchaTTS`` state_dict (``{key: tensor}``) under this network's names (:func:`reference_key`).
    Raises ``KeyError`` naming the keys when two of theirs map to one of ours."""
    ours: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = reference_key(key)
        if name in ours:
            raise KeyError(f"{key} and another key both map to {name}")
        ours[name] = value
    return ours
