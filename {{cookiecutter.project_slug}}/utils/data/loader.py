"""From dataset to device: how training batches are made (the ``data`` section's batching keys), the DataLoader of a
rank's shard, the endless stream of batches that keeps the loop's position in the epoch, and a step's micro-batches on
the device."""

from __future__ import annotations

import itertools
import math
import time
import zlib
from typing import Any, Callable, Iterable, Literal, Optional, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import Field, model_validator
from torch.utils.data import DataLoader

from distributed import DistInfo, all_gather_object
from model import ModelSpec
from utils.config import Config, ConfigError, Section, cross_check_error
from utils.data.corpus import DataError
from utils.data.samplers import (FrameBudgetSampler, LengthBucketSampler, ResumableDistributedSampler, padding_fraction,
                                 random_batches)
from utils.run import ignore_stop_signals, stop_signals_blocked
from utils.train_state import TrainState


class BatchingConfig(Section):
    """The ``data`` section's keys of how training batches are made (:func:`make_loader`)."""

    # random: batch_size utterances; buckets: of similar lengths (LengthBucketSampler); frames: a budget of padded mel
    # frames, not a count (FrameBudgetSampler); None: the recipe's
    batching: Optional[Literal["random", "buckets", "frames"]] = None
    bucket_pool: int = Field(64, ge=1)  # batches sorted by length together (buckets, frames)
    max_frames: Optional[int] = Field(None, ge=0)  # frames: padded mel frames a GPU a micro-batch; None: the recipe's
    max_items: int = Field(0, ge=0)  # frames: utterances per micro-batch at most (0: no limit)
    quadratic_frames: int = Field(0, ge=0)  # frames: an item of L frames costs L + L**2 / this (0: L)

    @model_validator(mode="after")
    def budget_given(self) -> "BatchingConfig":
        """``batching=frames`` has a ``max_frames``."""
        if self.batching == "frames" and not self.max_frames:
            raise cross_check_error("config key 'data.max_frames' must be > 0 with data.batching=frames: the padded "
                                    "mel frames a GPU takes per micro-batch (the manual's \"Frame budgets\" says how "
                                    "to choose them)", "batching", "max_frames")
        return self


@runtime_checkable
class OwnOrder(Protocol):
    """A loader's sampler that plans its own batches (a part's), which the batch stream
    keeps the position of as it keeps the core's: ``set_epoch(epoch, start=k)`` leaves out the epoch's first ``k``
    samples, ``step_samples`` of them read by all ranks at each micro-batch."""

    step_samples: int  # samples of a micro-batch of every rank, in the unit of set_epoch's start

    def set_epoch(self, epoch: int, start: int = 0) -> None: ...

    def epoch_read(self, samples: int) -> bool:
        """Whether the epoch is read to its end once ``samples`` of it are."""

    def batch_line(self, micro_batches: int) -> str:
        """What ``micro_batches`` of every rank hold together, for the run's first line: ``up to 8 s of audio``."""

    def resume_note(self, samples: int, written_by: int) -> Optional[str]:
        """The line a resume ``samples`` into the epoch from a checkpoint of ``written_by`` processes says, or None;
        ConfigError where it cannot go on."""


def to_device(batch: dict, device: torch.device, prepare: Optional[Callable[[dict], dict]] = None) -> dict:
    """Move a batch dict's tensors to ``device`` (non-blocking from pinned memory), then apply ``prepare`` if given."""
    batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    return batch if prepare is None else prepare(batch)


def on_device_hook(spec: ModelSpec, cfg: Config) -> Optional[Callable[[dict], dict]]:
    """The model's ``ModelSpec.on_device`` bound to ``cfg`` (``batch -> batch``), or None when it has none."""
    return (lambda batch: spec.training.on_device(batch, cfg)) if spec.training.on_device is not None else None


