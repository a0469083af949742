"""The parts of Tacotron2: pre-net, encoder, attention decoder and post-net (Shen et al., 2018, "Natural TTS synthesis
by conditioning WaveNet on mel spectrogram predictions", ICASSP), with the sizes and training details of NVIDIA's
reference. Beyond the reference, padded positions are zeroed between the encoder (and, given a mask, post-net)
convolutions, so in evaluation mode the outputs at real positions do not depend on a batch's padding."""

from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from modules.attention import LocationSensitiveAttention
from modules.layers import ConvNorm, LinearNorm


def get_padding_mask(lengths: torch.Tensor, max_len: Optional[int] = None) -> torch.Tensor:
    """Boolean mask ``(B, max_len)``, ``True`` at padded positions (index >= length), for ``lengths`` ``(B,)``;
    ``max_len`` defaults to ``lengths.max()``. Raises ValueError: ``lengths`` is not 1-D, or a length is negative or
    exceeds ``max_len``."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if max_len is None:
        max_len = int(lengths.max())
    if bool((lengths < 0).any()) or bool((lengths > max_len).any()):
        raise ValueError(f"lengths {lengths.tolist()} must lie in [0, {max_len}]")
    return torch.arange(max_len, device=lengths.device).unsqueeze(0) >= lengths.unsqueeze(1)


def pad_memory(memory: torch.Tensor, mask: Optional[torch.Tensor], multiple: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad encoder outputs ``(B, L, E)`` with zeros along the text axis to ``(B, L', E)``, ``L'`` the smallest multiple
    of ``multiple`` >= ``L``; returns them and the mask ``(B, L')``, ``True`` at padded positions (those of ``mask``
    ``(B, L)``, none if it is ``None``, and the added ones). Raises ValueError: ``multiple < 1`` or a mask of another
    shape than ``(B, L)``."""
    if multiple < 1:
        raise ValueError(f"pad_memory: multiple must be >= 1, got {multiple}")
    batch, length = memory.size(0), memory.size(1)
    if mask is not None and mask.shape != (batch, length):
        raise ValueError(f"pad_memory: mask has shape {tuple(mask.shape)}, expected {(batch, length)}")
    if mask is None:
        mask = torch.zeros(batch, length, dtype=torch.bool, device=memory.device)
    extra = -length % multiple
    if extra == 0:
        return memory, mask
    return F.pad(memory, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=True)


class Prenet(nn.Module):
    """Bottleneck for the previous mel frame, ``(..., in_dim) -> (..., sizes[-1])``: per size, linear, ReLU, dropout.
    The dropout stays on at inference, as in Shen et al. (2018) and NVIDIA's reference."""

    def __init__(self, in_dim: int, sizes: tuple[int, ...] = (256, 256), dropout: float = 0.5):
        super().__init__()
        in_sizes = (in_dim, *sizes[:-1])
        self.layers = nn.ModuleList([LinearNorm(i, o, bias=False) for i, o in zip(in_sizes, sizes)])
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., in_dim) -> (..., sizes[-1])`` with dropout always on."""
        for linear in self.layers:
            x = F.dropout(F.relu(linear(x)), p=self.dropout, training=True)
        return x


class Encoder(nn.Module):
    """Character encoder: ``n_convolutions`` x (conv ``kernel_size`` characters wide, batch norm, ReLU, dropout in
    training), then a BiLSTM of ``embedding_dim / 2`` units per direction. Raises ValueError: ``embedding_dim`` is odd
    or ``kernel_size`` is even."""

    def __init__(self, embedding_dim: int = 512, n_convolutions: int = 3, kernel_size: int = 5,
                 dropout: float = 0.5):
        super().__init__()
        if embedding_dim % 2:
            raise ValueError(f"Encoder: embedding_dim must be even (two LSTM directions), got {embedding_dim}")
        self.convolutions = nn.ModuleList([
            nn.Sequential(ConvNorm(embedding_dim, embedding_dim, kernel_size=kernel_size, w_init_gain="relu"),
                          nn.BatchNorm1d(embedding_dim))
            for _ in range(n_convolutions)])
        self.lstm = nn.LSTM(embedding_dim, embedding_dim // 2, num_layers=1, batch_first=True, bidirectional=True)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Embedded text ``(B, embedding_dim, L)`` and ``lengths`` ``(B,)`` (``None``: no padding) -> ``(B, L,
        embedding_dim)``, zero past each length. Raises ValueError: ``lengths`` has the wrong shape or a length below
        1."""
        max_len = x.size(2)
        keep = None
        if lengths is not None:
            if lengths.shape != (x.size(0),):
                raise ValueError(f"Encoder: lengths must have shape ({x.size(0)},), got {tuple(lengths.shape)}")
            if bool((lengths < 1).any()):
                raise ValueError(f"Encoder: every text length must be >= 1, got {lengths.tolist()}")
            keep = ~get_padding_mask(lengths, max_len).unsqueeze(1)  # (B, 1, L)
        for conv in self.convolutions:
            if keep is not None:
                x = x * keep
            x = F.dropout(F.relu(conv(x)), self.dropout, self.training)
        x = x.transpose(1, 2)  # (B, L, C)
        self.lstm.flatten_parameters()
        if lengths is None:
            return self.lstm(x)[0]
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        return nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=max_len)[0]


