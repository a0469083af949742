"""Validation during training: the mean validation loss over every rank's shard, and rank 0's pictures and audio
(``Training.log_validation``), with the EMA weights when the run keeps them (the weights inference uses)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch.utils.data import DataLoader

from distributed import DistInfo, reduce_tensor, split_over_ranks, unwrap_model
from model import ModelSpec, Vocoder
from utils.config import Config
from utils.data.loader import to_device
from utils.errors import TrainingError
from utils.run import stop_signals_blocked
from utils.training.criterion import loss_and_terms
from utils.training.ema import EMA


class Validation(NamedTuple):
    """What a validation measured, each a mean over every batch of every rank's shard."""

    loss: float
    terms: dict[str, float]  # the criterion's named terms (:func:`utils.training.criterion.loss_and_terms`), if any


@dataclasses.dataclass(kw_only=True)
class Validator:
    """The run's validation, built once with what it needs (the loop calls ``validator.validate(step)``). ``model``: a
    one-loss model's DDP-wrapped network, or the whole model of several phases; ``criterion``: the training loss;
    ``loader``: this rank's shard of the validation set; ``prepare``: the model's ``on_device`` hook or None;
    ``writer``: rank 0's TensorBoard writer (None elsewhere); ``ema``: validated in place of the weights if kept;
    ``gather``: a model split over the ranks, whole on rank 0 for its pictures (``Sharding.gathered_model``);
    ``vocoder``: rank 0's of the model's validation audio (``Training.val_vocoder``), passed to its hook where set."""

    model: torch.nn.Module
    criterion: Callable
    loader: DataLoader
    spec: ModelSpec
    cfg: Config
    dist: DistInfo
    autocast: Callable  # train.precision's autocast context factory
    prepare: Optional[Callable[[dict], dict]]
    writer: Any
    output_dir: Path
    ema: Optional[EMA] = None
    gather: Optional[Callable[..., Optional[torch.nn.Module]]] = None
    vocoder: Optional[Vocoder] = None

    def validate(self, step: int) -> Validation:
        """The mean batch loss and terms at ``step`` over all ranks' shards (all ranks call it); rank 0 draws the first
        batch's pictures and audio (``Training.log_validation``). The model ends in train mode, with its own weights;
        what it draws (noise, a dropout kept in eval mode) is a fork of the random streams, which training continues
        as they were. Raises TrainingError: the criterion returned neither a loss nor ``(loss, terms)``."""
        with torch.random.fork_rng(devices=[self.dist.device] if self.dist.device.type == "cuda" else []), \
                self.ema.applied() if self.ema is not None else contextlib.nullcontext():  # the weights inference uses
            return self._mean_loss(step)

    @torch.no_grad()
    def _mean_loss(self, step: int) -> Validation:
        model, device, spec, is_main = self.model, self.dist.device, self.spec, self.dist.is_main
        model.eval()
        total, names = torch.zeros(2, device=device, dtype=torch.float64), []  # (sum of losses, batches, term sums...)
        with stop_signals_blocked():
            batches = iter(self.loader)  # starts the workers
        for i, batch in enumerate(batches):
            batch = to_device(batch, device, self.prepare)
            with self.autocast():
                outputs = model(batch)
                loss, terms = loss_and_terms(self.criterion(outputs, batch))
            if i == 0:
                names = list(terms)
                total = torch.cat([total, torch.zeros(len(names), device=device, dtype=torch.float64)])
            elif list(terms) != names:  # every rank sums them in the first batch's order
                raise TrainingError(f"the model's criterion returned the terms {list(terms)} after {names}: it returns "
                                    "the same names in the same order on every call")
            total += torch.stack([loss.detach().double(), torch.ones((), device=device, dtype=torch.float64),
                                  *(terms[name].detach().double() for name in names)])
            if i == 0 and spec.training.log_validation is not None:
                plain = unwrap_model(model)
                if split_over_ranks(plain):  # rank 0 gets a copy from the gathered weights (every rank calls)
                    plain = self.gather(plain, spec, self.cfg, device, is_main)
                if is_main:
                    vocoder = {"vocoder": self.vocoder} if self.vocoder is not None else {}
                    spec.training.log_validation(plain, batch, outputs, step, self.writer, self.output_dir, cfg=self.cfg,
                                                 **vocoder)
        total = reduce_tensor(total, op="sum")
        model.train()
        means = (total[[0, *range(2, len(total))]] / total[1].clamp(min=1)).tolist()
        return Validation(means[0], dict(zip(names, means[1:])))