def make_loader(dataset, spec: ModelSpec, cfg: Config, dist: DistInfo, train: bool) -> DataLoader:
    """A DataLoader over rank ``dist.rank``'s shard (a resumable random order, length buckets or frame budgets) in
    batches of the model section's ``batch_size`` (or within ``data.max_frames``), with ``data``'s workers and pinned
    memory on CUDA. ``train``: shuffled, the last incomplete batch dropped, ``data.batching`` applied; else in corpus
    order. Raises ConfigError for ``data.batching=buckets`` or ``frames`` with a training dataset that has no
    ``lengths()`` method; what :func:`frame_budgets` raises."""
    batch_size, rank, world_size = cfg.section(spec.name).batch_size, dist.rank, dist.world_size
    if train and cfg.data.batching != "random" and not callable(getattr(dataset, "lengths", None)):
        raise ConfigError(f"data.batching={cfg.data.batching}: the training dataset ({type(dataset).__name__}) has no "
                          "lengths() method giving each item's length; add one or use data.batching=random")
    if train and cfg.data.batching == "buckets":
        batching = dict(batch_sampler=LengthBucketSampler(dataset.lengths(), batch_size, world_size, rank,
                                                          cfg.train.seed, cfg.data.bucket_pool))
    elif train and cfg.data.batching == "frames":
        batching = dict(batch_sampler=frame_budgets(dataset.lengths(), cfg.data, cfg.train.seed, dist))
    else:
        batching = dict(batch_size=batch_size, drop_last=train, sampler=ResumableDistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=train, seed=cfg.train.seed, drop_last=train))
    workers = cfg.data.num_workers
    # Its own generator: starting workers must not draw from the global RNG dropout uses (a resume would change masks)
    return DataLoader(dataset, **batching, num_workers=workers, collate_fn=spec.training.collate_fn,
                      pin_memory=dist.device.type == "cuda", prefetch_factor=cfg.data.prefetch_factor if workers else None,
                      generator=torch.Generator().manual_seed(cfg.train.seed + rank),
                      worker_init_fn=ignore_stop_signals if workers else None,
                      persistent_workers=bool(workers) and cfg.data.persistent_workers)


def frame_budgets(lengths: Iterable[int], data: BatchingConfig, seed: int, dist: DistInfo) -> FrameBudgetSampler:
    """The :class:`FrameBudgetSampler` of this rank over the training items' ``lengths`` (mel frames) with the ``data``
    section's budget, once every rank holds the same lengths (all ranks call this together). Raises DataError: the
    ranks' lengths differ (so would their plans, and a rank with fewer batches would leave the others waiting at the
    epoch's end), or one is < 1; ConfigError: an utterance costs more than ``data.max_frames``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ranks = all_gather_object((len(lengths), zlib.crc32(lengths.tobytes())))
    if len(set(ranks)) > 1:
        shown = "; ".join(f"rank {rank}: {count} (checksum {crc:08x})" for rank, (count, crc) in enumerate(ranks))
        raise DataError(f"data.batching=frames: the ranks read different training utterance lengths ({shown}); each "
                        "rank must read the same corpus")
    longest = int(lengths.max(initial=0))
    cost = longest + (longest ** 2 / data.quadratic_frames if data.quadratic_frames else 0)
    if cost > data.max_frames:
        quadratic = f", {cost:.0f} with data.quadratic_frames={data.quadratic_frames}" if data.quadratic_frames else ""
        raise ConfigError(f"data.max_frames={data.max_frames} is smaller than the longest training utterance "
                          f"({longest} mel frames{quadratic}): raise it to at least {math.ceil(cost)}, or leave the "
                          "longest utterances out")
    try:
        return FrameBudgetSampler(lengths, data.max_frames, dist.world_size, dist.rank, seed, data.bucket_pool,
                                  data.max_items, data.quadratic_frames)
    except ValueError as err:  # a length < 1
        raise DataError(f"data.batching=frames: {err}") from None


def batching_line(loader: DataLoader, batch_size: int, seed: int) -> Optional[str]:
    """What batches by length save, for rank 0 to say at the start: the padded share of the first epoch's batches
    against random batches of ``batch_size``; with frame budgets, also how many batches each rank takes. None for
    random batches."""
    sampler = loader.batch_sampler
    if not isinstance(sampler, (LengthBucketSampler, FrameBudgetSampler)):
        return None
    lengths, batches = sampler.lengths, sampler.epoch_batches()
    padding = (f"{100 * padding_fraction(batches, lengths):.1f}% of a batch is padding, against "
               f"{100 * padding_fraction(random_batches(len(lengths), batch_size, seed), lengths):.1f}% in random "
               f"batches")
    if isinstance(sampler, LengthBucketSampler):
        return f"batches of similar lengths (data.batching=buckets): {padding}"
    return (f"batches of up to {sampler.max_frames} padded mel frames (data.batching=frames): the first epoch's "
            f"{len(lengths)} utterances in {len(batches)} batches ({len(lengths) / len(batches):.1f} on average), "
            f"{len(sampler)} for each of {sampler.num_replicas} process(es); {padding} of {batch_size}")


def replan_note(loader: DataLoader, state: TrainState, written_by: int) -> Optional[str]:
    """The line a resume by another number of processes than the ``written_by`` of its checkpoint says when frame
    budgets plan the epoch it resumes inside: the rest is planned afresh; an :class:`OwnOrder`'s (ConfigError where it
    cannot go on), whose line sets ``state`` to the epoch's start. None otherwise. Every rank calls it."""
    if isinstance(loader.sampler, OwnOrder):  # its line means the epoch starts afresh: the position goes to its start
        note = loader.sampler.resume_note(state.samples_in_epoch, written_by)
        if note is not None:
            state.batch_in_epoch = state.samples_in_epoch = 0
        return note
    sampler = loader.batch_sampler
    if not isinstance(sampler, FrameBudgetSampler) or written_by == sampler.num_replicas or not state.samples_in_epoch:
        return None
    return (f"note: epoch {state.epoch} was planned in frame budgets for {written_by} process(es): the "
            f"{len(sampler.lengths) - state.samples_in_epoch} of its utterances not yet read are planned afresh for "
            f"{sampler.num_replicas}, none read twice")


