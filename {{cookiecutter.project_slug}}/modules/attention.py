"""Location-sensitive attention (Chorowski et al., 2015), as used by Tacotron2 (Shen et al., 2018): the energy of
encoder position ``j`` is ``e_j = v^T tanh(W q + V h_j + U f_j)``, with ``q`` the attention-RNN output (query), ``h_j``
the encoder output (memory) and ``f_j`` a 1-D convolution over the previous attention weights and their running sum.
``V h_j`` is computed once per utterance (``process_memory``). Sizes follow NVIDIA's Tacotron2 reference."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from modules.layers import ConvNorm, LinearNorm


class LocationSensitiveAttention(nn.Module):
    """Additive attention with location features from the previous and cumulative alignments: a query of ``query_dim``
    (the attention LSTM's state), memory vectors of ``memory_dim``, energies computed in a space of ``attention_dim``,
    ``n_location_filters`` location filters ``location_kernel_size`` encoder steps wide. Raises ValueError:
    ``location_kernel_size`` is even."""

    def __init__(self, query_dim: int, memory_dim: int, attention_dim: int = 128,
                 n_location_filters: int = 32, location_kernel_size: int = 31):
        super().__init__()
        self.query_layer = LinearNorm(query_dim, attention_dim, bias=False, w_init_gain="tanh")
        self.memory_layer = LinearNorm(memory_dim, attention_dim, bias=False, w_init_gain="tanh")
        self.v = LinearNorm(attention_dim, 1, bias=False)
        self.location_conv = ConvNorm(2, n_location_filters, kernel_size=location_kernel_size, bias=False)
        self.location_dense = LinearNorm(n_location_filters, attention_dim, bias=False, w_init_gain="tanh")

    def process_memory(self, memory: torch.Tensor) -> torch.Tensor:
        """Project the encoder outputs once per utterance: ``(B, L, memory_dim) -> (B, L, attention_dim)``."""
        return self.memory_layer(memory)

    def energies(self, query: torch.Tensor, processed_memory: torch.Tensor,
                 attention_weights_cat: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``(B, L)`` of every encoder position for this step, from ``query`` ``(B, query_dim)``,
        ``processed_memory`` ``(B, L, attention_dim)`` and ``attention_weights_cat`` ``(B, 2, L)`` (previous and
        cumulative weights)."""
        processed_query = self.query_layer(query).unsqueeze(1)  # (B, 1, A)
        location = self.location_dense(self.location_conv(attention_weights_cat).transpose(1, 2))  # (B, L, A)
        return self.v(torch.tanh(processed_query + location + processed_memory)).squeeze(-1)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, processed_memory: torch.Tensor,
                attention_weights_cat: torch.Tensor, mask: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """One attention step over ``memory`` ``(B, L, memory_dim)``; the other inputs as in :meth:`energies`, and
        ``mask`` ``(B, L)`` bool, ``True`` at padded encoder positions (they get zero weight), or ``None`` -> ``(context
        (B, memory_dim), weights (B, L))``: the weighted sum of ``memory``, and float32 weights (sum 1 where unmasked).
        Raises ValueError: ``mask`` does not have shape ``(B, L)``."""
        energies = self.energies(query, processed_memory, attention_weights_cat)
        if mask is not None:
            if mask.shape != energies.shape:
                raise ValueError(f"attention mask has shape {tuple(mask.shape)}, expected {tuple(energies.shape)}")
            # The most negative finite value, not -inf: safe in bf16/fp16, a fully masked row gives no NaN.
            energies = energies.masked_fill(mask, torch.finfo(energies.dtype).min)
        weights = F.softmax(energies.float(), dim=1)
        context = torch.bmm(weights.unsqueeze(1).to(memory.dtype), memory).squeeze(1)
        return context, weights
