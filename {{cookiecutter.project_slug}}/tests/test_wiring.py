"""The training loop's distributed wiring, seen from outside the loop: the quick start in small (conftest's
:func:`quick_start_run`, ``multiproc.py`` starting 2 gloo ranks of ``train.py`` for :data:`TEST_MODEL`, made once per
session and shared with test_smoke) over 3 epochs, each rank recording the utterance ids of every step it trained on
and the norm of the gradient each optimizer step used (conftest's :data:`QUICK_RECORDER`, planted in its processes: a
global optimizer pre-step hook); the loop's own code is left as it is.

* Every epoch is reshuffled: each rank reads another order each epoch (``set_epoch`` given the epoch), and the ranks
  together read every utterance of the epoch once.
* ``train.grad_clip`` is applied to the update: the norm the optimizer steps with is at most the clip, while the norm
  the loop logs (before clipping) is above it."""

import json

import pytest
from conftest import QUICK_BATCH as BATCH
from conftest import QUICK_CLIP as CLIP
from conftest import QUICK_CLIPS as TRAIN_CLIPS
from conftest import QUICK_EPOCHS as EPOCHS


@pytest.fixture(scope="module")
def wired(quick_start_run):
    """``(metrics rows, [rank 0's record, rank 1's])`` of the shared run."""
    folder, code, output = quick_start_run
    assert code == 0, output[-3000:]
    rows = [json.loads(line) for line in (folder / "out" / "metrics.jsonl").read_text().splitlines()]
    return rows, [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]


def test_each_epoch_is_reshuffled_on_every_rank_and_read_once_by_the_ranks_together(wired):
    rows, ranks = wired
    steps = EPOCHS * TRAIN_CLIPS // (2 * BATCH)
    assert [row["step"] for row in rows] == list(range(1, steps + 1))
    assert all(len(rank["ids"]) == steps and all(len(ids) == BATCH for ids in rank["ids"]) for rank in ranks)
    epochs = [row["epoch"] for row in rows]  # the epoch of each step's batch
    assert epochs == sorted(epochs) and set(epochs) == set(range(EPOCHS)), epochs
    orders = [[sum((ids for ids, e in zip(rank["ids"], epochs) if e == epoch), []) for epoch in range(EPOCHS)]
              for rank in ranks]  # orders[rank][epoch]: the ids that rank read in that epoch, in order
    for epoch in range(EPOCHS):
        together = orders[0][epoch] + orders[1][epoch]
        assert sorted(together) == [f"SYN-{i:04d}" for i in range(1, TRAIN_CLIPS + 1)], (epoch, together)
    for rank, order in enumerate(orders):
        for epoch in range(1, EPOCHS):
            assert order[epoch] != order[epoch - 1], f"rank {rank} read epoch {epoch} in epoch {epoch - 1}'s order"
    assert len({id_ for order in orders[0] for id_ in order}) > TRAIN_CLIPS // 2  # each rank's shard changes too


def test_the_configured_clipping_bounds_the_gradient_of_every_update(wired):
    rows, ranks = wired
    logged = [row["grad_norm"] for row in rows]  # before clipping: the loop's own measure
    assert all(norm is not None and norm > 10 * CLIP for norm in logged), logged  # every update had to be clipped
    for rank in ranks:
        assert len(rank["step_norms"]) >= len(rows)  # one per optimizer (a GAN: two) and step
        assert max(rank["step_norms"]) <= CLIP * (1 + 1e-3), rank["step_norms"]
