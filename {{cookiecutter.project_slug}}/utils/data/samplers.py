"""Which items each rank reads in which order: a resumable ``DistributedSampler`` and length buckets, with the padding
they save."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """A :class:`~torch.utils.data.DistributedSampler` that can start an epoch part-way, on any number of ranks: after
    ``set_epoch(epoch, start=k)`` the next pass leaves out the epoch's first ``k`` global samples and splits the rest as
    the parent splits an epoch (``drop_last``, else padded from the start); a resume on as many ranks is exact."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Shuffle by ``seed + epoch``; ``start``: global samples of this epoch's order to leave out."""
        super().set_epoch(epoch)
        self.start = start

    def _rest(self) -> list[int]:
        n, generator = len(self.dataset), torch.Generator().manual_seed(self.seed + self.epoch)
        rest = (torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n)).tolist()[self.start:]
        if self.drop_last:
            rest = rest[:len(rest) - len(rest) % self.num_replicas]
        elif rest and len(rest) % self.num_replicas:
            pad = self.num_replicas - len(rest) % self.num_replicas
            rest += (rest * (pad // len(rest) + 1))[:pad]
        return rest[self.rank::self.num_replicas]

    def __iter__(self):
        indices = list(super().__iter__()) if self.start == 0 else self._rest()
        self.start = 0
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples if self.start == 0 else len(self._rest())


class LengthBucketSampler:
    """A distributed batch sampler whose batches hold utterances of similar length (``data.batching=buckets``), so a
    variable-length model computes less padding: VITS' ``DistributedBucketSampler`` and NeMo's semi-sorted batches,
    made resumable. An epoch's order depends on ``seed + epoch`` alone: the indices are shuffled; each run of ``pool``
    (``data.bucket_pool``) micro-batches' worth is sorted by ``lengths`` ``(N,)`` and cut into micro-batches of
    ``batch_size`` (an incomplete one left out); the micro-batches are shuffled. Step ``s`` takes micro-batches ``s *
    num_replicas`` on, rank ``r`` the ``r``-th; those that do not fill a last step are left out too. ``set_epoch(epoch,
    start=k)`` leaves out the first ``k`` global samples: resumed on the same ranks the epoch goes on exactly. Raises
    ValueError for a length < 1, or a ``start`` that is not a multiple of ``batch_size``."""

    def __init__(self, lengths: Sequence[int], batch_size: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, pool: int = 64):
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        if len(self.lengths) and int(self.lengths.min()) < 1:
            raise ValueError(f"LengthBucketSampler: item {int(self.lengths.argmin())} has length "
                             f"{int(self.lengths.min())}; every length must be >= 1")
        self.batch_size, self.num_replicas, self.rank = batch_size, num_replicas, rank
        self.seed, self.pool, self.epoch, self.start = seed, pool, 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Order by ``seed + epoch``; ``start``: global samples of this epoch's order to leave out."""
        if start % self.batch_size:
            raise ValueError(f"LengthBucketSampler: start={start} is not a multiple of batch_size={self.batch_size}")
        self.epoch, self.start = epoch, start

    def epoch_batches(self) -> list[list[int]]:
        """Every full micro-batch of the epoch's order, for all ranks together."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator)
        span, size, batches = self.pool * self.batch_size, self.batch_size, []
        for begin in range(0, len(order), span):
            chunk = order[begin:begin + span]
            # stable: equal lengths keep their shuffled order, so ties do not depend on the sort's algorithm
            chunk = chunk[torch.sort(self.lengths[chunk], stable=True).indices].tolist()
            batches += [chunk[i:i + size] for i in range(0, len(chunk) - size + 1, size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    def _rest(self) -> list[list[int]]:
        rest = self.epoch_batches()[self.start // self.batch_size:]
        rest = rest[:len(rest) - len(rest) % self.num_replicas]
        return rest[self.rank::self.num_replicas]

    def __iter__(self):
        # A generator, so the skip is used up by the iterator a DataLoader reads, not the one it makes and throws away
        batches = self._rest()
        self.start = 0
        yield from batches

    def __len__(self) -> int:
        """This rank's micro-batches of the epoch, counted without building the order (which does not change it)."""
        full_pools, left = divmod(len(self.lengths), self.pool * self.batch_size)
        rest = max(full_pools * self.pool + left // self.batch_size - self.start // self.batch_size, 0)
        return rest // self.num_replicas


def random_batches(count: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """The full batches of one shuffled pass over ``count`` items (``data.batching=random`` on one rank, epoch 0)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i:i + batch_size] for i in range(0, count - batch_size + 1, batch_size)]


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Padding's share in ``batches`` (lists of item indices), each padded to its longest ``lengths``; 0.0 if none."""
    padded = real = 0
    for batch in batches:
        sizes = [int(lengths[i]) for i in batch]
        padded += len(sizes) * max(sizes)
        real += sum(sizes)
    return (padded - real) / padded if padded else 0.0