class Postnet(nn.Module):
    """Residual mel refiner: ``n_convolutions`` x (conv ``kernel_size`` frames wide, batch norm), each followed by tanh
    but the last, and by dropout in training. The model adds its output to the decoder's mel. Raises ValueError:
    ``n_convolutions < 2``."""

    def __init__(self, n_mels: int, embedding_dim: int = 512, kernel_size: int = 5, n_convolutions: int = 5,
                 dropout: float = 0.5):
        super().__init__()
        if n_convolutions < 2:
            raise ValueError(f"Postnet: n_convolutions must be >= 2, got {n_convolutions}")
        channels = [n_mels] + [embedding_dim] * (n_convolutions - 1) + [n_mels]
        self.convolutions = nn.ModuleList([
            nn.Sequential(ConvNorm(channels[i], channels[i + 1], kernel_size=kernel_size,
                                   w_init_gain="linear" if i == n_convolutions - 1 else "tanh"),
                          nn.BatchNorm1d(channels[i + 1]))
            for i in range(n_convolutions)])
        self.dropout = dropout

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(B, n_mels, T) -> (B, n_mels, T)``; the frames where ``mask`` ``(B, T)`` is ``True`` (padding) are zeroed
        before every layer."""
        keep = None if mask is None else ~mask.unsqueeze(1)
        last = len(self.convolutions) - 1
        for i, conv in enumerate(self.convolutions):
            if keep is not None:
                x = x * keep
            x = conv(x)
            if i < last:
                x = torch.tanh(x)
            x = F.dropout(x, self.dropout, self.training)
        return x


class Decoder(nn.Module):
    """Autoregressive attention decoder, one mel frame and one stop-gate logit per step: pre-net on the previous frame;
    attention LSTM on (pre-net output, previous context); location-sensitive attention gives a new context; decoder
    LSTM on (attention LSTM output, context); linear projections of (decoder LSTM output, context) give the frame and
    the gate logit. Dropout on the two LSTM outputs in training, carried to the next step. ``cfg``: the ``tacotron2``
    config section, as NVIDIA's ``hparams``; ``memory_dim``: the width of the memory it attends to (``None``:
    ``cfg.encoder_embedding_dim``; wider by a speaker embedding concatenated to it, as in NVIDIA's Mellotron)."""

    def __init__(self, n_mels: int, cfg, memory_dim: Optional[int] = None):
        super().__init__()
        encoder_dim, prenet_dim = memory_dim or cfg.encoder_embedding_dim, cfg.prenet_dim
        self.n_mels, self.encoder_dim = n_mels, encoder_dim
        self.attention_rnn_dim, self.decoder_rnn_dim = cfg.attention_rnn_dim, cfg.decoder_rnn_dim
        self.max_decoder_steps, self.gate_threshold = cfg.max_decoder_steps, cfg.gate_threshold
        self.p_attention_dropout, self.p_decoder_dropout = cfg.p_attention_dropout, cfg.p_decoder_dropout
        self.prenet = Prenet(n_mels, (prenet_dim, prenet_dim))
        self.attention_rnn = nn.LSTMCell(prenet_dim + encoder_dim, cfg.attention_rnn_dim)
        self.attention = LocationSensitiveAttention(cfg.attention_rnn_dim, encoder_dim, cfg.attention_dim,
                                                    cfg.attention_location_n_filters,
                                                    cfg.attention_location_kernel_size)
        self.decoder_rnn = nn.LSTMCell(cfg.attention_rnn_dim + encoder_dim, cfg.decoder_rnn_dim)
        self.linear_projection = LinearNorm(cfg.decoder_rnn_dim + encoder_dim, n_mels)
        self.gate_layer = LinearNorm(cfg.decoder_rnn_dim + encoder_dim, 1, w_init_gain="sigmoid")
        self.text_bucket, self._compiled_step = 1, None  # the fast path, off until enable_fast_path

    def enable_fast_path(self, text_bucket: int = 32, **compile_kwargs) -> None:
        """Run the teacher-forced loop of :meth:`forward` through a compiled step function: the loop is launch-bound on
        a GPU (~245 small operator calls per step), ``torch.compile`` of the step makes it two calls of fused kernels.
        The memory is padded along the text axis to a multiple of ``text_bucket`` symbols (masked: outputs unchanged);
        step 0 runs eagerly; :meth:`inference` stays eager. Dropout in the compiled step draws other samples of the same
        distribution. ``compile_kwargs`` go to ``torch.compile`` (defaults ``fullgraph=True``, ``dynamic=False``).
        Raises ValueError: ``text_bucket < 1``."""
        if text_bucket < 1:
            raise ValueError(f"Decoder.enable_fast_path: text_bucket must be >= 1, got {text_bucket}")
        compile_kwargs.setdefault("fullgraph", True)
        compile_kwargs.setdefault("dynamic", False)
        self.text_bucket = text_bucket
        # The unbound function: a deep copy of the model shares the compiled code but runs on its own parameters.
        self._compiled_step = torch.compile(type(self)._step, **compile_kwargs)

    def _initial_state(self, memory: torch.Tensor) -> dict[str, torch.Tensor]:
        """Zero LSTM states, attention weights and context for a batch of ``memory`` ``(B, L, E)``."""
        batch, max_len = memory.size(0), memory.size(1)
        dtype = self.linear_projection.weight.dtype

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, device=memory.device, dtype=dtype)

        attention, decoder = self.attention_rnn_dim, self.decoder_rnn_dim
        return {"attention_hidden": zeros(batch, attention), "attention_cell": zeros(batch, attention),
                "decoder_hidden": zeros(batch, decoder), "decoder_cell": zeros(batch, decoder),
                "weights": zeros(batch, max_len).float(), "weights_cum": zeros(batch, max_len).float(),
                "context": zeros(batch, self.encoder_dim)}

    def _step(self, prenet_out: torch.Tensor, state: dict[str, torch.Tensor], memory: torch.Tensor,
              processed_memory: torch.Tensor, mask: Optional[torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One decoder step: returns frame ``(B, n_mels)``, gate logit ``(B,)`` and the new state."""
        attention_hidden, attention_cell = self.attention_rnn(
            torch.cat((prenet_out, state["context"]), dim=-1), (state["attention_hidden"], state["attention_cell"]))
        attention_hidden = F.dropout(attention_hidden, self.p_attention_dropout, self.training)
        weights_cat = torch.stack((state["weights"], state["weights_cum"]), dim=1)  # (B, 2, L)
        context, weights = self.attention(attention_hidden, memory, processed_memory, weights_cat, mask)
        decoder_hidden, decoder_cell = self.decoder_rnn(
            torch.cat((attention_hidden, context), dim=-1), (state["decoder_hidden"], state["decoder_cell"]))
        decoder_hidden = F.dropout(decoder_hidden, self.p_decoder_dropout, self.training)
        features = torch.cat((decoder_hidden, context), dim=-1)
        frame, gate = self.linear_projection(features), self.gate_layer(features).squeeze(-1)
        new_state = {"attention_hidden": attention_hidden, "attention_cell": attention_cell,
                     "decoder_hidden": decoder_hidden, "decoder_cell": decoder_cell,
                     "weights": weights, "weights_cum": state["weights_cum"] + weights, "context": context}
        return frame, gate, new_state

    def forward(self, memory: torch.Tensor, mels: torch.Tensor, memory_mask: Optional[torch.Tensor] = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced decoding (step ``t`` sees the ground-truth frame ``t - 1``) of ``memory`` ``(B, L,
        encoder_dim)``, ``mels`` ``(B, n_mels, T)`` targets, ``memory_mask`` ``(B, L)`` bool, ``True`` at padded text
        positions (or ``None``) -> ``(mel (B, n_mels, T), gate logits (B, T), alignments (B, T, L))``. Raises
        ValueError: ``mels`` does not have ``n_mels`` channels, or batch sizes differ."""
        if mels.dim() != 3 or mels.size(1) != self.n_mels:
            raise ValueError(f"Decoder expects mels of shape (B, {self.n_mels}, T), got {tuple(mels.shape)}")
        if mels.size(0) != memory.size(0):
            raise ValueError(f"Decoder: {mels.size(0)} mels for {memory.size(0)} encoded texts")
        go = mels.new_zeros(mels.size(0), self.n_mels, 1)
        # All T + 1 frames through the pre-net, the last unused, as NVIDIA's reference: the same dropout masks
        inputs = self.prenet(torch.cat((go, mels), dim=2).permute(2, 0, 1))[:-1]  # (T, B, prenet_dim)
        text_len = memory.size(1)
        if self.text_bucket > 1:
            memory, memory_mask = pad_memory(memory, memory_mask, self.text_bucket)
        processed_memory = self.attention.process_memory(memory)
        state = self._initial_state(memory)
        frames, gates, alignments = [], [], []
        for t, prenet_out in enumerate(inputs):
            if t == 0 or self._compiled_step is None:
                frame, gate, state = self._step(prenet_out, state, memory, processed_memory, memory_mask)
            else:
                frame, gate, state = self._compiled_step(self, prenet_out, state, memory, processed_memory,
                                                         memory_mask)
            frames.append(frame)
            gates.append(gate)
            alignments.append(state["weights"])
        alignments = torch.stack(alignments, dim=1)
        if alignments.size(2) != text_len:
            alignments = alignments[:, :, :text_len]
        return torch.stack(frames, dim=2), torch.stack(gates, dim=1), alignments

    @torch.no_grad()
    def inference(self, memory: torch.Tensor, progress: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Free-running decoding of ``memory`` ``(B, L, encoder_dim)`` (no padding), each step fed the previous
        predicted frame -> ``(mel (B, n_mels, T), gate logits (B, T), alignments (B, T, L))``. Stops after the step at
        which every item's ``sigmoid(gate)`` exceeded :attr:`gate_threshold`, or at :attr:`max_decoder_steps` frames
        with a ``UserWarning``; items that stopped early run on (trim each at its first gate crossing)."""
        bar = tqdm(total=self.max_decoder_steps, desc="decoding mel frames", unit="frame", disable=not progress,
                   leave=False)
        processed_memory = self.attention.process_memory(memory)
        state = self._initial_state(memory)
        frame = memory.new_zeros(memory.size(0), self.n_mels)
        stopped = torch.zeros(memory.size(0), dtype=torch.bool, device=memory.device)
        frames, gates, alignments = [], [], []
        while True:
            frame, gate, state = self._step(self.prenet(frame), state, memory, processed_memory, None)
            frames.append(frame)
            gates.append(gate)
            alignments.append(state["weights"])
            bar.update(1)
            stopped |= torch.sigmoid(gate.float()) > self.gate_threshold
            if bool(stopped.all()):
                break
            if len(frames) >= self.max_decoder_steps:
                warnings.warn(f"Tacotron2 decoder reached max_decoder_steps={self.max_decoder_steps} before the "
                              "stop gate fired; the output is cut there")
                break
        bar.close()
        return torch.stack(frames, dim=2), torch.stack(gates, dim=1), torch.stack(alignments, dim=1)
