"""WaveGlow's benchmark shapes and random batches (the benchmarks part: ``python -m scripts.benchmark``)."""

from __future__ import annotations

from typing import Optional

import torch

from model import Batch
from utils.benchmark import Benchmark, BenchmarkCase
from utils.config import Config

_TINY = ("waveglow.n_flows=4", "waveglow.n_early_every=2", "waveglow.wn_layers=2")
CASES = (  # NVIDIA's published shapes (those of its reference benchmark harness)
    BenchmarkCase("waveglow256_b12_s16000", ("waveglow.wn_channels=256", "waveglow.segment_length=16000"), 12,
                  {"segment_length": 16000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=16", "waveglow.segment_length=2048"), 2,
                                     {"segment_length": 2048})),
    BenchmarkCase("waveglow512_b10_s8000", ("waveglow.wn_channels=512", "waveglow.segment_length=8000"), 10,
                  {"segment_length": 8000},
                  tiny=BenchmarkCase("", _TINY + ("waveglow.wn_channels=32", "waveglow.segment_length=1024"), 2,
                                     {"segment_length": 1024})),
)


def synthetic_batch(cfg: Config, batch_size: int, generator: torch.Generator,
                    segment_length: Optional[int] = None) -> Batch:
    """Random WaveGlow batch with the shapes of NVIDIA's reference benchmark harness, float32 on the CPU: ``{"mel": (B,
    n_mels, segment // hop_length + 1) standard normal, "audio": (B, segment) normal with standard deviation 0.1, "ids":
    [str] * B}``, ``segment`` = ``segment_length`` (default ``waveglow.segment_length``) samples. Raises ValueError for
    a segment that is not a positive multiple of ``n_group``."""
    segment = cfg.waveglow.segment_length if segment_length is None else segment_length
    if segment < 1 or segment % cfg.waveglow.n_group:
        raise ValueError(f"waveglow synthetic_batch: segment_length {segment} must be a positive multiple of "
                         f"waveglow.n_group={cfg.waveglow.n_group}")
    mel = torch.randn(batch_size, cfg.audio.n_mels, segment // cfg.audio.hop_length + 1, generator=generator)
    audio = torch.randn(batch_size, segment, generator=generator) * 0.1
    return {"mel": mel, "audio": audio, "ids": [f"synthetic_{i}" for i in range(batch_size)]}


BENCHMARK = Benchmark(synthetic_batch=synthetic_batch, cases=CASES)
"""WaveGlow's synthetic batches and shapes, as ``parts.py`` registers them for the benchmark and memory tools."""
