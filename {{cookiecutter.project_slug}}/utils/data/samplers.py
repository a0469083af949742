"""Which items each rank reads in which order: a resumable ``DistributedSampler``, length buckets and frame budgets,
with the padding they save."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

import numpy as np
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


class FrameBudgetSampler:
    """A distributed batch sampler whose batches hold as many utterances of similar length as a budget of padded mel
    frames allows (``data.batching=frames``): lhotse's ``DynamicBucketingSampler(max_duration=...)``, ESPnet's
    ``batch_bins``, planned for all ranks at once so that every rank takes as many batches.

    An epoch's plan follows from ``seed + epoch`` and ``lengths`` ``(N,)`` (mel frames) alone, whatever the number of
    ranks: the indices are shuffled; each run of ``pool`` batches' worth of them (at the mean cost) is sorted by length
    and packed, shortest first, into batches whose padded size, items x the costliest item, stays within
    ``max_frames`` (and within ``max_items`` items, if > 0); the batches are shuffled, and their items, batch after
    batch, are the epoch's order. An item of length ``L`` costs ``L``, or ``L + L**2 / quadratic`` with ``quadratic``
    > 0 (lhotse's ``quadratic_duration``: attention grows with the square of the length).

    A pass from ``start`` (``set_epoch(epoch, start=k)``: the order's first ``k`` items are read) takes the batches of
    the rest (the one cut at ``k``: its end), the last ones of two items or more split in halves (and halves again,
    where too few) until their number is a multiple of ``num_replicas``; rank ``r`` takes the ``r``-th and every
    ``num_replicas``-th after it. So every rank takes as many batches, every item is read once an epoch, and what all
    ranks have read after a step is a prefix of the order: on as many ranks a resumed pass is the rest of the one
    interrupted, on another number of ranks the rest is planned afresh. Only where every batch left holds one item
    are the last ones that do not fill a step of every rank (fewer than ``num_replicas`` items) left out of the pass.

    Raises ValueError: no lengths, a length < 1, an item that costs more than ``max_frames`` on its own.
    """

    def __init__(self, lengths: Sequence[int], max_frames: int, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                 pool: int = 64, max_items: int = 0, quadratic: int = 0):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if len(self.lengths) == 0 or self.lengths.min() < 1:
            raise ValueError("FrameBudgetSampler: no lengths given" if len(self.lengths) == 0 else
                             f"FrameBudgetSampler: item {self.lengths.argmin()} has length {self.lengths.min()}; "
                             "every length must be >= 1")
        self.cost = self.lengths + self.lengths ** 2 / quadratic if quadratic else self.lengths  # (N,)
        if self.cost.max() > max_frames:
            raise ValueError(f"FrameBudgetSampler: item {self.cost.argmax()} costs {self.cost.max():g} frames, more "
                             f"than max_frames={max_frames}")
        self.max_frames, self.max_items, self.num_replicas, self.rank = max_frames, max_items, num_replicas, rank
        self.seed, self.epoch, self.start = seed, 0, 0
        per_batch = min(max_frames / self.cost.mean(), max_items or np.inf)  # items of a batch, about
        self.pool_items = max(1, int(pool * per_batch))
        self._plan: Optional[tuple[int, np.ndarray, np.ndarray]] = None  # (epoch, order, ends), the latest

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Plan by ``seed + epoch``; ``start``: items of this epoch's order read (by all ranks)."""
        self.epoch, self.start = epoch, start

    def plan(self) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's ``(order (N,), ends (B,))``: batch ``b`` is ``order[ends[b - 1]:ends[b]]`` (from 0 for ``b =
        0``). The latest epoch's is kept."""
        if self._plan is None or self._plan[0] != self.epoch:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            shuffled = torch.randperm(len(self.lengths), generator=generator).numpy()
            pools = np.arange(len(shuffled)) // self.pool_items
            # stable: equal lengths keep their shuffled order, so ties do not depend on the sort's algorithm
            order = shuffled[np.argsort(pools * (self.lengths.max() + 1) + self.lengths[shuffled], kind="stable")]
            ends = np.array(_pack(self.cost[order].tolist(), self.max_frames, self.max_items, self.pool_items))
            sizes = np.diff(ends, prepend=0)
            picked = torch.randperm(len(sizes), generator=generator).numpy()  # the batches in their epoch's order
            new_ends = np.cumsum(sizes[picked])
            # every position of a picked batch takes the item at the same offset in that batch as packed
            moved = np.repeat((ends - sizes)[picked] - (new_ends - sizes[picked]), sizes[picked])
            self._plan = (self.epoch, order[moved + np.arange(len(order))], new_ends)
        return self._plan[1], self._plan[2]

    def edges(self) -> np.ndarray:
        """The pass's batches for all ranks, as edges in the epoch's order: batch ``j`` is ``order[edges[j]:edges[j +
        1]]``."""
        ends = self.plan()[1]
        edges = np.concatenate(([self.start], ends[ends > self.start]))
        while need := -(len(edges) - 1) % self.num_replicas:
            sizes = np.diff(edges)
            halved = np.flatnonzero(sizes >= 2)[-need:]
            if len(halved) == 0:  # one item each: leave out those that do not fill a step of every rank
                return edges[:len(edges) - (len(sizes) % self.num_replicas)]
            edges = np.sort(np.concatenate((edges, edges[halved] + sizes[halved] // 2)))
        return edges

    def step_items(self) -> np.ndarray:
        """Items each step of the pass reads, all ranks together ``(steps,)``."""
        return np.diff(self.edges()[::self.num_replicas])

    def epoch_batches(self) -> list[list[int]]:
        """Every batch of the epoch, for all ranks together (a pass from its start)."""
        order, ends = self.plan()
        return [batch.tolist() for batch in np.split(order, ends[:-1])]

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, so the skip is used up by the iterator a DataLoader reads, not the one it makes and throws away
        order, edges = self.plan()[0], self.edges()
        self.start = 0
        for j in range(self.rank, len(edges) - 1, self.num_replicas):
            yield order[edges[j]:edges[j + 1]].tolist()

    def __len__(self) -> int:
        """This rank's batches of the pass."""
        return (len(self.edges()) - 1) // self.num_replicas


def _pack(costs: list, max_frames: int, max_items: int, pool_items: int) -> list[int]:
    """Where each batch of ``costs`` (each run of ``pool_items`` sorted, cheapest first) ends: a batch grows while its
    items x its last cost stays within ``max_frames`` and its items within ``max_items`` (0: no limit)."""
    ends, count = [], 0
    for i, cost in enumerate(costs):
        if count and ((count + 1) * cost > max_frames or count == max_items or i % pool_items == 0):
            ends.append(i)
            count = 0
        count += 1
    return [*ends, len(costs)]


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
