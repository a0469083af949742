"""An exponential moving average (EMA) of the weights inference uses (``train.ema_decay``), ``ema = decay * ema + (1 -
decay) * weights`` after every real update: Polyak averaging as BigVGAN and Vocos keep it. Unlike
``torch.optim.swa_utils.AveragedModel`` (a copy of whole modules) each average is a tensor like its parameter (split
over the ranks: a ``DTensor`` shard, saved and re-cut as the weights are)."""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn

from utils.checkpoint.state import in_modules


def averaged_parameters(model: nn.Module, modules: Sequence[str]) -> dict[str, nn.Parameter]:
    """``{name: parameter}`` of what an :class:`EMA` averages (training and inference alike): the floating-point
    parameters of ``model`` under the sub-modules ``modules`` (all when empty)."""
    return {name: param for name, param in model.named_parameters()
            if in_modules(name, modules) and param.is_floating_point()}


class EMA:
    """The moving averages of ``model``'s parameters under ``modules`` (empty: all). ``model``: plain or split over the
    ranks, never DDP-wrapped (the key names are the model's own); ``decay``: the old average's weight at each update. A
    ``ValueError`` for ``decay`` outside ``[0, 1)``, or ``modules`` naming no parameter of ``model``."""

    def __init__(self, model: nn.Module, modules: Sequence[str], decay: float):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA: decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.params = averaged_parameters(model, modules)
        if not self.params:
            raise ValueError(f"EMA: the model has no floating-point parameter under {', '.join(modules)}")
        with torch.no_grad():
            self.averages = {name: param.detach().clone() for name, param in self.params.items()}
        self._of: dict[int, list[str]] = {}

    def _names_in(self, network: nn.Module) -> list[str]:
        """The averaged parameters that belong to ``network`` (cached per network)."""
        if id(network) not in self._of:
            mine = {id(param) for param in network.parameters()}
            self._of[id(network)] = [name for name, param in self.params.items() if id(param) in mine]
        return self._of[id(network)]

    @torch.no_grad()
    def update(self, network: nn.Module | None = None) -> None:
        """Move the averages towards the weights of ``network`` (the one an optimizer just stepped), or of all."""
        names = list(self.params) if network is None else self._names_in(network)
        for name in names:
            self.averages[name].lerp_(self.params[name].detach(), 1.0 - self.decay)

    @torch.no_grad()
    def reset(self) -> None:
        """Start the averages afresh from the current weights (a resume from a checkpoint that holds none)."""
        for name, param in self.params.items():
            self.averages[name].copy_(param.detach())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{parameter name: average}`` (the names of ``model.state_dict()``)."""
        return dict(self.averages)

    @torch.no_grad()
    def load_state_dict(self, averages: dict[str, torch.Tensor]) -> None:
        """Put saved averages back (copied into this run's tensors, shards included); a ``ValueError`` names saved
        names or shapes that are not this model's averaged parameters."""
        missing, unexpected = sorted(set(self.averages) - set(averages)), sorted(set(averages) - set(self.averages))
        if missing or unexpected:
            raise ValueError(f"EMA weights of other parameters (missing: {', '.join(missing[:3]) or '-'}; unexpected: "
                             f"{', '.join(unexpected[:3]) or '-'})")
        for name, average in averages.items():
            if average.shape != self.averages[name].shape:
                raise ValueError(f"EMA weight {name} has shape {tuple(average.shape)}, the model's "
                                 f"{tuple(self.averages[name].shape)}")
            self.averages[name].copy_(average)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The averages in the model's parameters within the block; the raw weights back after it (also on an error)."""
        with torch.no_grad():
            raw = {name: param.detach().clone() for name, param in self.params.items()}
            for name, param in self.params.items():
                param.copy_(self.averages[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in self.params.items():
                    param.copy_(raw[name])
