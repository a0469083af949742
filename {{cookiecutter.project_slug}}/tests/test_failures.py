"""An error anywhere in a rank ends the job within seconds, with one ``ERROR:`` line, and loses nothing.

Real jobs with DataLoader workers on (``data.num_workers=2``, the default's shape): a planted exception in the
model's forward, in the dataset's ``__getitem__`` (a worker) and in the collate function, a full disk at a
checkpoint save, through ``multiproc.py`` on 2 gloo processes and through plain ``python train.py``. Then one run
per output folder, and a finished run that is launched again. Faults are planted with a ``sitecustomize.py`` on
``PYTHONPATH``; the project's code is not changed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (ROOT, TEST_MODEL, alive, bound, clean_env, finish, planted, process_start_s, synth_corpus,
                      train_in_process)

from utils.errors import CheckpointError
from utils.run import LOCK_NAME, RunLock

pytestmark = pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out


ARGS = ["--config", "config.json", "--model", TEST_MODEL, "--tiny", "--max-steps", "12", "--set",
        "train.log_interval=1", "--set", "train.checkpoint_interval=4", "--set", "train.keep_last=0",
        "--set", "train.val_interval=100", "--set", "data.num_workers=2"]

# Once two optimizer steps are done, the next training forward of any module of the rank named by PLANT_RANK
# raises, as a bug in the user's model would (whatever the model's shape: one network or several).
IN_FORWARD = '''
import os, torch
from torch.optim.optimizer import register_optimizer_step_post_hook
steps = [0]
register_optimizer_step_post_hook(lambda optimizer, args, kwargs: steps.__setitem__(0, steps[0] + 1))
def _bug(module, args):
    if steps[0] >= 2 and module.training and os.environ.get("RANK", "0") == os.environ["PLANT_RANK"]:
        raise TypeError("unsupported operand type(s) for +: 'Tensor' and 'NoneType' (planted in forward)")
torch.nn.modules.module.register_module_forward_pre_hook(_bug)
'''

# Every DataLoader's dataset (IN_GETITEM) or collate function (IN_COLLATE) raises on its 5th call in a process.
IN_DATA = '''
import torch.utils.data as data
_init = data.DataLoader.__init__
calls = [0]
def _count(what):
    calls[0] += 1
    if calls[0] == 5:
        raise KeyError(f"planted in {what}")

class _Planted(data.Dataset):
    def __init__(self, inner):
        self.inner = inner
    def __len__(self):
        return len(self.inner)
    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
    def __getitem__(self, index):
        _count("__getitem__")
        return self.inner[index]

def _wrap_collate(collate):
    def planted(items):
        _count("collate")
        return collate(items) if collate is not None else data.default_collate(items)
    return planted

def _patched(self, dataset, *args, **kwargs):
    if WHERE == "getitem":
        dataset = _Planted(dataset)
    else:
        kwargs["collate_fn"] = _wrap_collate(kwargs.get("collate_fn"))
    _init(self, dataset, *args, **kwargs)
data.DataLoader.__init__ = _patched
'''


def full_disk_writing(name: str) -> str:
    """A plant: the disk fills while a file whose path holds ``name`` is written (its fsync fails with ENOSPC)."""
    return '''
import errno, os
_fsync = os.fsync
def _full(fd):
    if %r in os.readlink(f"/proc/self/fd/{fd}"):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _fsync(fd)
os.fsync = _full
''' % name


# The disk fills while the step-8 checkpoint is written: fsync of its temporary file fails with ENOSPC.
FULL_DISK = full_disk_writing(".checkpoint_8.pt.tmp")
# The output folder has less room than the start-up write-speed test writes (min(checkpoint size, 64 MiB)).
FULL_AT_START = full_disk_writing(".write_speed.tmp")

# The first training forward waits while the file named by HOLD exists: a run that is surely still going when a
# second one starts, and that goes on when the test removes the file.
HOLD = '''
import os, time, torch
released = [False]
def _hold(module, args, output):
    while module.training and not released[0] and os.path.exists(os.environ["HOLD"]):
        time.sleep(0.1)
    released[0] = released[0] or module.training
torch.nn.modules.module.register_module_forward_hook(_hold)
'''


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("corpus"), n=20)


def start(out: Path, corpus: Path, plant: str | None, *extra: str, nproc: int = 2, **env: str) -> subprocess.Popen:
    """``multiproc.py`` on ``nproc`` processes (``nproc=0``: plain ``python train.py``) in a session of its own,
    with ``plant`` as every process's ``sitecustomize.py``."""
    out.mkdir(parents=True, exist_ok=True)
    job_env = clean_env(max(nproc, 1), **env)
    if plant is not None:
        planted(out.parent / f"{out.name}_plant", plant, job_env)
    launcher = [sys.executable, "multiproc.py", "--nproc-per-node", str(nproc), "--log-dir", str(out / "logs")] \
        if nproc else [sys.executable]
    cmd = [*launcher, "train.py", *ARGS, "--dataset-path", str(corpus), "--output-dir", str(out), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env,
                            start_new_session=True)


def session_pids(sid: int) -> list[int]:
    """Living processes of session ``sid`` (the launcher's, with its ranks and their DataLoader workers)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[4]) == sid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return alive(found)


def ended_fast(proc: subprocess.Popen, limit_s: float = 60) -> tuple[int, str, float]:
    """(exit code, output, seconds) of a job that must end by itself within :func:`bound` of ``limit_s`` (the
    job's own work; its process starts come on top), leaving no process."""
    t0 = time.monotonic()
    code, output = finish(proc, timeout=bound(limit_s))
    took = time.monotonic() - t0
    deadline = time.monotonic() + bound(5, starts=0) + process_start_s()  # the last processes are being reaped
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_pids(proc.pid), f"left running: {session_pids(proc.pid)}\n{output[-3000:]}"
    return code, output, took


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("ERROR:")]


@pytest.mark.parametrize("nproc, plant_rank", [(2, "1"), (0, "0")], ids=["multiproc-rank1", "python-train.py"])
def test_a_bug_in_the_models_forward_ends_the_job_with_one_error_line(corpus, tmp_path, nproc, plant_rank):
    out = tmp_path / "out"
    code, output, took = ended_fast(start(out, corpus, IN_FORWARD, nproc=nproc, PLANT_RANK=plant_rank))
    assert code != 0 and took < bound(60), output
    lines = error_lines(output)
    assert len(lines) == 1, output
    if nproc:  # rank 1's log is a file, with the traceback; the console says why it failed
        assert f"rank {plant_rank} failed (exit code 1): rank {plant_rank}: TypeError: " in output, output
        output = (out / "logs" / f"rank_{plant_rank}.stderr.log").read_text()
    assert "Traceback" in output and "planted in forward" in output  # the user's bug, with where it happened
    if nproc:
        assert "ERROR: rank 1: TypeError: " in output and "last checkpoint: none yet" in output, output
    else:
        assert lines[0].startswith("ERROR: rank 0: TypeError: ") and "last checkpoint: none yet" in lines[0], lines


@pytest.mark.parametrize("where, nproc", [("getitem", 2), ("collate", 0)], ids=["getitem", "collate"])
def test_a_bug_in_data_code_run_by_workers_ends_the_job_with_one_error_line(corpus, tmp_path, where, nproc):
    """Both run in DataLoader workers and reach the rank as the same worker error; the job with ranks to end is the
    ``__getitem__`` one (``multiproc.py`` on 2 processes), the collate function's is a plain ``python train.py``."""
    out = tmp_path / "out"
    code, output, took = ended_fast(start(out, corpus, f"WHERE = {where!r}\n" + IN_DATA, nproc=nproc))
    assert code != 0 and took < bound(12), (took, output)  # the failed rank's workers end at once, not 5 s each
    lines = error_lines(output)
    assert len(lines) == 1 and "KeyError" in lines[0], output
    assert f"planted in {'__getitem__' if where == 'getitem' else 'collate'}" in output, output


