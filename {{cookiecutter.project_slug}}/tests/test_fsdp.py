"""train.parallelism=fsdp under real launches (2 gloo processes on the CPU): the same losses as DDP, bf16, sharded
and background checkpoints, exact resume after SIGTERM, resume on another number of processes (FSDP and DDP), and
a save killed half-way.

Each model trains its tiny config: every registered model with one optimizer (FSDP refuses the others, tested).
"""

import json
import os
import signal
import sys
import time

import pytest
import torch
from conftest import (ROOT, TEST_MODEL, bound, descendants, finish, run_train_main, start_job, synth_corpus,
                      train_in_process)

import inference
from models import MODELS, config_schemas
from utils.checkpoint.resume import world_size_change
from utils.checkpoint.sharded import load_sharded_model, read_train_state
from utils.config import load_config
from utils.data.samplers import ResumableDistributedSampler

pytestmark = pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out


COMMON = ["--config", "config.json", "--tiny", "--set", "train.log_interval=1", "--set", "train.keep_last=0",
          "--set", "train.val_interval=1000", "--set", "data.num_workers=0", "--set", "train.precision=fp32"]
FSDP = ["--set", "train.parallelism=fsdp"]
TRAINED = sorted(name for name, spec in MODELS.items() if not spec.phase_names)  # FSDP refuses several optimizers
# The model of the single-model tests: the generic tests' one, unless it has several optimizers.
MODEL = TEST_MODEL if TEST_MODEL in TRAINED else (TRAINED or [None])[0]
needs_one = pytest.mark.skipif(MODEL is None, reason="every registered model trains several optimizers, which "
                                                     "FSDP refuses (tests/test_phases.py)")

# Every optimizer step of a job started with this on PYTHONPATH takes 0.3 s more (DDP or FSDP alike): a job slow
# enough to be signalled in the middle. The numbers it computes do not change.
SLOW_STEPS = """
import time
from torch.optim.optimizer import register_optimizer_step_pre_hook


def _slow(optimizer, args, kwargs):
    time.sleep(0.3)


register_optimizer_step_pre_hook(_slow)
"""

# The DCP writer of the step-8 checkpoint hangs after its shard files are opened: a save caught half-way.
HANG_IN_SAVE = """
import time
import torch.distributed.checkpoint.filesystem as filesystem

_write = filesystem.FileSystemWriter.write_data


def _hang(self, plan, planner):
    if "checkpoint_8" in str(self.path):
        time.sleep(600)
    return _write(self, plan, planner)


filesystem.FileSystemWriter.write_data = _hang
"""


# The step-8 checkpoint meets a full disk (ENOSPC when a file of it is flushed to disk): FULL_FILES says which of its
# files, "train_state.pt" (rank 0 writes it first) or ".distcp" (the shards every rank writes through DCP).
DISK_FULL_AT_8 = """
import errno
import os

_fsync = os.fsync


def _full(fd):
    path = os.readlink(f"/proc/self/fd/{fd}")
    if ".checkpoint_8.partial" in path and FULL_FILES in path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _fsync(fd)


os.fsync = _full
"""


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


def losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def sharded_weights(folder, model: str) -> dict:
    """The weights of a sharded checkpoint, put together in this one process."""
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    net = MODELS[model].build_model(cfg)
    load_sharded_model(folder, net)
    return net.state_dict()


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[key].double() - b[key].double()).abs().max().item() for key in a)


def wait_for(condition, proc, timeout=180, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.1)


@pytest.mark.parametrize("model", TRAINED)
def test_fsdp_trains_with_the_losses_of_ddp(corpus, tmp_path, model):
    # Without gradient clipping (Tacotron2's recipe clips): FSDP sums the clipping norm over shards in another order,
    # and Adam magnifies that rounding on the biases before BatchNorm, whose gradients are rounding noise (4.8e-4 in
    # 20 steps, the losses still equal to 1e-5). What is compared here is the sharding.
    settings = ["--max-steps", "8", "--set", "train.checkpoint_interval=8", "--set", "train.grad_clip=0"]
    train(tmp_path / "ddp", corpus, model, *settings)
    output = train(tmp_path / "fsdp", corpus, model, *settings, *FSDP)
    assert "parallelism fsdp" in output
    ddp, fsdp = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp")
    assert len(ddp) == len(fsdp) == 8
    assert fsdp == pytest.approx(ddp, rel=1e-5, abs=1e-5), [abs(a - b) for a, b in zip(ddp, fsdp)]
    # A sharded checkpoint: a folder per step, the link to the last, nothing half-written.
    out = tmp_path / "fsdp"
    assert os.readlink(out / "checkpoint_last") == "checkpoint_8"
    assert not list(out.glob(".checkpoint_*")) and not list(out.glob("checkpoint_*.pt"))
    assert max_difference(sharded_weights(out / "checkpoint_last", model),
                          torch.load(tmp_path / "ddp" / "checkpoint_last.pt", weights_only=True)["model"]) < 1e-4


