"""train.parallelism=fsdp on 2 gloo processes on the CPU: the same losses as DDP, bf16, sharded and background
checkpoints, exact resume after SIGTERM, resume on another number of processes (DDP's resume in
tests/test_world_size_change.py), a save killed half-way, and the settings of sharded training refused where they
would do nothing. A test about the job (a signal, a kill, a full disk, a resume on 2 processes) launches its own with
multiproc.py; the runs that tests only read or continue are trained once per session, one after the other, in the
same 2 processes (:func:`runs`).

Each model trains its tiny config: every registered model with one optimizer (FSDP refuses the others, tested).
"""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, bound, descendants, finish, made_once, run_ranks, run_train_main, shared_corpus
from test_bad_input import precious, run_train, snapshot, the_error  # noqa: F401 (precious: a fixture)
from test_phases import TOY_SPEC, toy_config
from test_world_size_change import COMMON, continues_on_one_then_on_two, launch, train, train_here

import inference
from models import MODELS
from parts import PARTS, config_schemas
from utils.checkpoint.sharded import FOLDER, read_train_state
from utils.config import ConfigError, load_config
from utils.training.checks import check_settings
from utils.training.recipe import apply_recipe

# Real multi-process jobs are marked slow: python -m pytest -m "not slow" leaves them out.
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
    """30 clips, once per session: the shared runs (:func:`runs`) and the tests' own launches read the same folder."""
    return shared_corpus(tmp_path_factory, "fsdp_corpus", 30)


# The settings of the runs that the losses of DDP and FSDP are compared on: without gradient clipping (Tacotron2's
# recipe clips), FSDP sums the clipping norm over shards in another order, and Adam magnifies that rounding on the
# biases before BatchNorm, whose gradients are rounding noise (4.8e-4 in 20 steps, the losses still equal to 1e-5).
# What is compared is the sharding.
COMPARED = ["--max-steps", "8", "--set", "train.checkpoint_interval=8", "--set", "train.grad_clip=0"]
BF16 = ["--max-steps", "6", "--set", "train.checkpoint_interval=6", *FSDP, "--set", "train.precision=bf16",
        "--set", "train.on_nonfinite=stop"]
BACKGROUND = ["--max-steps", "10", "--set", "train.checkpoint_interval=4", *FSDP, "--set", "train.async_checkpoint=true",
              "--set", "train.ema_decay=0.9"]
TWO_STEPS = [*FSDP, "--set", "train.checkpoint_interval=2", "--max-steps", "2"]


def shared_runs() -> dict:
    """``{name: train.py arguments after the common ones}`` of the runs :func:`runs` trains: DDP and FSDP of every model
    in :data:`TRAINED` (``ddp-NAME``, ``fsdp-NAME``), and of :data:`MODEL` bf16, the uninterrupted run of background
    checkpoints (``background``) and 2 steps with a sharded checkpoint at step 2 (``two_steps``)."""
    found = {f"{kind}-{model}": [*COMMON, "--model", model, *COMPARED, *(FSDP if kind == "fsdp" else [])]
             for model in TRAINED for kind in ("ddp", "fsdp")}
    if MODEL is not None:
        found.update({name: [*COMMON, "--model", MODEL, *settings]
                      for name, settings in (("bf16", BF16), ("background", BACKGROUND), ("two_steps", TWO_STEPS))})
    return found


# Every run above, one after the other, by train.main in the same 2 gloo processes under one process group that the
# worker starts (train.main's entry for a framework that starts the processes and their group itself, as Ray Train
# does): the ranks' start-up is paid once, not once per run. Rank 0's output of each run is between its two lines.
RUNS_WORKER = """
import json
import sys
from pathlib import Path

import distributed
import train

folder = Path(sys.argv[1])
distributed.init_distributed()
for name, argv in json.loads((folder / "runs.json").read_text()).items():
    print(f"=== begin {name}", flush=True)
    code = train.main(argv)
    print(f"=== end {name}: exit {code}", flush=True)
    if code != 0:
        sys.exit(code)
distributed.cleanup()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """``name -> (output folder, rank 0's output)`` of every run of :func:`shared_runs` (2 processes, the tiny config),
    trained once per session; no test may change their folders (copy one to continue it)."""
    def make(folder):
        config = str(Path(ROOT) / "config.json")
        (folder / "runs.json").write_text(json.dumps({
            name: [config if arg == "config.json" else arg for arg in argv] + [
                "--dataset-path", str(corpus), "--output-dir", str(folder / name)]
            for name, argv in shared_runs().items()}))
        said = run_ranks(RUNS_WORKER, folder, timeout=bound(900))[0]
        return {name: said.split(f"=== begin {name}\n", 1)[1].split(f"=== end {name}: exit 0\n", 1)[0]
                for name in shared_runs()}
    folder, said = made_once(tmp_path_factory, "fsdp_runs", make)
    return {name: (folder / name, text) for name, text in said.items()}


def copied(run: Path, out: Path) -> Path:
    """A copy of a shared run's folder (its checkpoint_last link kept a link) at ``out``, to continue."""
    shutil.copytree(run, out, symlinks=True)
    return out


def losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def sharded_weights(folder, model: str) -> dict:
    """The weights of a sharded checkpoint, put together in this one process."""
    cfg = load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True)
    net = MODELS[model].build_model(cfg)
    FOLDER.load_weights(folder, net)
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


