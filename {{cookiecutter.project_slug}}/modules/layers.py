"""Linear and 1-D convolution layers with Xavier initialisation scaled for the following nonlinearity.

These are the two primitive layers of NVIDIA's Tacotron2 reference (``layers.py``): the weight is drawn
with ``xavier_uniform_`` and gain ``torch.nn.init.calculate_gain(w_init_gain)``, so a layer followed by
``tanh`` or ``relu`` starts with activations of a sensible scale (Glorot and Bengio, 2010).
"""

from __future__ import annotations

from typing import Optional

from torch import nn


class LinearNorm(nn.Linear):
    """``nn.Linear`` with Xavier-uniform weights scaled by the gain of ``w_init_gain``.

    Input ``(..., in_dim)`` -> output ``(..., out_dim)``.

    Args:
        in_dim: input features.
        out_dim: output features.
        bias: learn an additive bias (initialised as ``nn.Linear`` does).
        w_init_gain: nonlinearity name for :func:`torch.nn.init.calculate_gain` (``"linear"``,
            ``"tanh"``, ``"relu"``, ``"sigmoid"``, ...).

    Raises:
        ValueError: an unknown ``w_init_gain`` (raised by ``calculate_gain``).
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, w_init_gain: str = "linear"):
        super().__init__(in_dim, out_dim, bias=bias)
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain(w_init_gain))


class ConvNorm(nn.Conv1d):
    """``nn.Conv1d`` with "same" padding by default and Xavier-uniform weights scaled by ``w_init_gain``.

    Input ``(B, in_channels, T)`` -> output ``(B, out_channels, T)`` when ``stride == 1`` and the padding
    is left to this class (``padding = dilation * (kernel_size - 1) / 2`` zeros on each side).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: taps; must be odd when ``padding`` is ``None``.
        stride: step in samples/frames.
        padding: zeros added on each side; ``None`` for "same" padding.
        dilation: spacing between taps.
        bias: learn a per-channel bias.
        w_init_gain: nonlinearity name for :func:`torch.nn.init.calculate_gain`.

    Raises:
        ValueError: ``padding`` is ``None`` and ``kernel_size`` is even (no symmetric "same" padding), or an
            unknown ``w_init_gain``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, stride: int = 1,
                 padding: Optional[int] = None, dilation: int = 1, bias: bool = True,
                 w_init_gain: str = "linear"):
        if padding is None:
            if kernel_size % 2 != 1:
                raise ValueError(f"ConvNorm: 'same' padding needs an odd kernel_size, got {kernel_size}")
            padding = dilation * (kernel_size - 1) // 2
        super().__init__(in_channels, out_channels, kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, bias=bias)
        nn.init.xavier_uniform_(self.weight, gain=nn.init.calculate_gain(w_init_gain))
