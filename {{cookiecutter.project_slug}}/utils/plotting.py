"""What rank 0's validation gives TensorBoard besides a model's own figures (in its package): audio clips, once-only
media, and a fixed random state for sampling."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Iterator, Union

import numpy as np
import torch

ArrayLike = Union[torch.Tensor, np.ndarray]
_WRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # writer -> tags that first_time has seen


def to_numpy(x: ArrayLike, ndim: int, what: str) -> np.ndarray:
    """``x`` (a tensor on any device, or an array) as a float32 array of ``ndim`` dimensions; a ValueError (naming
    ``what``) for another number."""
    x = np.asarray(x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
    if x.ndim != ndim:
        raise ValueError(f"{what} must be {ndim}-D, got shape {x.shape}")
    return x


def add_audio(writer: Any, tag: str, audio: ArrayLike, step: int, sampling_rate: int) -> bool:
    """Add a mono clip ``(samples,)`` (a tensor on any device or an array, clipped to [-1, 1]) at ``sampling_rate`` Hz
    to a ``SummaryWriter``: ``True``; ``False`` with a warning when it holds NaN or inf (a diverged model's output).
    Raises ValueError where ``audio`` is not 1-D or is empty."""
    clip = to_numpy(audio, 1, f"audio '{tag}'")
    if clip.size == 0:
        raise ValueError(f"audio '{tag}' is empty")
    if not np.isfinite(clip).all():
        warnings.warn(f"step {step}: audio '{tag}' holds NaN or infinite values; not added to TensorBoard")
        return False
    writer.add_audio(tag, torch.from_numpy(np.clip(clip, -1.0, 1.0)).unsqueeze(0), step, sample_rate=sampling_rate)
    return True


def first_time(writer: Any, tag: str) -> bool:
    """``True`` the first time it is asked about ``tag`` for this ``writer`` (this process), ``False`` after: media
    that never change in a run (the ground-truth audio) are written once (once more by a resumed run's new writer)."""
    seen = _WRITTEN.setdefault(writer, set())
    first = tag not in seen
    seen.add(tag)
    return first


@contextlib.contextmanager
def fixed_random_state(device: torch.device, seed: int = 0) -> Iterator[None]:
    """Run the block with the CPU's random generator, and a CUDA ``device``'s, seeded with ``seed``; restore them after.
    A validation clip's sampling (a vocoder's noise, a pre-net's dropout) then draws the same numbers every time,
    so clips differ only by what the model learned, and the training's own random stream is left as it was."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    index = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        torch.random.default_generator.manual_seed(seed)
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield
