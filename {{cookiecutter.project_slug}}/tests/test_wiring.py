"""The training loop's distributed wiring, seen from outside the loop: one tiny ``train.py`` run of :data:`TEST_MODEL`
on 2 gloo ranks (once per session, fast tier) over 3 epochs, each rank recording the utterance ids of every step it
trained on and the norm of the gradient each optimizer step used (a global optimizer pre-step hook); the loop's own
code is left as it is.

* Every epoch is reshuffled: each rank reads another order each epoch (``set_epoch`` given the epoch), and the ranks
  together read every utterance of the epoch once.
* ``train.grad_clip`` is applied to the update: the norm the optimizer steps with is at most the clip, while the norm
  the loop logs (before clipping) is above it."""

import json
from pathlib import Path

import pytest
from conftest import ROOT, TEST_MODEL, made_once, run_ranks, synth_corpus

BATCH, TRAIN_CLIPS, EPOCHS = 2, 8, 3
"""Per-rank batch and training clips: 2 steps an epoch on 2 ranks, :data:`EPOCHS` epochs."""
CLIP = 1e-3
"""``train.grad_clip``: far below any tiny model's gradient norm, so every update is clipped."""

WORKER = '''
import json, os, sys
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import train

folder = Path(sys.argv[1])
read, seen, stepped = train.next_micro_batches, [], []


def reading(*args, **kwargs):  # the batches the loop trains on, as it receives them
    micro = read(*args, **kwargs)
    seen.append(list(micro[2]))
    return micro


def before_step(optimizer, args, kwargs):  # the gradient the update is made from
    grads = [p.grad.detach().flatten() for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
    stepped.append(float(torch.linalg.vector_norm(torch.cat(grads))))


train.next_micro_batches = reading
register_optimizer_step_pre_hook(before_step)
code = train.main(json.loads((folder / "argv.json").read_text()))
(folder / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"ids": seen, "step_norms": stepped}))
sys.exit(code)
'''


@pytest.fixture(scope="module")
def wired(tmp_path_factory):
    """``(metrics rows, [rank 0's record, rank 1's])`` of the shared run (:func:`made_once`)."""
    def run(folder):
        corpus = synth_corpus(folder / "corpus", n=TRAIN_CLIPS + 1, seconds=0.3)  # the last validates
        argv = ["--config", str(Path(ROOT) / "config.json"), "--model", TEST_MODEL, "--tiny", "--max-steps",
                str(EPOCHS * TRAIN_CLIPS // (2 * BATCH)), "--dataset-path", str(corpus), "--output-dir",
                str(folder / "out")]
        for setting in ("data.val_size=1", "data.num_workers=0", f"{TEST_MODEL}.batch_size={BATCH}",
                        "train.log_interval=1", "train.val_interval=1000", f"train.grad_clip={CLIP}"):
            argv += ["--set", setting]
        (folder / "argv.json").write_text(json.dumps(argv))
        run_ranks(WORKER, folder)
    folder, _ = made_once(tmp_path_factory, "wiring_run", run)
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