@needs_one
def test_fsdp_with_bf16_mixed_precision_trains(corpus, tmp_path):
    train(tmp_path, corpus, MODEL, "--max-steps", "6", "--set", "train.checkpoint_interval=6", *FSDP,
          "--set", "train.precision=bf16", "--set", "train.on_nonfinite=stop")
    assert all(torch.isfinite(torch.tensor(losses(tmp_path))))
    weights = sharded_weights(tmp_path / "checkpoint_last", MODEL)
    assert all(w.dtype != torch.bfloat16 for w in weights.values() if w.is_floating_point()), "fp32 master weights"


@needs_one
def test_sigterm_then_resume_with_background_checkpoints_ends_like_the_uninterrupted_run(corpus, tmp_path):
    settings = ["--max-steps", "10", "--set", "train.checkpoint_interval=4", *FSDP,
                "--set", "train.async_checkpoint=true", "--set", "train.ema_decay=0.9"]
    output = train(tmp_path / "reference", corpus, MODEL, *settings)
    assert "in the background" in output
    out = tmp_path / "stopped"
    proc = launch(out, corpus, MODEL, *settings, plant=SLOW_STEPS)
    wait_for(lambda: (out / "metrics.jsonl").exists() and len(losses(out)) >= 5, proc, what="step 5")
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0 and "stopped at step" in output, output[-3000:]
    stopped = read_train_state(out / "checkpoint_last")["step"]
    assert 5 <= stopped < 10 and os.readlink(out / "checkpoint_last") == f"checkpoint_{stopped}"
    output = train(out, corpus, MODEL, *settings, "--resume", "auto")
    assert f"at step {stopped}" in output
    reference = sharded_weights(tmp_path / "reference" / "checkpoint_last", MODEL)
    assert max_difference(reference, sharded_weights(out / "checkpoint_last", MODEL)) <= 1e-6
    assert read_train_state(out / "checkpoint_last")["step"] == 10
    # the EMA weights too: inference puts them together from every rank's shards, says so, and they are not the raw
    averaged = [inference.load_trained(folder / "checkpoint_last", torch.device("cpu"))[1].state_dict()
                for folder in (tmp_path / "reference", out)]
    assert max_difference(*averaged) <= 1e-6 and max_difference(averaged[0], reference) > 1e-4


@needs_one
@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_a_checkpoint_of_two_processes_continues_on_one_then_on_two(corpus, tmp_path, parallelism):
    settings = ["--set", f"train.parallelism={parallelism}", "--set", "train.checkpoint_interval=2"]
    train(tmp_path, corpus, MODEL, *settings, "--max-steps", "2")
    output = train_here(tmp_path, corpus, MODEL, *settings, "--max-steps", "4", "--resume", "auto")
    notes = [line for line in output.splitlines() if "process(es), this run has" in line]
    assert len(notes) == 1 and "written by 2 process(es), this run has 1" in notes[0], output[-3000:]
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    batch = cfg.section(MODEL).batch_size
    assert f"train.grad_accumulation 1 -> 2 keeps the global batch at {2 * batch}" in notes[0]
    assert f"(epoch 0, sample {2 * 2 * batch} of it)" in output or "(epoch 1, sample" in output, output[-2000:]
    output = train(tmp_path, corpus, MODEL, *settings, "--max-steps", "6", "--resume", "auto")
    assert "written by 1 process(es), this run has 2: train.grad_accumulation 2 -> 1" in output, output[-3000:]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == \
        list(range(1, 7))


