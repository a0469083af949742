"""Building blocks of Matcha-TTS's flow-matching decoder (Mehta et al., ICASSP 2024, Section 3 and Figure 1): the
vector field estimator, a 1-D U-Net whose every level is a residual convolution block followed by transformer blocks
(snake-beta feed-forward, Section 3), conditioned on the time step by a sinusoidal embedding and an MLP. The pieces the
authors take from Hugging Face's ``diffusers`` (the timestep MLP, the transformer block and its attention) are written
here with the same parameters and arithmetic; among them, the attention adds the 0/1 frame mask to the scores (as
``diffusers`` does with a float mask), so padded frames keep weight ``e^-1`` relative to real ones, as in the authors'
trained models. Sequences are channels-first ``(B, C, T)``; masks ``(B, 1, T)``."""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int, scale: float = 1000.0) -> torch.Tensor:
    """Sinusoidal embedding of ``t`` (a scalar or ``(B,)``, in [0, 1]) -> ``(B or 1, dim)``: ``sin`` then ``cos`` of
    ``scale * t * 10000^(-k / (dim / 2 - 1))``, ``k < dim / 2`` (``dim`` even)."""
    t = t.reshape(-1)
    half = dim // 2
    frequencies = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    angles = scale * t.unsqueeze(1) * frequencies.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class TimestepMLP(nn.Module):
    """``(N, in_channels) -> (N, channels)``: linear, SiLU, linear (``diffusers``' ``TimestepEmbedding``)."""

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, channels)
        self.linear_2 = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class ConvBlock(nn.Module):
    """``(B, C_in, T) -> (B, C_out, T)``: convolution (kernel 3) of the masked input, group norm (``groups``), Mish;
    masked."""

    def __init__(self, in_channels: int, out_channels: int, groups: int = 8):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3, padding=1)
        self.norm = nn.GroupNorm(groups, out_channels)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.mish(self.norm(self.conv(x * mask))) * mask


class ResnetBlock(nn.Module):
    """``(B, C_in, T) -> (B, C_out, T)``: two conv blocks, the time embedding (Mish, linear) added to the first one's
    output, plus a 1x1 convolution of the masked input."""

    def __init__(self, in_channels: int, out_channels: int, time_channels: int):
        super().__init__()
        self.time_proj = nn.Linear(time_channels, out_channels)
        self.block1 = ConvBlock(in_channels, out_channels)
        self.block2 = ConvBlock(out_channels, out_channels)
        self.res_conv = nn.Conv1d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        h = self.block1(x, mask) + self.time_proj(F.mish(time)).unsqueeze(-1)
        return self.block2(h, mask) + self.res_conv(x * mask)