def test_a_full_disk_at_a_checkpoint_ends_the_job_and_keeps_the_earlier_checkpoint(corpus, tmp_path):
    out = tmp_path / "out"
    code, output, took = ended_fast(start(out, corpus, FULL_DISK))
    assert code != 0 and took < bound(60), output
    lines = error_lines(output)
    assert len(lines) == 1, output
    assert "could not write the step 8 checkpoint" in lines[0] and "No space left on device" in lines[0], lines
    assert "earlier checkpoints are kept (checkpoint_last.pt, checkpoint_4.pt)" in lines[0], lines
    assert "Traceback" not in output, output  # an expected failure: no traceback to read
    assert not list(out.glob(".checkpoint_*")), "no temporary file is left"
    assert sorted(p.name for p in out.glob("checkpoint_*.pt")) == ["checkpoint_4.pt", "checkpoint_last.pt"]
    assert torch.load(out / "checkpoint_last.pt", weights_only=True)["step"] == 4
    assert not (out / LOCK_NAME).exists()
    # With space again, the same command continues from step 4.
    code, output, _ = ended_fast(start(out, corpus, None), limit_s=240)
    assert code == 0 and "resumed from" in output and "at step 4" in output, output


def test_an_output_folder_too_full_for_a_checkpoint_is_one_error_line_at_start_up(corpus, tmp_path):
    """Under ``multiproc.py`` (which gives the ranks its grace period) rank 0 times a test write at start-up: on a full
    disk that is the first write to fail, said as one line, before any step. Rank 0 alone does it: one process."""
    out = tmp_path / "out"
    code, output, took = ended_fast(start(out, corpus, FULL_AT_START, nproc=1))
    assert code != 0 and "Traceback" not in output, output
    lines = error_lines(output)
    assert len(lines) == 1 and lines[0].startswith(f"ERROR: rank 0: cannot write a checkpoint into {out}: No space "
                                                   "left on device (a test write of "), output
    assert not (out / "metrics.jsonl").read_text() and not list(out.glob("checkpoint_*")), output


def test_a_second_run_into_a_busy_output_folder_is_refused(corpus, tmp_path):
    """Two plain ``python train.py`` runs: the lock is rank 0's alone, whatever launched it."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    first = start(out, corpus, HOLD, nproc=0, HOLD=str(hold))
    deadline = time.monotonic() + bound(60)
    while not (out / LOCK_NAME).exists() or not (out / LOCK_NAME).read_text():
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
        time.sleep(0.2)
    holder = (out / LOCK_NAME).read_text()
    code, output, _ = ended_fast(start(out, corpus, None, nproc=0))
    lines = error_lines(output)
    assert code != 0 and len(lines) == 1, output
    assert f"{out} is in use by another run ({holder.strip()})" in lines[0], lines
    assert first.poll() is None, "the first run is still training"
    hold.unlink()
    code, output, _ = ended_fast(first, limit_s=240)
    assert code == 0, output
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13)), "the first run's log is its own"
    assert not (out / LOCK_NAME).exists()


def test_the_lock_of_a_dead_run_is_taken_over_with_a_note(tmp_path):
    (tmp_path / LOCK_NAME).write_text("pid 999999 on elsewhere, started 2026-01-01 00:00:00\n")
    lock = RunLock(tmp_path)
    note = lock.acquire()
    assert note is not None and "no longer running (pid 999999 on elsewhere" in note
    assert f"pid {os.getpid()} " in (tmp_path / LOCK_NAME).read_text()
    # Taken over, it is held like any other: another acquirer is refused (flock: a second open file of this same
    # process is refused as another process would be; two real runs: the busy-folder test above).
    with pytest.raises(CheckpointError, match=r"is in use by another run \(pid "):
        RunLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    assert RunLock(tmp_path).acquire() is None  # a cleanly released folder: no note


def test_launching_a_finished_run_again_says_there_is_nothing_to_train(corpus, tmp_path):
    """The run is trained in this process (:func:`conftest.train_in_process`: train.py's own code, without a start-up),
    then ``python train.py`` is launched again with the same arguments."""
    out = tmp_path / "out"
    short = ["--max-steps", "2", "--set", "data.num_workers=0"]
    train_in_process([*ARGS, "--dataset-path", str(corpus), "--output-dir", str(out), *short])
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("checkpoint_*.pt")}
    code, output, _ = ended_fast(start(out, corpus, None, *short, nproc=0), limit_s=240)
    assert code == 0, output
    assert "nothing to train" in output and "train.max_steps is 2" in output and "--max-steps 4" in output, output
    assert "done:" not in output
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("checkpoint_*.pt")} == before
