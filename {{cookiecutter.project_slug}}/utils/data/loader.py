"""From dataset to device: the DataLoader of a rank's shard, the endless stream of batches that keeps the loop's
position in the epoch, and a step's micro-batches on the device."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader

from distributed import DistInfo
from model import ModelSpec
from utils.config import Config, ConfigError
from utils.data.samplers import LengthBucketSampler, ResumableDistributedSampler
from utils.run import ignore_stop_signals, stop_signals_blocked
from utils.train_state import TrainState


def to_device(batch: dict, device: torch.device, prepare: Optional[Callable[[dict], dict]] = None) -> dict:
    """Move a batch dict's tensors to ``device`` (non-blocking from pinned memory), then apply ``prepare`` if given."""
    batch = {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
    return batch if prepare is None else prepare(batch)


def on_device_hook(spec: ModelSpec, cfg: Config) -> Optional[Callable[[dict], dict]]:
    """The model's ``ModelSpec.on_device`` bound to ``cfg`` (``batch -> batch``), or None when it has none."""
    return (lambda batch: spec.training.on_device(batch, cfg)) if spec.training.on_device is not None else None


def make_loader(dataset, spec: ModelSpec, cfg: Config, dist: DistInfo, train: bool) -> DataLoader:
    """A DataLoader over rank ``dist.rank``'s shard (length buckets or a resumable random order) in batches of the
    model section's ``batch_size``, with ``data``'s workers and pinned memory on CUDA. ``train``: shuffled, the last
    incomplete batch dropped, ``data.batching`` applied; else in corpus order. Raises ConfigError for
    ``data.batching=buckets`` with a training dataset that has no ``lengths()`` method."""
    batch_size, rank, world_size = cfg.section(spec.name).batch_size, dist.rank, dist.world_size
    if train and cfg.data.batching == "buckets":
        if not callable(getattr(dataset, "lengths", None)):
            raise ConfigError(f"data.batching=buckets: the training dataset ({type(dataset).__name__}) has no "
                              "lengths() method giving each item's length; add one or use data.batching=random")
        batching = dict(batch_sampler=LengthBucketSampler(dataset.lengths(), batch_size, world_size, rank,
                                                          cfg.train.seed, cfg.data.bucket_pool))
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


def epoch_order(loader: DataLoader) -> tuple[Any, int]:
    """The loader's sampler (``set_epoch(epoch, start=k)``) and global batch (samples one step of all ranks reads)."""
    if isinstance(loader.batch_sampler, LengthBucketSampler):
        return loader.batch_sampler, loader.batch_sampler.batch_size * loader.batch_sampler.num_replicas
    return loader.sampler, loader.batch_size * loader.sampler.num_replicas


def batch_stream(loader: DataLoader, state: TrainState):
    """Endless batches; each epoch reshuffles the shards (``set_epoch``), a resumed one skips what was read. Keeps
    ``state.epoch``, ``batch_in_epoch`` and ``samples_in_epoch`` (global) up to date for the checkpoints."""
    sampler, global_batch = epoch_order(loader)
    while True:
        sampler.set_epoch(state.epoch, start=state.samples_in_epoch)
        if hasattr(loader.dataset, "set_epoch"):
            loader.dataset.set_epoch(state.epoch)
        with stop_signals_blocked():
            epoch_batches = iter(loader)  # starts the workers
        for batch in epoch_batches:
            state.batch_in_epoch += 1
            state.samples_in_epoch += global_batch
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
    """Epochs read to the end: the current one counts once fewer samples than one global batch are left of it."""
    return state.epoch + (len(loader.dataset) - state.samples_in_epoch < epoch_order(loader)[1])
