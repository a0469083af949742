"""Tacotron2's benchmark shapes and random batches (the benchmarks part: ``python -m scripts.benchmark``)."""

from __future__ import annotations

import torch

from model import Batch
from modules.tacotron2 import get_padding_mask
from utils.benchmark import Benchmark, BenchmarkCase
from utils.config import Config

_FULL = {"text_lengths": (60, 160), "mel_lengths": (300, 800), "longest_mel": 800}
_TINY = {"text_lengths": (6, 16), "mel_lengths": (20, 40), "longest_mel": 40}
CASES = (  # NVIDIA's published shapes (those of its reference benchmark harness)
    BenchmarkCase("tacotron2_b128", (), 128, _FULL, tiny=BenchmarkCase("", (), 4, _TINY)),
    BenchmarkCase("tacotron2_b64", (), 64, _FULL, tiny=BenchmarkCase("", (), 2, _TINY)),
)


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    text_lengths: tuple[int, int] = (60, 160), mel_lengths: tuple[int, int] = (300, 800),
                    longest_mel: int = 800) -> Batch:
    """Random padded Tacotron2 batch, laid out as :class:`TextMelCollate` lays it out, on the CPU. Lengths are drawn as
    NVIDIA's reference benchmark harness draws them (the same calls, so the same lengths for the same seed): text
    lengths uniform in ``[text_lengths[0], text_lengths[1])`` sorted descending, mel lengths uniform in
    ``[mel_lengths[0], mel_lengths[1])`` with the first set to ``longest_mel``. Symbols are uniform in ``[1,
    n_symbols)``, mels standard normal; padding is zero, the gate target 1 from each last frame on.
    """
    text_lens = torch.randint(text_lengths[0], text_lengths[1], (batch_size,), generator=generator)
    text_lens = text_lens.sort(descending=True).values
    mel_lens = torch.randint(mel_lengths[0], mel_lengths[1], (batch_size,), generator=generator)
    mel_lens[0] = longest_mel
    max_text, max_frames = int(text_lens.max()), int(mel_lens.max())
    text = torch.randint(1, cfg.tacotron2.n_symbols, (batch_size, max_text), generator=generator)
    mel = torch.randn(batch_size, cfg.audio.n_mels, max_frames, generator=generator)
    text = text.masked_fill(get_padding_mask(text_lens, max_text), 0)
    mel = mel.masked_fill(get_padding_mask(mel_lens, max_frames).unsqueeze(1), 0.0)
    gate = (torch.arange(max_frames).unsqueeze(0) >= (mel_lens - 1).unsqueeze(1)).float()
    return {"text": text, "text_lengths": text_lens, "mel": mel, "gate": gate, "mel_lengths": mel_lens,
            "ids": [f"synthetic_{i}" for i in range(batch_size)]}


BENCHMARK = Benchmark(synthetic_batch=synthetic_batch, cases=CASES)
"""Tacotron2's synthetic batches and shapes, as ``parts.py`` registers them for the benchmark and memory tools."""
