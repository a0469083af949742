"""Linear and 1-D convolution layers with Xavier-uniform weights scaled by ``calculate_gain(w_init_gain)`` for the
following nonlinearity (Glorot and Bengio, 2010): the two primitive layers of NVIDIA's Tacotron2 (``layers.py``)."""

from __future__ import annotations

from typing import Optional

from torch import nn


class LinearNorm(nn.Linear):
    """``nn.Linear``, ``(..., in_dim) -> (..., out_dim)``, with Xavier-uniform weights scaled by the gain of
    ``w_init_gain`` (``"linear"``, ``"tanh"``, ``"relu"``, ...). Raises ValueError: an unknown ``w_init_gain``."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, w_init_gain: str = "linear"):
        super().__init__(in_dim, out_dim, bias=bias)
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain(w_init_gain))


class ConvNorm(nn.Conv1d):
    """``nn.Conv1d`` with Xavier-uniform weights scaled by the gain of ``w_init_gain`` and, when ``padding`` is
    ``None``, "same" padding (``dilation * (kernel_size - 1) / 2`` zeros each side): ``(B, in_channels, T) -> (B,
    out_channels, T)`` at stride 1. Raises ValueError: ``padding`` is ``None`` and ``kernel_size`` is even, or an
    unknown ``w_init_gain``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1,
                 padding: Optional[int] = None, dilation: int = 1, bias: bool = True, w_init_gain: str = "linear"):
        if padding is None:
            if kernel_size % 2 != 1:
                raise ValueError(f"ConvNorm: 'same' padding needs an odd kernel_size, got {kernel_size}")
            padding = dilation * (kernel_size - 1) // 2
        super().__init__(in_channels, out_channels, kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, bias=bias)
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain(w_init_gain))