@needs_one
def test_a_save_killed_half_way_leaves_the_previous_checkpoint_to_resume_from(corpus, tmp_path):
    settings = ["--max-steps", "10", "--set", "train.checkpoint_interval=4", *FSDP]
    proc = launch(tmp_path, corpus, MODEL, *settings, plant=HANG_IN_SAVE)
    wait_for(lambda: (tmp_path / ".checkpoint_8.partial").is_dir(), proc, what="the step-8 save")
    time.sleep(1)
    for pid in [proc.pid, *descendants(proc.pid)]:  # the launcher and its ranks, each in a session of its own
        os.kill(pid, signal.SIGKILL)
    finish(proc)
    assert os.readlink(tmp_path / "checkpoint_last") == "checkpoint_4" and not (tmp_path / "checkpoint_8").exists()
    output = train_here(tmp_path, corpus, MODEL, *settings, "--resume", "auto")
    assert "at step 4" in output, output[-3000:]
    assert os.readlink(tmp_path / "checkpoint_last") == "checkpoint_10"
    assert not list(tmp_path.glob(".checkpoint_*.partial")), "the killed save's leftovers are removed"


@needs_one
def test_fsdp_refuses_what_it_cannot_do_in_one_line(corpus, tmp_path):
    # A run without FSDP continues from a sharded checkpoint (the shards are put together), here on one process.
    sharded = tmp_path / "sharded"
    train(sharded, corpus, MODEL, "--max-steps", "2", "--set", "train.checkpoint_interval=2", *FSDP)
    output = train_here(sharded, corpus, MODEL, "--max-steps", "3", "--resume", "auto")
    assert "at step 2" in output and (sharded / "checkpoint_last.pt").is_file()
    # "last" names the newest checkpoint, whichever its kind: the single file, no longer the sharded folder of step 2.
    assert not (sharded / "checkpoint_last").exists() and (sharded / "checkpoint_2").is_dir()
    assert f"done: 3 steps; checkpoint {sharded / 'checkpoint_last.pt'}" in output
    output = train_here(sharded, corpus, MODEL, "--max-steps", "4", "--resume", "auto")
    assert "at step 3" in output, output[-2000:]
    # An FSDP run refuses that single-file checkpoint, and fp16.
    for extra, message in ((["--resume", str(sharded / "checkpoint_last.pt")], "is a single-file checkpoint"),
                           (["--set", "train.precision=fp16"], "FSDP2 mixed precision is bf16")):
        code, _, err = run_train_main([*COMMON, "--model", MODEL, "--dataset-path", str(corpus), "--output-dir",
                                       str(tmp_path / "fsdp"), "--max-steps", "6", *FSDP, *extra])
        errors = [line for line in err.splitlines() if line.startswith("ERROR")]
        assert code != 0 and len(errors) == 1 and message in errors[0], err[-2000:]


@needs_one
@pytest.mark.parametrize("full", ["train_state.pt", ".distcp"])
def test_a_full_disk_during_a_sharded_save_ends_every_rank_with_one_line_and_keeps_the_last_checkpoint(corpus,
                                                                                                     tmp_path, full):
    settings = ["--max-steps", "10", "--set", "train.checkpoint_interval=4", *FSDP, "--set", "data.num_workers=2"]
    start = time.monotonic()
    code, output = finish(launch(tmp_path, corpus, MODEL, *settings, plant=f"FULL_FILES = {full!r}\n" + DISK_FULL_AT_8),
                          timeout=bound(120))
    took = time.monotonic() - start
    assert code == 1 and took < bound(60), (code, took, output[-3000:])
    logs = [output, (tmp_path / "logs" / "rank_1.stderr.log").read_text()]
    for rank, text in enumerate(logs):
        errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
        assert len(errors) == 1 and "Traceback" not in text, (rank, text[-3000:])
        assert errors[0].startswith(f"ERROR: rank {rank}: could not write the step 8 checkpoint in {tmp_path}: "), \
            errors[0]
        assert errors[0].endswith("No space left on device; earlier checkpoints are kept (checkpoint_4)"), errors[0]
    assert os.readlink(tmp_path / "checkpoint_last") == "checkpoint_4" and not list(tmp_path.glob(".checkpoint_*"))
    output = train_here(tmp_path, corpus, MODEL, *settings, "--resume", "auto")  # the disk has room again
    assert "at step 4" in output and os.readlink(tmp_path / "checkpoint_last") == "checkpoint_10"


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
