"""Building blocks of WaveGlow: the invertible 1x1 convolution and the WN coupling network (Prenger, Valle and
Catanzaro, "WaveGlow: a flow-based generative network for speech synthesis", ICASSP 2019; NVIDIA's initialisation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it already is: determinants and inverses need the precision."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class Invertible1x1Conv(nn.Module):
    """A learned channel mixing ``z -> W z``, orthogonal at first, exactly invertible (Glow: Kingma and Dhariwal, 2018).
    ``forward(z)``: ``(B, C, T)`` -> ``(W z, log|det W| * B * T)``; determinant and inverse in >= float32."""

    def __init__(self, channels: int):
        super().__init__()
        weight, _ = torch.linalg.qr(torch.randn(channels, channels))
        if torch.linalg.det(weight) < 0:  # a rotation (det +1), so log|det| starts at 0
            weight[:, 0] = -weight[:, 0]
        self.weight = nn.Parameter(weight)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        batch, _, steps = z.shape
        log_det = torch.linalg.slogdet(at_least_fp32(self.weight))[1] * (batch * steps)
        return F.conv1d(z, self.weight.to(z.dtype).unsqueeze(-1)), log_det

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        """Undo :meth:`forward` on ``(B, C, T)``."""
        w_inv = torch.linalg.inv(at_least_fp32(self.weight))
        return F.conv1d(z, w_inv.to(z.dtype).unsqueeze(-1))


def add_gated_activation(x: torch.Tensor, cond: torch.Tensor, channels: int) -> torch.Tensor:
    """WaveNet's gate on a sum, ``tanh(s[:, :C]) * sigmoid(s[:, C:])`` with ``s = x + cond``: ``(B, 2C, T)`` inputs ->
    ``(B, C, T)``, ``C = channels`` (NVIDIA's ``fused_add_tanh_sigmoid_multiply``)."""
    summed = x + cond
    return torch.tanh(summed[:, :channels]) * torch.sigmoid(summed[:, channels:])


class WN(nn.Module):
    """The non-causal WaveNet-like network that predicts an affine coupling's shift and log-scale: ``n_layers`` dilated
    layers (dilation ``2**i``) of ``channels`` residual channels. ``forward(audio (B, in_channels, T), cond (B,
    cond_channels, T))`` -> ``(B, 2 * in_channels, T)``: the shift ``b``, then ``log s``; the last convolution starts at
    zero, so every coupling starts as the identity. Raises ValueError for an even ``kernel_size``."""

    def __init__(self, in_channels: int, cond_channels: int, n_layers: int, channels: int, kernel_size: int):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"WN kernel_size must be odd, got {kernel_size}")
        self.n_layers = n_layers
        self.channels = channels
        self.start = parametrizations.weight_norm(nn.Conv1d(in_channels, channels, 1))
        self.cond = parametrizations.weight_norm(nn.Conv1d(cond_channels, 2 * channels * n_layers, 1))
        self.dilated = nn.ModuleList()
        self.res_skip = nn.ModuleList()
        for i in range(n_layers):
            dilation = 2 ** i
            self.dilated.append(parametrizations.weight_norm(nn.Conv1d(
                channels, 2 * channels, kernel_size, dilation=dilation, padding=dilation * (kernel_size - 1) // 2)))
            out = 2 * channels if i < n_layers - 1 else channels  # the last layer has no residual output
            self.res_skip.append(parametrizations.weight_norm(nn.Conv1d(channels, out, 1)))
        self.end = nn.Conv1d(channels, 2 * in_channels, 1)
        nn.init.zeros_(self.end.weight)
        nn.init.zeros_(self.end.bias)

    def forward(self, audio: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        x = self.start(audio)
        cond = self.cond(cond)
        skip = None  # the first layer's skip output starts the sum (no zero tensor to add to)
        c = self.channels
        for i in range(self.n_layers):
            acts = add_gated_activation(self.dilated[i](x), cond[:, 2 * c * i: 2 * c * (i + 1)], c)
            res_skip = self.res_skip[i](acts)
            if i < self.n_layers - 1:
                x = x + res_skip[:, :c]
                res_skip = res_skip[:, c:]
            skip = res_skip if skip is None else skip + res_skip
        return self.end(skip)
