"""Building blocks of Matcha-TTS's text encoder: Mehta, Tu, Beskow, Székely and Henter, "Matcha-TTS: A fast TTS
architecture with conditional flow matching" (ICASSP 2024), Section 3 and Figure 1: Glow-TTS's encoder (Kim et al.,
NeurIPS 2020: a convolutional prenet, a transformer with relative positions, a duration predictor) with rotary
position embeddings (Su et al., "RoFormer", 2021) in place of relative ones. Sizes, eps values and the order of the
operations are those of the authors' implementation (shivammehta25/Matcha-TTS), so that its weights compute its
numbers. Sequences are channels-first ``(B, C, T)``; masks ``(B, 1, T)``, 1 on frames or tokens, 0 on padding."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sequence_mask(lengths: torch.Tensor, max_length: int | None = None) -> torch.Tensor:
    """``(B, max_length)`` bool, True before each item's length (``lengths`` ``(B,)``, integers or floats)."""
    max_length = int(lengths.max()) if max_length is None else max_length
    return torch.arange(max_length, dtype=lengths.dtype, device=lengths.device)[None] < lengths[:, None]


def generate_path(durations: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The hard alignment of durations: ``durations`` ``(B, T_text)`` frames per token (whole numbers, as floats),
    ``mask`` ``(B, T_text, T_mel)``; returns ``(B, T_text, T_mel)`` in ``mask``'s dtype, 1 where frame ``j`` belongs
    to token ``i`` (frames ``cumsum[i - 1] <= j < cumsum[i]``), times ``mask``."""
    b, t_text, t_mel = mask.shape
    ends = sequence_mask(torch.cumsum(durations, 1).reshape(b * t_text), t_mel).to(mask.dtype).view(b, t_text, t_mel)
    return (ends - F.pad(ends, (0, 0, 1, 0))[:, :-1]) * mask


class ChannelNorm(nn.Module):
    """Layer norm over the channels of ``(B, C, T)``, eps 1e-4, a scale ``gamma`` and shift ``beta`` per channel
    (Glow-TTS's ``LayerNorm``)."""

    def __init__(self, channels: int, eps: float = 1e-4):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(1, keepdim=True)
        variance = ((x - mean) ** 2).mean(1, keepdim=True)
        return (x - mean) * torch.rsqrt(variance + self.eps) * self.gamma[None, :, None] + self.beta[None, :, None]


class Prenet(nn.Module):
    """Glow-TTS's ``ConvReluNorm`` prenet, ``(B, C, T) -> (B, C, T)``: ``layers`` times convolution (``kernel_size``,
    same length), channel norm, ReLU, dropout; then ``x + proj(h)`` with ``proj`` a 1x1 convolution that starts at 0
    (the prenet starts as the identity)."""

    def __init__(self, channels: int, kernel_size: int = 5, layers: int = 3, dropout: float = 0.5):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2)
                                   for _ in range(layers))
        self.norms = nn.ModuleList(ChannelNorm(channels) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.proj = nn.Conv1d(channels, channels, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x
        for conv, norm in zip(self.convs, self.norms):
            h = self.dropout(torch.relu(norm(conv(h * mask))))
        return (x + self.proj(h)) * mask


class DurationPredictor(nn.Module):
    """Log-duration of each token, ``(B, C, T_text) -> (B, 1, T_text)``: two convolutions (``kernel_size``) each with
    ReLU, channel norm and dropout, then a 1x1 projection; masked before each convolution and at the end."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, dropout: float):
        super().__init__()
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_1 = ChannelNorm(filter_channels)
        self.conv_2 = nn.Conv1d(filter_channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.norm_2 = ChannelNorm(filter_channels)
        self.proj = nn.Conv1d(filter_channels, 1, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.dropout(self.norm_1(torch.relu(self.conv_1(x * mask))))
        x = self.dropout(self.norm_2(torch.relu(self.conv_2(x * mask))))
        return self.proj(x * mask) * mask


def rotate(x: torch.Tensor, features: int, base: int = 10_000) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``(B, heads, T, head_channels)`` on its first ``features`` channels (even;
    the rest pass): the pairs ``(i, i + features / 2)`` turn by ``t * base^(-2i / features)`` at position ``t``."""
    theta = 1.0 / (base ** (torch.arange(0, features, 2, device=x.device).float() / features))
    angles = torch.einsum("n,d->nd", torch.arange(x.shape[2], device=x.device).float(), theta)
    angles = torch.cat([angles, angles], dim=1)
    half = features // 2
    rope, rest = x[..., :features], x[..., features:]
    turned = torch.cat([-rope[..., half:], rope[..., :half]], dim=-1)
    return torch.cat([rope * angles.cos() + turned * angles.sin(), rest], dim=-1)


class RotarySelfAttention(nn.Module):
    """Multi-head self-attention over ``(B, C, T)`` with 1x1 convolutions for the queries, keys, values and output,
    rotary positions on half of each head's channels of the queries and keys, padded keys masked (score -1e4) and
    dropout on the weights. The three input projections start Xavier-uniform."""

    def __init__(self, channels: int, heads: int, dropout: float = 0.0):
        super().__init__()
        if channels % heads:
            raise ValueError(f"{channels} channels do not split into {heads} heads")
        self.heads, self.head_channels = heads, channels // heads
        self.query, self.key, self.value, self.out = (nn.Conv1d(channels, channels, 1) for _ in range(4))
        self.dropout = nn.Dropout(dropout)
        for conv in (self.query, self.key, self.value):
            nn.init.xavier_uniform_(conv.weight)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, heads * c, T) -> (B, heads, T, c)``."""
        return x.view(x.shape[0], self.heads, self.head_channels, x.shape[2]).transpose(2, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``(B, C, T)``, ``mask`` ``(B, 1, T, T)`` (1: query and key both real) -> ``(B, C, T)``."""
        features = int(self.head_channels * 0.5)
        query = rotate(self.split(self.query(x)), features)
        key = rotate(self.split(self.key(x)), features)
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.head_channels)
        weights = self.dropout(torch.softmax(scores.masked_fill(mask == 0, -1e4), dim=-1))
        out = torch.matmul(weights, self.split(self.value(x)))
        return self.out(out.transpose(2, 3).reshape(x.shape))


