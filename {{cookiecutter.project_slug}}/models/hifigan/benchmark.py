"""HiFi-GAN's benchmark shapes and random batches (the benchmarks part: ``python -m scripts.benchmark``)."""

from __future__ import annotations

from typing import Optional

import torch

from model import Batch
from models.hifigan.network import TINY_OVERRIDES
from utils.benchmark import Benchmark, BenchmarkCase
from utils.config import Config

_TINY = tuple(f"hifigan.{key}={value}".replace(" ", "") for key, value in TINY_OVERRIDES.items()
              if key not in ("segment_length", "batch_size"))
CASES = (  # the V1 training shape (batch 16 of 8192-sample crops)
    BenchmarkCase("hifigan_v1_b16_s8192", ("hifigan.segment_length=8192",), 16, {"segment_length": 8192},
                  tiny=BenchmarkCase("", _TINY + ("hifigan.segment_length=2048",), 2, {"segment_length": 2048})),
)


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random HiFi-GAN batch of ``batch_size`` items of the training shapes: ``{"mel": (B, n_mels, segment //
    hop_length) standard normal, "audio": (B, segment) normal with standard deviation 0.1, "ids": [str] * B}``, float32
    on the CPU, ``segment`` the ``segment_length`` samples (default ``hifigan.segment_length``).

    Raises:
        ValueError: ``batch_size < 1`` or a segment that is not a positive multiple of ``audio.hop_length``.
    """
    segment = cfg.hifigan.segment_length if segment_length is None else segment_length
    if batch_size < 1:
        raise ValueError(f"hifigan synthetic_batch: batch_size must be >= 1, got {batch_size}")
    if segment < 1 or segment % cfg.audio.hop_length:
        raise ValueError(f"hifigan synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"audio.hop_length={cfg.audio.hop_length}")
    mel = torch.randn(batch_size, cfg.audio.n_mels, segment // cfg.audio.hop_length, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}


BENCHMARK = Benchmark(synthetic_batch=synthetic_batch, cases=CASES)
"""HiFi-GAN's synthetic batches and shapes, as ``parts.py`` registers them for the benchmark and memory tools."""