class SnakeBetaFeedForward(nn.Module):
    """``(B, T, C) -> (B, T, C)``: linear to ``4 C``, snake-beta ``h + sin^2(e^alpha h) / (e^beta + 1e-9)`` (alpha,
    beta per channel, log scale, starting at 0), dropout, linear back."""

    def __init__(self, channels: int, dropout: float, mult: int = 4):
        super().__init__()
        self.proj = nn.Linear(channels, channels * mult)
        self.alpha = nn.Parameter(torch.zeros(channels * mult))
        self.beta = nn.Parameter(torch.zeros(channels * mult))
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(channels * mult, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        h = h + (1.0 / (torch.exp(self.beta) + 1e-9)) * torch.pow(torch.sin(h * torch.exp(self.alpha)), 2)
        return self.out(self.dropout(h))


class FrameAttention(nn.Module):
    """Self-attention over ``(B, T, C)``: ``heads`` heads of ``head_channels``, queries, keys and values without bias,
    scaled dot products plus the 0/1 frame mask ``(B, T)`` (added, see the module's docstring), an output linear with
    bias and dropout."""

    def __init__(self, channels: int, heads: int, head_channels: int, dropout: float):
        super().__init__()
        self.heads, inner = heads, heads * head_channels
        self.query = nn.Linear(channels, inner, bias=False)
        self.key = nn.Linear(channels, inner, bias=False)
        self.value = nn.Linear(channels, inner, bias=False)
        self.out = nn.Linear(inner, channels)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        query, key, value = (proj(x).view(b, t, self.heads, -1).transpose(1, 2)
                             for proj in (self.query, self.key, self.value))
        h = F.scaled_dot_product_attention(query, key, value, attn_mask=mask[:, None, None, :].to(x.dtype))
        return self.dropout(self.out(h.transpose(1, 2).reshape(b, t, -1)))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block over ``(B, T, C)`` (``diffusers``' ``BasicTransformerBlock`` without cross
    attention): ``x += attn(norm(x))``, ``x += ff(norm(x))``, layer norms of eps 1e-5."""

    def __init__(self, channels: int, heads: int, head_channels: int, dropout: float):
        super().__init__()
        self.norm_attn = nn.LayerNorm(channels)
        self.attn = FrameAttention(channels, heads, head_channels, dropout)
        self.norm_ff = nn.LayerNorm(channels)
        self.ff = SnakeBetaFeedForward(channels, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x), mask)
        return x + self.ff(self.norm_ff(x))


class Level(nn.Module):
    """One U-Net level: a resnet block, ``blocks`` transformer blocks over its frames, and (down and up levels) a
    resampling convolution of the masked output (``resample``; None for the middle levels)."""

    def __init__(self, in_channels: int, channels: int, time_channels: int, blocks: int, attention: tuple,
                 resample: nn.Module | None):
        super().__init__()
        self.resnet = ResnetBlock(in_channels, channels, time_channels)
        self.transformers = nn.ModuleList(TransformerBlock(channels, *attention) for _ in range(blocks))
        self.resample = resample

    def forward(self, x: torch.Tensor, mask: torch.Tensor, time: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, C_in, T)`` -> the level's output ``(B, C, T)`` and its masked output resampled (``(B, C, T / 2)`` down,
        ``(B, C, 2 T)`` up, ``T`` at the last down and up levels; the output itself at a middle level). The
        resampling runs inside ``forward``: a level sharded or recomputed on its own holds all its weights when its
        resampling runs."""
        x = self.resnet(x, mask, time).transpose(1, 2)
        for block in self.transformers:
            x = block(x, mask[:, 0])
        x = x.transpose(1, 2).clone()  # not a view (laid out so already): a split model's backward hook holds it
        return x, x if self.resample is None else self.resample(x * mask)


class UNetDecoder(nn.Module):
    """The vector field ``v(x_t, t | mu, speaker)``: ``x`` and ``mu`` ``(B, n_feats, T)`` (and the speaker vector,
    repeated over frames) stacked on channels, then down levels (each but the last halves the frames: stride-2
    convolution), ``mid_levels`` at the lowest rate, up levels (each joins the down level's output of its rate; each
    but the last doubles the frames: transposed convolution), a conv block and a 1x1 projection to ``n_feats``; masked.
    ``T`` must be divisible by ``2^(len(channels) - 1)``. ``t``: a scalar or ``(B,)``."""

    def __init__(self, in_channels: int, out_channels: int, channels: Sequence[int] = (256, 256),
                 dropout: float = 0.05, attention_head_dim: int = 64, n_blocks: int = 1, num_mid_blocks: int = 2,
                 num_heads: int = 2):
        super().__init__()
        channels, time_channels = tuple(channels), channels[0] * 4
        attention, last = (num_heads, attention_head_dim, dropout), len(channels) - 1
        self.in_channels = in_channels
        self.time_mlp = TimestepMLP(in_channels, time_channels)
        widths = (in_channels, *channels)
        self.down = nn.ModuleList(
            Level(widths[i], widths[i + 1], time_channels, n_blocks, attention,
                  nn.Conv1d(widths[i + 1], widths[i + 1], 3, stride=1 if i == last else 2, padding=1))
            for i in range(len(channels)))
        self.mid = nn.ModuleList(Level(channels[-1], channels[-1], time_channels, n_blocks, attention, None)
                                 for _ in range(num_mid_blocks))
        ups = (*channels[::-1], channels[0])
        self.up = nn.ModuleList(
            Level(2 * ups[i], ups[i + 1], time_channels, n_blocks, attention,
                  nn.Conv1d(ups[i + 1], ups[i + 1], 3, padding=1) if i == last
                  else nn.ConvTranspose1d(ups[i + 1], ups[i + 1], 4, 2, 1))
            for i in range(len(channels)))
        self.final_block = ConvBlock(ups[-1], ups[-1])
        self.final_proj = nn.Conv1d(ups[-1], out_channels, 1)
        for module in self.modules():  # the authors' start: He-normal (ReLU gain) weights, zero biases
            if isinstance(module, (nn.Conv1d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, mu: torch.Tensor, t: torch.Tensor,
                speakers: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, n_feats, T)`` ``x_t``, mask ``(B, 1, T)``, ``mu`` ``(B, n_feats, T)``, ``t`` -> ``(B, n_feats, T)``."""
        time = self.time_mlp(timestep_embedding(t, self.in_channels))
        x = torch.cat([x, mu], dim=1)
        if speakers is not None:
            x = torch.cat([x, speakers.unsqueeze(-1).expand(-1, -1, x.shape[-1])], dim=1)
        skips, masks = [], [mask]
        for level in self.down:
            skip, x = level(x, masks[-1], time)
            skips.append(skip)
            masks.append(masks[-1][:, :, ::2])
        masks.pop()
        for level in self.mid:
            x, _ = level(x, masks[-1], time)
        for level in self.up:
            up_mask = masks.pop()
            _, x = level(torch.cat([x, skips.pop()], dim=1), up_mask, time)
        return self.final_proj(self.final_block(x, up_mask) * up_mask) * mask