def epoch_order(loader: DataLoader) -> tuple[Any, int]:
    """The loader's sampler (``set_epoch(epoch, start=k)``) and the fewest samples one step of all ranks reads: a
    global batch; with frame budgets, an utterance a rank; an :class:`OwnOrder`'s ``step_samples``."""
    if isinstance(loader.sampler, OwnOrder):
        return loader.sampler, loader.sampler.step_samples
    if isinstance(loader.batch_sampler, FrameBudgetSampler):
        return loader.batch_sampler, loader.batch_sampler.num_replicas
    if isinstance(loader.batch_sampler, LengthBucketSampler):
        return loader.batch_sampler, loader.batch_sampler.batch_size * loader.batch_sampler.num_replicas
    return loader.sampler, loader.batch_size * loader.sampler.num_replicas


def batch_stream(loader: DataLoader, state: TrainState):
    """Endless batches; each epoch reshuffles the shards (``set_epoch``), a resumed one skips what was read. Keeps
    ``state.epoch``, ``batch_in_epoch`` and ``samples_in_epoch`` (global) up to date for the checkpoints."""
    sampler, global_batch = epoch_order(loader)
    while True:
        sampler.set_epoch(state.epoch, start=state.samples_in_epoch)
        # before the workers start, which draw the pass's batches (and with them the skip)
        steps = sampler.step_items().tolist() if isinstance(sampler, FrameBudgetSampler) else \
            itertools.repeat(global_batch)
        if hasattr(loader.dataset, "set_epoch"):
            loader.dataset.set_epoch(state.epoch)
        with stop_signals_blocked():
            epoch_batches = iter(loader)  # starts the workers
        for batch, samples in zip(epoch_batches, steps):
            state.batch_in_epoch += 1
            state.samples_in_epoch += samples
            yield batch
        state.epoch, state.batch_in_epoch, state.samples_in_epoch = state.epoch + 1, 0, 0


def next_micro_batches(batches, spec: ModelSpec, accum: int, device: torch.device, prepare=None):
    """The step's ``accum`` micro-batches on the device (``prepare``: the model's ``on_device`` hook, from
    :func:`on_device_hook`), with the items and utterance ids they hold and the seconds spent waiting for them."""
    micro, items, ids, t_data = [], 0, [], time.perf_counter()
    for _ in range(accum):
        batch = next(batches)
        items += spec.training.count_items(batch)  # on the CPU batch: no device synchronisation
        micro.append(to_device(batch, device, prepare))
        ids += batch.get("ids", [])
    return micro, items, ids, time.perf_counter() - t_data


def epochs_done(state: TrainState, loader: DataLoader) -> int:
    """Epochs read to the end: the current one counts once fewer samples than one global batch are left of it (as
    an :class:`OwnOrder` says)."""
    if isinstance(loader.sampler, OwnOrder):
        return state.epoch + loader.sampler.epoch_read(state.samples_in_epoch)
    return state.epoch + (len(loader.dataset) - state.samples_in_epoch < epoch_order(loader)[1])
