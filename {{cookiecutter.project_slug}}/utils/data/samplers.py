"""Which items each rank reads in which order: a resumable ``DistributedSampler`` and length buckets (batches of similar
lengths for variable-length models), with the padding they save."""

from __future__ import annotations

from typing import Sequence

import torch
from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """A :class:`~torch.utils.data.DistributedSampler` that can start an epoch part-way through, on any number of ranks.

    ``set_epoch(epoch, start=k)`` makes the next pass leave out the first ``k`` global samples of the epoch's order
    (the parent's, by ``seed + epoch``, whatever the number of ranks) and split the rest across the ranks as the parent
    splits a whole epoch (``drop_last`` drops the remainder, else it is padded from the start): on the same number of
    ranks, a resumed epoch is exactly the rest of the uninterrupted one. The pass after it is whole again.
    """

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
    """A distributed batch sampler whose batches hold utterances of similar length (``data.batching=buckets``): a random
    batch of LJSpeech-like clips (1-10 s) is largely padding, wasted compute for a variable-length model. The idea of
    VITS' ``DistributedBucketSampler`` and NVIDIA NeMo's semi-sorted batches, made resumable. An epoch's order depends
    on ``seed + epoch`` alone (not on the ranks or workers): the indices are shuffled; each run of ``pool``
    (``data.bucket_pool``: larger pads less, smaller mixes more) micro-batches' worth is sorted by ``lengths``
    (``(N,)``: what the collate function pads) and cut into micro-batches of ``batch_size`` (an incomplete one is left
    out); the micro-batches are shuffled. Step ``s`` takes micro-batches ``s * num_replicas`` on, rank ``r`` the
    ``r``-th; those that do not fill a last step are left out too, so each utterance is read at most once an epoch and
    at most ``batch_size * num_replicas - 1`` are left out. ``set_epoch(epoch, start=k)`` leaves out the first ``k``
    global samples: resumed on the same ranks the epoch goes on exactly; on others, they share the rest.

    Raises:
        ValueError: ``batch_size``, ``pool`` or ``num_replicas`` < 1, ``rank`` outside ``[0, num_replicas)``, a length <
            1, or a ``start`` that is not a multiple of ``batch_size``.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, pool: int = 64):
        if batch_size < 1 or pool < 1 or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"LengthBucketSampler: batch_size={batch_size}, pool={pool}, num_replicas="
                             f"{num_replicas}, rank={rank}: sizes must be >= 1 and 0 <= rank < num_replicas")
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
        # A generator: its body runs at the first batch asked for. A DataLoader makes one iterator it throws away
        # before the one it reads, and that one must not use up the skip, which applies to one pass only.
        batches = self._rest()
        self.start = 0
        yield from batches

    def __len__(self) -> int:
        """This rank's micro-batches of the epoch, counted without building the order (which does not change it)."""
        full_pools, left = divmod(len(self.lengths), self.pool * self.batch_size)
        rest = max(full_pools * self.pool + left // self.batch_size - self.start // self.batch_size, 0)
        return rest // self.num_replicas


def random_batches(count: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """The full batches of one shuffled pass over ``count`` items (``data.batching=random`` on one rank, epoch 0): what
    :func:`padding_fraction` compares bucketed batches with."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i:i + batch_size] for i in range(0, count - batch_size + 1, batch_size)]


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """The share of padding in ``batches`` (lists of item indices) padded to their longest: ``sum(len(b) * max(lengths
    of b) - sum(lengths of b)) / sum(len(b) * max(lengths of b))``; 0.0 when there is no batch."""
    padded = real = 0
    for batch in batches:
        sizes = [int(lengths[i]) for i in batch]
        padded += len(sizes) * max(sizes)
        real += sum(sizes)
    return (padded - real) / padded if padded else 0.0