@pytest.mark.slow
@pytest.mark.parametrize("model", TRAINED)
def test_fsdp_trains_with_the_losses_of_ddp(runs, model):
    """The same 8 steps (:data:`COMPARED`) on 2 processes under DDP and under FSDP (:func:`runs`)."""
    (ddp_out, ddp_said), (out, said) = runs[f"ddp-{model}"], runs[f"fsdp-{model}"]
    assert "parallelism fsdp" in said and "parallelism fsdp" not in ddp_said
    ddp, fsdp = losses(ddp_out), losses(out)
    assert len(ddp) == len(fsdp) == 8
    assert fsdp == pytest.approx(ddp, rel=1e-5, abs=1e-5), [abs(a - b) for a, b in zip(ddp, fsdp)]
    # A sharded checkpoint: a folder per step, the link to the last, nothing half-written.
    assert os.readlink(out / "checkpoint_last") == "checkpoint_8"
    assert not list(out.glob(".checkpoint_*")) and not list(out.glob("checkpoint_*.pt"))
    assert max_difference(sharded_weights(out / "checkpoint_last", model),
                          torch.load(ddp_out / "checkpoint_last.pt", weights_only=True)["model"]) < 1e-4


@pytest.mark.slow
@needs_one
def test_fsdp_with_bf16_mixed_precision_trains(runs):
    out, said = runs["bf16"]  # 6 steps on 2 processes (BF16)
    assert "parallelism fsdp" in said and len(losses(out)) == 6
    assert all(torch.isfinite(torch.tensor(losses(out))))
    weights = sharded_weights(out / "checkpoint_last", MODEL)
    assert all(w.dtype != torch.bfloat16 for w in weights.values() if w.is_floating_point()), "fp32 master weights"


@pytest.mark.slow
@needs_one
def test_sigterm_then_resume_with_background_checkpoints_ends_like_the_uninterrupted_run(runs, corpus, tmp_path):
    uninterrupted, output = runs["background"]  # BACKGROUND's settings, on 2 processes
    assert "in the background" in output
    out = tmp_path / "stopped"
    proc = launch(out, corpus, MODEL, *BACKGROUND, plant=SLOW_STEPS)
    wait_for(lambda: (out / "metrics.jsonl").exists() and len(losses(out)) >= 5, proc, what="step 5")
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0 and "stopped at step" in output, output[-3000:]
    stopped = read_train_state(out / "checkpoint_last")["step"]
    assert 5 <= stopped < 10 and os.readlink(out / "checkpoint_last") == f"checkpoint_{stopped}"
    output = train(out, corpus, MODEL, *BACKGROUND, "--resume", "auto")
    assert f"at step {stopped}" in output
    reference = sharded_weights(uninterrupted / "checkpoint_last", MODEL)
    assert max_difference(reference, sharded_weights(out / "checkpoint_last", MODEL)) <= 1e-6
    assert read_train_state(out / "checkpoint_last")["step"] == 10
    # the EMA weights too: inference puts them together from every rank's shards, says so, and they are not the raw
    averaged = [inference.load_trained(folder / "checkpoint_last", torch.device("cpu"))[1].state_dict()
                for folder in (uninterrupted, out)]
    assert max_difference(*averaged) <= 1e-6 and max_difference(averaged[0], reference) > 1e-4


@pytest.mark.slow
@needs_one
def test_a_sharded_checkpoint_of_two_processes_continues_on_one_then_on_two(runs, corpus, tmp_path):
    out = copied(runs["two_steps"][0], tmp_path / "out")  # 2 steps on 2 processes (TWO_STEPS)
    continues_on_one_then_on_two(corpus, out, MODEL, *FSDP, started=True)


@pytest.mark.slow
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


@pytest.mark.slow
@needs_one
def test_fsdp_refuses_what_it_cannot_do_in_one_line(runs, corpus, tmp_path):
    # A run without FSDP continues from a sharded checkpoint of 2 processes (the shards are put together), here on one.
    sharded = copied(runs["two_steps"][0], tmp_path / "sharded")  # 2 steps, a sharded checkpoint at step 2
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


@pytest.mark.slow
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


def test_fsdp_of_a_model_with_several_optimizers_is_refused_with_a_reason():
    cfg = apply_recipe(TOY_SPEC, toy_config())  # the nulls filled, as train.py's config is before its checks
    cfg.train.parallelism = "fsdp"
    with pytest.raises(ConfigError, match="trains several optimizers \\(discriminator, generator\\).*use "
                                          "train.parallelism=ddp"):
        check_settings(TOY_SPEC, cfg, PARTS.checks)  # before any model, process group or data


# settings that would do nothing in the chosen mode are refused, not silently ignored (tests/test_bad_input.py has
# the other bad --set cases)
@pytest.mark.parametrize("setting, message", [
    ("train.async_checkpoint=true", "train.async_checkpoint=true does nothing with train.parallelism=ddp: it writes "
                                    "sharded checkpoints in the background under train.parallelism=fsdp only"),
    ("train.reshard_after_forward=false", "train.reshard_after_forward=false does nothing with train.parallelism=ddp"),
    ("train.activation_checkpointing_every=3", "train.activation_checkpointing_every=3 applies to "
                                               "train.activation_checkpointing=selective only (it is none)"),
])
def test_a_sharding_setting_that_would_do_nothing_is_named(capsys, precious, corpus, setting, message):  # noqa: F811
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--set", setting, "--dataset-path", str(corpus), "--output-dir", str(precious))
    line = the_error(code, err, out)
    assert message in line, line
    assert snapshot(precious) == before
