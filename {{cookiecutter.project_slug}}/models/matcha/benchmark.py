"""Matcha-TTS's benchmark shapes and random batches (the benchmarks part: ``python -m scripts.benchmark``)."""

from __future__ import annotations

import torch

from model import Batch
from models.matcha.network import fix_length
from models.matcha.text import SYMBOLS
from utils.benchmark import Benchmark, BenchmarkCase
from utils.config import Config

# LJSpeech as the authors train it (configs/data/ljspeech.yaml, batch 32): 1 to 10 s clips at 22.05 kHz, hop 256
# (86 to 862 frames), transcripts of 30 to 150 phonemes, a blank between every two (61 to 301 ids)
_FULL = {"text_lengths": (61, 302), "mel_lengths": (86, 862), "longest_mel": 862}
_TINY = {"text_lengths": (6, 16), "mel_lengths": (20, 40), "longest_mel": 40}
CASES = (
    BenchmarkCase("matcha_ljspeech_b32", (), 32, _FULL, tiny=BenchmarkCase("", (), 2, _TINY)),
)


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    text_lengths: tuple[int, int] = (61, 302), mel_lengths: tuple[int, int] = (86, 862),
                    longest_mel: int = 862) -> Batch:
    """Random padded Matcha-TTS batch, laid out as :class:`models.matcha.data.MatchaCollate` lays it out, on the CPU:
    ``{"text": (B, L_max) long, "text_lengths": (B,), "mel": (B, n_mels, T), "mel_lengths": (B,), "ids": [str] * B}``
    and ``"speaker": (B,)`` uniform over ``data.speakers`` where it names more than one. Text lengths are uniform in
    ``[text_lengths[0], text_lengths[1])``, mel lengths (frames) uniform in ``[mel_lengths[0], mel_lengths[1])`` with
    the first set to ``longest_mel``; ``T`` the longest rounded up as the collate rounds it
    (:func:`models.matcha.network.fix_length`). Ids are uniform over the symbol table past the pad, mels standard normal
    (the corpus's normalised log-mels); padding is zero.

    Raises:
        ValueError: ``batch_size < 1``, an empty or reversed length range, ``longest_mel`` below 1, or a mel shorter
            than its text (monotonic alignment gives each token a frame at least).
    """
    low_text, high_text = text_lengths
    low_mel, high_mel = mel_lengths
    if batch_size < 1 or not 1 <= low_text < high_text or not 1 <= low_mel < high_mel or longest_mel < 1:
        raise ValueError(f"matcha synthetic_batch: batch_size {batch_size}, text_lengths {text_lengths}, mel_lengths "
                         f"{mel_lengths} and longest_mel {longest_mel} must be >= 1, each range [low, high) non-empty")
    if min(low_mel, longest_mel) < high_text - 1:
        raise ValueError(f"matcha synthetic_batch: mels of {min(low_mel, longest_mel)} frames are shorter than texts "
                         f"of up to {high_text - 1} ids")
    text_lens = torch.randint(low_text, high_text, (batch_size,), generator=generator)
    mel_lens = torch.randint(low_mel, high_mel, (batch_size,), generator=generator)
    mel_lens[0] = longest_mel
    max_text, max_frames = int(text_lens.max()), int(mel_lens.max())
    text = torch.randint(1, len(SYMBOLS), (batch_size, max_text), generator=generator)
    mel = torch.randn(batch_size, cfg.audio.n_mels, fix_length(max_frames), generator=generator)
    text = text.masked_fill(torch.arange(max_text).unsqueeze(0) >= text_lens.unsqueeze(1), 0)
    mel = mel.masked_fill((torch.arange(mel.size(-1)).unsqueeze(0) >= mel_lens.unsqueeze(1)).unsqueeze(1), 0.0)
    batch = {"text": text, "text_lengths": text_lens, "mel": mel, "mel_lengths": mel_lens,
             "ids": [f"synthetic_{i}" for i in range(batch_size)]}
    if len(cfg.data.speakers) > 1:
        batch["speaker"] = torch.randint(0, len(cfg.data.speakers), (batch_size,), generator=generator)
    return batch


BENCHMARK = Benchmark(synthetic_batch=synthetic_batch, cases=CASES)
"""Matcha-TTS's synthetic batches and shapes, as ``parts.py`` registers them for the benchmark and memory tools."""