class FeedForward(nn.Module):
    """Two convolutions (``kernel_size``, same length) with a ReLU and dropout between, masked before each and after."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int, dropout: float = 0.0):
        super().__init__()
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size, padding=kernel_size // 2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.conv_2(self.dropout(torch.relu(self.conv_1(x * mask))) * mask) * mask


class EncoderLayer(nn.Module):
    """A post-norm transformer layer: ``x = norm(x + attn(x))``, ``x = norm(x + ffn(x))``, dropout on each branch."""

    def __init__(self, channels: int, filter_channels: int, heads: int, kernel_size: int, dropout: float):
        super().__init__()
        self.attn = RotarySelfAttention(channels, heads, dropout)
        self.norm_attn = ChannelNorm(channels)
        self.ffn = FeedForward(channels, filter_channels, kernel_size, dropout)
        self.norm_ffn = ChannelNorm(channels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm_attn(x * mask + self.dropout(self.attn(x * mask, pair_mask)))
        return self.norm_ffn(x + self.dropout(self.ffn(x, mask)))


class TextEncoder(nn.Module):
    """Token ids ``(B, T_text)`` and lengths ``(B,)`` (and speaker vectors ``(B, speaker_channels)`` when
    ``speaker_channels`` > 0) -> ``mu`` ``(B, n_feats, T_text)``, the mean of each token's mel frames (normalised mel),
    ``logw`` ``(B, 1, T_text)``, its log-duration in frames, and the mask ``(B, 1, T_text)``. The embedding (scaled
    by ``sqrt(channels)``) goes through the prenet, is joined by the speaker vector, then ``layers`` transformer layers;
    ``mu`` is a 1x1 projection, and the duration predictor reads a detached copy (its loss trains only itself)."""

    def __init__(self, n_vocab: int, n_feats: int, channels: int, filter_channels: int, heads: int, layers: int,
                 kernel_size: int, dropout: float, duration_channels: int, speaker_channels: int = 0):
        super().__init__()
        self.channels, width = channels, channels + speaker_channels
        self.embedding = nn.Embedding(n_vocab, channels)
        nn.init.normal_(self.embedding.weight, 0.0, channels ** -0.5)
        self.prenet = Prenet(channels)
        self.layers = nn.ModuleList(EncoderLayer(width, filter_channels, heads, kernel_size, dropout)
                                    for _ in range(layers))
        self.to_mu = nn.Conv1d(width, n_feats, 1)
        self.durations = DurationPredictor(width, duration_channels, kernel_size, dropout)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor, speakers: torch.Tensor | None = None):
        x = (self.embedding(ids) * math.sqrt(self.channels)).transpose(1, 2)
        mask = sequence_mask(lengths, x.shape[2]).unsqueeze(1).to(x.dtype)
        x = self.prenet(x, mask)
        if speakers is not None:
            x = torch.cat([x, speakers.unsqueeze(-1).expand(-1, -1, x.shape[-1])], dim=1)
        pair_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        for layer in self.layers:
            x = layer(x, mask, pair_mask)
        x = x * mask
        return self.to_mu(x) * mask, self.durations(x.detach(), mask), mask
