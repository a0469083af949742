"""Tacotron2's ONNX export and the free-running loop over its files, split as NVIDIA deploys it (DeepLearningExamples'
Tacotron2/tensorrt): the encoder once per text, the decoder step once per mel frame (:func:`run_onnx`), the post-net
once on the whole mel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.tacotron2.network import Tacotron2
from modules.tacotron2 import Decoder, Postnet, get_padding_mask
from utils.config import Config
from utils.onnx_export import Export, ExportPart

# The decoder step's recurrent inputs, in order; its outputs carry the same names with next_ in front.
DECODER_STATE = ("attention_hidden", "attention_cell", "decoder_hidden", "decoder_cell", "attention_weights",
                 "attention_weights_cum", "attention_context")

_STATE_KEYS = {"attention_weights": "weights", "attention_weights_cum": "weights_cum", "attention_context": "context"}


class EncoderExport(nn.Module):
    """Embedding, encoder and the attention's memory projection: ``text`` ``(B, L)`` int64 symbol ids and
    ``text_lengths`` ``(B,)`` int64 -> ``memory`` ``(B, L, encoder_dim)``, ``processed_memory`` ``(B, L,
    attention_dim)``, ``mask`` ``(B, L)`` bool (``True`` at padded positions).

    Without ``pack_padded_sequence``, which does not export: the BiLSTM runs as two one-way LSTMs sharing its weights,
    the backward one on each text reversed within its length by a gather.
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

    Inputs: ``previous_frame`` ``(B, n_mels)``, ``prenet_noise`` ``(2, B, prenet_dim)`` uniform in [0, 1) (the pre-net
    dropout's draw: a unit is kept where its noise is >= p, so the file is deterministic), the :data:`DECODER_STATE`
    (``(B, attention_rnn_dim)`` x2, ``(B, decoder_rnn_dim)`` x2, attention weights and their running sum ``(B, L)``,
    context ``(B, encoder_dim)``; zeros at the first step), then the encoder's ``memory``, ``processed_memory`` and
    ``mask``. Outputs: ``frame`` ``(B, n_mels)``, ``gate`` ``(B,)`` (stop logit) and the ``next_`` state.
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
    """The post-net residual: ``mel`` ``(B, n_mels, T)`` (the decoder's frames) -> ``mel_postnet`` (the same shape)."""

    def __init__(self, postnet: Postnet):
        super().__init__()
        self.postnet = postnet

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return mel + self.postnet(mel)


def export_parts(model: Tacotron2, cfg: Config) -> list[ExportPart]:
    """``ModelSpec.export_parts``: ``encoder``, ``decoder_step`` and ``postnet``, batch, text length and mel frames
    dynamic, each checked on one unpadded item and on a padded batch of two."""
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

    text_axes = {name: {0: "batch", 1: "text"} for name in ("memory", "processed_memory", "mask")}
    step_axes = {name: {0: "batch"} for name in ("previous_frame", "frame", "gate")}
    for name in DECODER_STATE:
        step_axes[name] = step_axes[f"next_{name}"] = {0: "batch", 1: "text"} if "weights" in name else {0: "batch"}
    step_axes.update(text_axes, prenet_noise={1: "batch"})
    return [
        ExportPart(name="encoder", module=EncoderExport(model), inputs=text([13]), other_inputs=text([9, 5]),
                   input_names=("text", "text_lengths"), output_names=("memory", "processed_memory", "mask"),
                   dynamic_axes={"text": {0: "batch", 1: "text"}, "text_lengths": {0: "batch"}, **text_axes},
                   reference=encoder_reference,
                   description="text (B, L) int64, text_lengths (B,) -> memory, processed_memory (B, L, *), mask"),
        ExportPart(name="decoder_step", module=DecoderStepExport(decoder), inputs=step([12]), other_inputs=step([7, 4]),
                   input_names=("previous_frame", "prenet_noise", *DECODER_STATE, "memory", "processed_memory", "mask"),
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
    """Synthesize with the exported files in ``folder`` and ONNX Runtime on the CPU, as :meth:`Tacotron2.inference` does
    (NVIDIA's ``tensorrt/inference_trt.py`` runs the same loop): ``text`` ``(B, L)`` int64 symbol ids (zeros past each
    length), ``text_lengths`` ``(B,)`` int64 -> ``(mel_postnet (B, n_mels, T), gate logits (B, T))``. Stops as
    ``Decoder.inference`` (``max_steps``, ``gate_threshold``: defaults ``cfg.tacotron2``'s); ``generator`` draws the
    pre-net's dropout noise. Raises ImportError: onnxruntime is not installed."""
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
    mel_postnet = postnet.run(None, {"mel": torch.stack(frames, dim=2).numpy()})[0]
    return torch.from_numpy(mel_postnet), torch.stack(gates, dim=1)


EXPORT = Export(parts=export_parts)
"""Tacotron2's ONNX files, as ``parts.py`` registers them for ``scripts/export.py --format onnx``."""
