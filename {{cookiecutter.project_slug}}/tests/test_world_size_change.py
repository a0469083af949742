"""Resuming on another number of processes (world size): the global batch kept through train.grad_accumulation or
named when it cannot be, every sample of the interrupted epoch read once, and a DDP checkpoint of 2 gloo processes
continued on 1 process, then on 2 again.

:func:`continues_on_one_then_on_two` is the real-launch check, with room for the arguments of another parallelism.
"""

import json
import os
import sys

import pytest
from conftest import ROOT, TEST_MODEL, bound, finish, start_job, synth_corpus, train_in_process

from models import MODELS
from parts import config_schemas
from utils.checkpoint.resume import world_size_change
from utils.config import load_config
from utils.data.samplers import ResumableDistributedSampler

COMMON = ["--config", "config.json", "--tiny", "--set", "train.log_interval=1", "--set", "train.keep_last=0",
          "--set", "train.val_interval=1000", "--set", "data.num_workers=0", "--set", "train.precision=fp32"]
# The model of the real launches: the generic tests' one, unless it trains several optimizers (every parallelism
# takes a model with one, so each resumes the same model).
ONE_OPTIMIZER = sorted(name for name, spec in MODELS.items() if not spec.phase_names)
MODEL = TEST_MODEL if TEST_MODEL in ONE_OPTIMIZER else (ONE_OPTIMIZER or [None])[0]
needs_one = pytest.mark.skipif(MODEL is None, reason="every registered model trains several optimizers")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("corpus"), n=30)


def launch(out, corpus, model, *extra, plant=None):
    """``multiproc.py train.py`` on 2 processes (a Popen in a session of its own)."""
    cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir", str(out / "logs"),
           "train.py", *COMMON, "--model", model, "--dataset-path", str(corpus), "--output-dir", str(out), *extra]
    return start_job(cmd, out, 2, plant)


def train(out, corpus, model, *extra) -> str:
    code, output = finish(launch(out, corpus, model, *extra), timeout=bound(600))
    assert code == 0, output[-4000:]
    return output


def train_here(out, corpus, model, *extra) -> str:
    """``train.py`` on one process inside this one (:func:`conftest.run_train_main`): a resume that proves what the
    checkpoint holds, not the launch; its stdout and stderr, once it has exited 0."""
    return train_in_process([*COMMON, "--model", model, "--dataset-path", str(corpus), "--output-dir", str(out),
                             *extra])


def continues_on_one_then_on_two(corpus, tmp_path, model: str, *extra: str, started: bool = False) -> None:
    """2 steps on 2 processes, then on 1 (train.grad_accumulation 1 -> 2 keeps the global batch, the epoch continues
    where it stopped), then on 2 again (2 -> 1): one metrics row per step, 1 to 6, in the output folder ``tmp_path``.
    ``extra``: more arguments of every run (none: DDP, the default parallelism). ``started``: ``tmp_path`` already
    holds those first 2 steps on 2 processes (a copy of a run another test shares), not trained here."""
    settings = [*extra, "--set", "train.checkpoint_interval=2"]
    if not started:
        train(tmp_path, corpus, model, *settings, "--max-steps", "2")
    output = train_here(tmp_path, corpus, model, *settings, "--max-steps", "4", "--resume", "auto")
    notes = [line for line in output.splitlines() if "process(es), this run has" in line]
    assert len(notes) == 1 and "written by 2 process(es), this run has 1" in notes[0], output[-3000:]
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    batch = cfg.section(model).batch_size
    assert f"train.grad_accumulation 1 -> 2 keeps the global batch at {2 * batch}" in notes[0]
    assert f"(epoch 0, sample {2 * 2 * batch} of it)" in output or "(epoch 1, sample" in output, output[-2000:]
    output = train(tmp_path, corpus, model, *settings, "--max-steps", "6", "--resume", "auto")
    assert "written by 1 process(es), this run has 2: train.grad_accumulation 2 -> 1" in output, output[-3000:]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, 7))


@pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out
@needs_one
def test_a_ddp_checkpoint_of_two_processes_continues_on_one_then_on_two(corpus, tmp_path):
    continues_on_one_then_on_two(corpus, tmp_path, MODEL)


@pytest.mark.parametrize("before, now", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 2)])
def test_an_epoch_continued_on_another_number_of_ranks_reads_every_sample_once(before, now):
    """The samples read before the stop and after the resume make up the epoch's order: none twice, none left out
    but the few that do not fill a global batch (``drop_last``)."""
    n, batch, batches_read = 103, 4, 5

    def shards(world_size, start):
        samplers = [ResumableDistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=7, drop_last=True)
                    for rank in range(world_size)]
        for sampler in samplers:
            sampler.set_epoch(3, start=start)
        return [list(sampler) for sampler in samplers]

    read = [i for shard in shards(before, 0) for i in shard[:batches_read * batch]]
    start = batches_read * batch * before
    rest = [i for shard in shards(now, start) for i in shard]
    assert len(read) == start and len(set(read) | set(rest)) == len(read) + len(rest), "a sample read twice"
    assert n - len(read) - len(rest) < now, "samples left out beyond the remainder"
    # On the same number of ranks the resumed pass is exactly the rest of the uninterrupted one.
    whole = shards(before, 0)
    assert shards(before, start) == [shard[batches_read * batch:] for shard in whole]


def test_the_global_batch_is_kept_when_the_new_world_size_divides_it_and_named_when_not():
    assert world_size_change(2, 1, 2, 4, 1) == (1, None)
    assert world_size_change(2, 2, 2, 4, 1) == (2, None)  # an accumulation an earlier resume set keeps its batch
    kept, line = world_size_change(4, 1, 2, 4, 1)
    assert kept == 2 and "train.grad_accumulation 1 -> 2 keeps the global batch at 16 (4 x 2 x 2)" in line
    kept, line = world_size_change(2, 1, 3, 4, 1)
    assert kept == 1 and line.startswith("warning:") and "global batch changes 8 -> 12" in line
    # 2 -> 1 -> 3 processes at batch 2: the 1-process resume accumulated 2 to keep 4; on 3 the closest is 6, not 12
    kept, line = world_size_change(1, 2, 3, 2, 1)
    assert kept == 1 and "global batch changes 4 -> 6 (2 x 1 x 3; no train.grad_accumulation keeps 4)" in line
