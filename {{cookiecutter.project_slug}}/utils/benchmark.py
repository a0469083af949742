"""What the tools that time a train step or plan its memory need of a model: synthetic batches of set shapes
(:class:`Benchmark`, ``models/<name>/benchmark.py``'s ``BENCHMARK``, registered in ``parts.py``) and the shapes to time
(:class:`BenchmarkCase`)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class BenchmarkCase:
    """A train-step shape: ``section.key=value`` overrides, batch size, synthetic_batch keywords; ``tiny``: a CPU's."""

    name: str
    overrides: tuple[str, ...]
    batch_size: int
    batch_kwargs: dict = dataclasses.field(default_factory=dict)
    tiny: Optional["BenchmarkCase"] = None


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """Synthetic batches of set shapes, for the tools that time a train step or plan its memory and for the tests."""

    synthetic_batch: Callable[..., dict]  # (cfg, batch_size, generator, **shape) -> a batch of random CPU tensors
    cases: tuple[BenchmarkCase, ...] = ()  # the shapes to time (NVIDIA's published ones for the examples)
