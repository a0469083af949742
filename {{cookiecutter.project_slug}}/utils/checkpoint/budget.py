"""A model built from a checkpoint's recorded config, which is data as much as the weights are: a crafted one can ask
for a 240 GB layer, or 10^9 small ones. :func:`build_recorded` counts the tensors the build creates, each sized on the
meta device before it is allocated, and stops at the bytes the checkpoint justifies."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from utils.checkpoint.files import CheckpointError

UNSAVED_BYTES = 64 << 20
"""What a model may build beyond its checkpoint's bytes: buffers no checkpoint holds, its initialisation's
temporaries."""
RELEASE_BYTES = 512 << 20
"""And beyond a release file's: the modules outside ``Inference.modules``, built afresh (a GAN's discriminators: 283 MB
in jik876's V1)."""
TENSOR_MIN_BYTES = 16 << 10
"""What each tensor counts at the least (its module's Python objects and their time): a config multiplying
small layers stops as soon as one widening them."""

CONSTRUCTORS = frozenset({
    torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
    torch.randperm, torch.arange, torch.linspace, torch.logspace, torch.eye, torch.tril_indices, torch.triu_indices,
    torch.hann_window, torch.hamming_window, torch.blackman_window, torch.bartlett_window, torch.kaiser_window,
    torch.Tensor.new_empty, torch.Tensor.new_empty_strided, torch.Tensor.new_zeros, torch.Tensor.new_ones,
    torch.Tensor.new_full})
"""The functions that make a tensor of a size given as numbers (a ``*_like`` one is sized by a tensor made before)."""


def bytes_on_disk(path: str | Path) -> int:
    """Bytes of a checkpoint file, or of every file in a checkpoint folder."""
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build_recorded(build: Callable[[], torch.nn.Module], checkpoint: str | Path, release: bool = False
                   ) -> torch.nn.Module:
    """``build()``, its tensors (each at least :data:`TENSOR_MIN_BYTES`) within :func:`bytes_on_disk` of
    ``checkpoint`` and :data:`UNSAVED_BYTES` (and :data:`RELEASE_BYTES` for a ``release`` file). Raises
    :class:`CheckpointError` at the first tensor past that, before it is allocated."""
    on_disk, extra = bytes_on_disk(checkpoint), UNSAVED_BYTES + RELEASE_BYTES * release
    try:
        with _Budget(on_disk + extra):
            return build()
    except _OverBudget as over:
        unsaved = "buffers no checkpoint holds" + (" and a release file's training-only modules" if release else "")
        raise CheckpointError(f"{checkpoint}: its recorded config builds a larger model than the checkpoint justifies: "
                              f"past {_mib(on_disk + extra)} of tensors ({_mib(on_disk)} on disk, {_mib(extra)} for "
                              f"{unsaved}) at a {over.dtype} tensor of shape {over.shape}, which was not allocated"
                              ) from None


class _OverBudget(Exception):
    """Raised inside the build by :class:`_Budget`: no ValueError, which a model's code may catch and reword."""

    def __init__(self, planned: torch.Tensor):
        super().__init__()
        self.shape, self.dtype = tuple(planned.shape), str(planned.dtype).replace("torch.", "")


class _Budget(TorchFunctionMode):
    """While active: each call of :data:`CONSTRUCTORS` is made on the meta device first (no memory) and counted, and
    the call that would pass ``limit`` bytes raises :class:`_OverBudget` instead of running."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.used = limit, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CONSTRUCTORS:
            return func(*args, **kwargs)
        probe = {key: value for key, value in kwargs.items() if key not in ("device", "out", "pin_memory", "generator")}
        try:
            planned = func(*args, **probe, device="meta")
        except (RuntimeError, TypeError, ValueError):  # refused there: the call itself says why, or is counted made
            planned = None
        if planned is not None:
            self._count(planned)
        made = func(*args, **kwargs)
        if planned is None and isinstance(made, torch.Tensor):
            self._count(made)
        return made

    def _count(self, tensor: torch.Tensor) -> None:
        self.used += max(tensor.numel() * tensor.element_size(), TENSOR_MIN_BYTES)
        if self.used > self.limit:
            raise _OverBudget(tensor)


def _mib(nbytes: int) -> str:
    """``nbytes`` in MiB, for a message."""
    return f"{nbytes / 2**20:.0f} MiB"
