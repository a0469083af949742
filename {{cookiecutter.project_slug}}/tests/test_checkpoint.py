"""Tests of utils/checkpoint.py: atomic writes, pruning, SIGKILL in the middle of a save, refusal of pickled
code, damaged files, and strict model loading that names what does not fit."""

import builtins
import errno
import io
import os
import pickle
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import bound, clean_env, flip_tensor_bytes
from torch import nn

from distributed import DistInfo
from models import MODELS
from parts import PARTS, TrainConfig
from utils.checkpoint.checkpointer import Checkpointer, Resumed
from utils.checkpoint.files import (CheckpointError, atomic_write_bytes, intact, load_checkpoint, load_model_state,
                                    remove_stale_temporaries)
from utils.checkpoint import state as checkpoint_state
from utils.checkpoint.names import list_checkpoints
from utils.checkpoint.resume import config_changes, resume_path
from utils.checkpoint.state import RngStates, capture_rng_state, restore_rng_state, save_checkpoint, takes_links
from utils.checkpoint.weights import read_weights
from utils.config import Config, ModelSection
from utils.train_state import TrainState
from utils.training.ema import EMA


def state_of(step: int) -> dict:
    return {"model": {"w": torch.full((4,), float(step))}, "step": step}


def names(folder) -> set:
    return {p.name for p in folder.iterdir()}


def temporaries(folder) -> list:
    return sorted(folder.glob(".*.tmp*"))


# --- atomic writes ----------------------------------------------------------------------------------------

def test_atomic_write_swaps_in_a_new_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old content")
    with open(path, "rb") as reader:  # a reader of the old file keeps seeing it whole: the file was replaced,
        atomic_write_bytes(path, b"new")  # not truncated and rewritten in place
        assert reader.read() == b"old content"
    assert path.read_bytes() == b"new"
    assert names(tmp_path) == {"f.bin"}


def test_a_failed_atomic_write_keeps_the_old_file_and_cleans_up(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old content")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # fails inside the write, after the temporary was created
    assert path.read_bytes() == b"old content"
    assert names(tmp_path) == {"f.bin"}


# --- save_checkpoint and keep_last ------------------------------------------------------------------------

def test_save_writes_numbered_and_last_and_they_load(tmp_path):
    path = save_checkpoint(tmp_path, state_of(7), 7)
    assert path == tmp_path / "checkpoint_7.pt"
    assert names(tmp_path) == {"checkpoint_7.pt", "checkpoint_last.pt"}
    for name in ("checkpoint_7.pt", "checkpoint_last.pt"):
        loaded = load_checkpoint(tmp_path / name)
        assert loaded["step"] == 7 and torch.equal(loaded["model"]["w"], torch.full((4,), 7.0))


def test_a_save_writes_its_bytes_once_and_checkpoint_last_links_to_them(tmp_path, monkeypatch):
    written = []

    def counting(path, data):
        written.append((os.path.basename(path), len(data)))
        return atomic_write_bytes(path, data)
    monkeypatch.setattr(checkpoint_state, "atomic_write_bytes", counting)
    for step in (3, 4):
        path = save_checkpoint(tmp_path, state_of(step), step)
        last = tmp_path / "checkpoint_last.pt"
        assert last.is_symlink() and os.readlink(last) == f"checkpoint_{step}.pt"  # relative: the folder may move
        assert os.path.samefile(last, path) and load_checkpoint(last)["step"] == step
        assert written == [(path.name, path.stat().st_size)], written  # one file's bytes, no copy
        written.clear()
    assert not temporaries(tmp_path)


def test_keep_last_keeps_the_newest_numbered_ones_and_last(tmp_path):
    (tmp_path / "checkpoint_best.pt").write_bytes(b"mine")  # not numbered: never touched
    (tmp_path / "checkpoint_2.pt.bak").write_bytes(b"mine")
    (tmp_path / "notes.txt").write_text("mine")
    for step in (1, 2, 3, 10, 20, 30):
        save_checkpoint(tmp_path, state_of(step), step, keep_last=3)
    assert names(tmp_path) == {"checkpoint_10.pt", "checkpoint_20.pt", "checkpoint_30.pt", "checkpoint_last.pt",
                               "checkpoint_best.pt", "checkpoint_2.pt.bak", "notes.txt"}
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_10.pt", "checkpoint_20.pt",
                                                            "checkpoint_30.pt"]  # by step, not by name
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == 30


def test_keep_last_zero_keeps_all(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, state_of(step), step, keep_last=0)
    assert len(list_checkpoints(tmp_path)) == 5


def test_the_checkpoint_just_written_is_kept_among_higher_older_steps(tmp_path):
    for step in (50, 60):  # an earlier run's checkpoints
        save_checkpoint(tmp_path, state_of(step), step, keep_last=2)
    path = save_checkpoint(tmp_path, state_of(5), 5, keep_last=2)
    assert path.exists() and load_checkpoint(path)["step"] == 5
    assert names(tmp_path) == {"checkpoint_5.pt", "checkpoint_60.pt", "checkpoint_last.pt"}
    assert os.readlink(tmp_path / "checkpoint_last.pt") == "checkpoint_5.pt"


def test_pruning_never_removes_the_file_checkpoint_last_names(tmp_path):
    for step in (50, 60, 5, 6, 7):  # an earlier run's higher steps first
        save_checkpoint(tmp_path, state_of(step), step, keep_last=1)
        assert os.readlink(tmp_path / "checkpoint_last.pt") == f"checkpoint_{step}.pt"
        assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == step
    assert names(tmp_path) == {"checkpoint_7.pt", "checkpoint_last.pt"}


def test_a_folder_that_refuses_links_gets_a_copy_and_one_note(tmp_path, monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))
    monkeypatch.setattr(os, "symlink", refused)
    monkeypatch.setattr(checkpoint_state, "_copying", set())  # a fresh run
    assert not takes_links(tmp_path)  # the start-up grace-period estimate counts the copy's bytes too
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, state_of(step), step, keep_last=2)
        last = tmp_path / "checkpoint_last.pt"
        assert not last.is_symlink() and load_checkpoint(last)["step"] == step
        assert last.read_bytes() == (tmp_path / f"checkpoint_{step}.pt").read_bytes()
    assert names(tmp_path) == {"checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_last.pt"}
    notes = capsys.readouterr().err.splitlines()
    assert notes == [f"note: {tmp_path} takes no symbolic links (Operation not permitted): checkpoint_last.pt is "
                     "written as a copy of each checkpoint, twice the bytes a save makes durable"], notes
    monkeypatch.undo()
    assert takes_links(tmp_path) and not temporaries(tmp_path)


def test_a_dangling_checkpoint_last_falls_back_to_the_newest_intact_numbered_one(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, state_of(step), step)
    (tmp_path / "checkpoint_3.pt").unlink()  # removed by hand: the link names nothing
    path, notes = resume_path("auto", tmp_path, PARTS.formats)
    assert path == tmp_path / "checkpoint_2.pt", (path, notes)
    assert notes == [f"warning: {tmp_path / 'checkpoint_last.pt'} names checkpoint_3.pt, which is gone: resuming "
                     f"from {tmp_path / 'checkpoint_2.pt'}, the newest intact checkpoint"], notes
    for step in (1, 2):
        (tmp_path / f"checkpoint_{step}.pt").unlink()
    with pytest.raises(CheckpointError) as info:  # nothing left to resume from: not a silent start at step 0
        resume_path("auto", tmp_path, PARTS.formats)
    assert str(info.value) == (f"{tmp_path / 'checkpoint_last.pt'} names checkpoint_3.pt, which is gone; move it "
                               "aside or pass --resume PATH")
    with pytest.raises(CheckpointError, match="already holds checkpoints"):
        resume_path("none", tmp_path, PARTS.formats)


def test_a_state_that_could_not_be_loaded_back_is_not_written(tmp_path):
    save_checkpoint(tmp_path, state_of(1), 1)
    before = (tmp_path / "checkpoint_last.pt").read_bytes()
    with pytest.raises(CheckpointError, match=r"refusing to write .*checkpoint_2.pt: .*numpy"):
        save_checkpoint(tmp_path, {**state_of(2), "loss": np.float64(0.5)}, 2)
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before
    assert names(tmp_path) == {"checkpoint_1.pt", "checkpoint_last.pt"}


def test_temporaries_of_dead_processes_are_removed_by_the_next_save(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # its pid names a process that has ended
    dead.wait()
    alive = os.getppid()
    (tmp_path / f".checkpoint_last.pt.tmp{dead.pid}").write_bytes(b"x" * 100)
    (tmp_path / f".checkpoint_9.pt.tmp{alive}").write_bytes(b"x")  # a live writer's: left alone
    (tmp_path / ".checkpoint_9.pt.tmpXYZ").write_bytes(b"x")  # not ours: left alone
    assert remove_stale_temporaries(tmp_path) == [tmp_path / f".checkpoint_last.pt.tmp{dead.pid}"]
    save_checkpoint(tmp_path, state_of(1), 1)
    assert {p.name for p in temporaries(tmp_path)} == {f".checkpoint_9.pt.tmp{alive}", ".checkpoint_9.pt.tmpXYZ"}


# --- SIGKILL in the middle of a save ----------------------------------------------------------------------

# Imports torch once, then for each start step read from stdin forks a writer that saves a ~25 MB state in
# a loop (announcing each save before and after) until the test SIGKILLs it. Each line is one write(2), which a kill
# cannot cut: print writes a line's text and its newline apart (the output is unbuffered), and a kill between the two
# once glued the parent's "reaped" to the child's last words, leaving the test waiting for a line that never came.
WRITER = textwrap.dedent('''
    import os, sys
    import torch
    from utils.checkpoint.state import save_checkpoint

    def say(text):
        os.write(1, f"{text}\\n".encode())

    out = sys.argv[1]
    for line in sys.stdin:
        step = int(line)
        pid = os.fork()
        if pid == 0:
            try:
                payload = torch.empty(6_250_000)  # 25 MB of float32
                while True:
                    step += 1
                    payload.fill_(float(step))
                    say(f"begin {step}")
                    save_checkpoint(out, {"model": {"w": payload}, "step": step}, step, keep_last=2)
                    say(f"saved {step}")
            finally:
                os._exit(1)
        say(f"pid {pid}")
        os.waitpid(pid, 0)
        say(f"reaped {pid}")
''')


def process_state(pid: int) -> str:
    """What ``/proc`` says of a process (its state and the kernel function it waits in), for a hang's message."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as err:
        return f"pid {pid}: {err.strerror}"
    return f"pid {pid}: state {stat[stat.rfind(')') + 2]}, waiting in {wchan or '-'}"


@pytest.mark.slow
def test_sigkill_in_the_middle_of_saves_leaves_checkpoint_last_loadable(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.Popen([sys.executable, str(script), str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(1))
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True).start()

    def next_line(seen=(), pid=None):
        # A guard against a hang, not a speed test; the machine's measured process starts scale it.
        timeout = bound(240, 1)
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            states = "; ".join(process_state(p) for p in (proc.pid, pid) if p is not None)
            raise AssertionError(f"the writer said nothing for {timeout:.0f} s after {list(seen)[-4:]}: {states}") \
                from None

    rng = random.Random(20240607)
    delays, killed_mid_save = [], 0
    try:
        for round_ in range(24):  # each lands in a write of the file now and then: a torn one shows within 24
            proc.stdin.write(f"{round_ * 1000}\n")
            proc.stdin.flush()
            seen = [next_line()]  # the writer's "pid N" and its child's first lines, in either order
            while not seen[-1].startswith("pid "):
                seen.append(next_line(seen))
            pid = int(seen[-1].split()[1])
            while not any(line.startswith("saved") for line in seen):  # one whole save first, to have one to keep
                seen.append(next_line(seen, pid))
            delays.append(rng.uniform(0.0, 0.25))
            time.sleep(delays[-1])
            os.kill(pid, signal.SIGKILL)
            while seen[-1] != f"reaped {pid}":
                seen.append(next_line(seen, pid))
            saved = max(int(s.split()[1]) for s in seen if s.startswith("saved"))
            begun = max(int(s.split()[1]) for s in seen if s.startswith("begin"))
            killed_mid_save += begun > saved

            state = load_checkpoint(out / "checkpoint_last.pt")
            context = f"round {round_}, killed {delays[-1]:.2f} s after a save; saved {saved}, begun {begun}"
            assert state["step"] in (saved, begun), context  # the last finished save, or the one in flight
            assert torch.equal(state["model"]["w"], torch.full((6_250_000,), float(state["step"]))), context
            for path in list_checkpoints(out):  # numbered ones are written the same way
                assert load_checkpoint(path)["step"] == int(path.stem.split("_")[1]), context
            assert len(temporaries(out)) <= 1, f"{context}: {temporaries(out)}"  # older ones were cleaned up
    finally:
        proc.kill()
        proc.wait()
    assert killed_mid_save >= 1, f"no kill landed inside a save (delays {delays}): the test proved nothing"


# --- refusing pickled code --------------------------------------------------------------------------------

class OpensAFile:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


class RunsAShell:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload, global_name", [(OpensAFile, "open"), (RunsAShell, "posix.system")])
@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_a_checkpoint_holding_code_is_refused_and_never_run(tmp_path, payload, global_name, container):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    state = {"model": {"w": torch.zeros(2)}, "step": 1, "extra": payload(marker)}
    if container == "torch.save":
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, legacy=PARTS.formats.legacy)
    message = str(info.value)
    refused = (f"{path} {OLD_FORMAT}" if container == "pickle" and PARTS.formats.published is None
               else f"cannot load checkpoint {path} safely: refused by weights_only=True, nothing was run: ")
    assert message.startswith(refused), message
    assert "\n" not in message and "allowlist" not in message and "Please use" not in message, message
    if container == "torch.save":
        assert f"GLOBAL {global_name}" in message or f".{global_name}" in message, message  # names what was refused
    assert not marker.exists(), "the payload ran"
    # The payload is live: an unsafe load does run it (this is what weights_only=True prevents).
    if container == "torch.save":
        torch.load(path, weights_only=False)
    else:
        pickle.loads(path.read_bytes())
    assert marker.exists()


OLD_FORMAT = ("is in PyTorch's old format (a pickle, before 1.6), which this project reads only with the after-training "
              "tools: refused, nothing was run")


def test_a_file_of_pytorchs_old_format_holding_code_is_refused_by_every_loader(tmp_path):
    """A file of PyTorch's format before 1.6 (a pickle stream) holding code: with the after-training tools (its reader)
    refused by what it holds, without them refused unread in one line (``--resume PATH``'s check too); never run."""
    marker, path = tmp_path / "pwned", tmp_path / "old.pt"
    state = {"model": {"w": torch.zeros(2)}, "step": 1, "extra": OpensAFile(marker)}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    loads = {"": lambda file: load_checkpoint(file, legacy=PARTS.formats.legacy),
             "--init-from ": lambda file: read_weights(file, MODELS, None, formats=PARTS.formats),
             "--resume ": lambda file: resume_path(str(file), tmp_path, PARTS.formats)}
    for label, load in loads.items():
        if PARTS.formats.published is not None and label == "--resume ":
            continue  # sound by its sizes: what it holds is refused when it is loaded, as above
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert message.startswith(label) and str(path) in message and "\n" not in message, message
        assert "nothing was run" in message and (PARTS.formats.published is not None or message.endswith(OLD_FORMAT))
    assert not marker.exists(), "the payload ran"


# --- damaged or foreign files -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "good.pt"
    random.seed(0), np.random.seed(0), torch.manual_seed(0)  # the same bytes, so the same mutations, every run
    torch.save({"model": nn.Linear(3, 2).state_dict(), "step": 3, "rng": capture_rng_state()}, path)
    return path.read_bytes()


def test_missing_truncated_and_foreign_files_are_named(tmp_path, good_bytes):
    with pytest.raises(CheckpointError, match="checkpoint not found: .*nothing.pt"):
        load_checkpoint(tmp_path / "nothing.pt")
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path)
    cases = {"empty.pt": b"", "text.pt": b"hello\n", "random.pt": bytes(random.Random(0).randbytes(4096))}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "a zip, but not a checkpoint")
    cases["other.zip"] = buffer.getvalue()
    for cut in range(0, len(good_bytes), max(1, len(good_bytes) // 40)):
        cases[f"cut_{cut}.pt"] = good_bytes[:cut]
    neither = "neither a file torch.save writes (a zip archive) nor a pickle"
    said = {"empty.pt": "is not a checkpoint: an empty file", "text.pt": f"is not a checkpoint: a text file: {neither}",
            "random.pt": f"is not a checkpoint: {neither}", "cut_0.pt": "is not a checkpoint: an empty file",
            "other.zip": "is not a checkpoint: a zip archive, but not one torch.save writes (no data.pkl)"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(tmp_path / name)
        message = str(info.value)
        assert message.startswith(f"{tmp_path / name} {said.get(name, 'is damaged (')}"), message  # cut: damaged
        assert "\n" not in message
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="list.pt is not a checkpoint of this project"):
        load_checkpoint(tmp_path / "list.pt")


def test_64_bytes_flipped_inside_a_tensor_are_refused_in_one_line(tmp_path, good_bytes):
    """torch.load itself reads them (the weights change silently); the zip archive's CRC-32 of the record finds them."""
    path = tmp_path / "flipped.pt"
    path.write_bytes(good_bytes)
    record = flip_tensor_bytes(path)
    assert torch.load(path, weights_only=True)["model"]["weight"].shape == (2, 3)  # what a load without the check gets
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (f"{path} is damaged (its record {record} fails its CRC-32 check: its bytes changed "
                               "after it was written)")


def test_a_failed_atomic_write_names_the_file_asked_for_not_its_temporary(tmp_path):
    (tmp_path / "a_file").write_text("mine")
    # A missing folder; a file in the folder's place, where even the temporary's cleanup fails (as on a read-only
    # folder: EROFS), which must not hide the error.
    for target in (tmp_path / "gone" / "model.pt", tmp_path / "a_file" / "model.pt"):
        with pytest.raises(OSError) as info:
            atomic_write_bytes(target, b"x")
        assert info.value.filename == str(target) and ".tmp" not in str(info.value), info.value


def test_a_full_disk_between_the_two_files_of_a_save_names_what_was_written(tmp_path, monkeypatch):
    """The numbered file is written, then the disk fills making the ``checkpoint_last.pt`` link (ENOSPC)."""
    save_checkpoint(tmp_path, state_of(4), 4)

    def full_at_last(target, link, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "symlink", full_at_last)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, state_of(10), 10)
    assert str(info.value) == (f"could not write the step 10 checkpoint in {tmp_path}: No space left on device "
                               "(checkpoint_10.pt written, checkpoint_last.pt not); earlier checkpoints are kept "
                               "(checkpoint_last.pt, checkpoint_4.pt)")
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["step"] == 4
    assert not temporaries(tmp_path)


def test_a_file_that_is_no_zip_archive_is_not_called_cut_short(tmp_path, good_bytes):
    cut_short = "damaged (cut short: the zip archive's directory is missing)"
    cases = {"cut.pt": (good_bytes[:len(good_bytes) // 2], cut_short),
             "legacy.pt": (b"\x80\x02" + bytes(100), "not a checkpoint: not a zip archive, as torch.save writes"),
             "text.pt": (b"hello", "not a checkpoint: not a zip archive, as torch.save writes"),
             "empty.pt": (b"", "not a checkpoint: an empty file")}
    for name, (data, said) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert intact(tmp_path / name) == said, name


def test_a_corrupted_pickle_is_a_checkpoint_error_or_loads(tmp_path, good_bytes):
    """Random byte changes in the pickled part: whatever torch's unpickler raises becomes a CheckpointError."""
    with zipfile.ZipFile(io.BytesIO(good_bytes)) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    pkl_name = next(name for name in members if name.endswith("data.pkl"))
    rng = random.Random(7)
    kinds = set()
    model = nn.Linear(3, 2)
    for _ in range(400):
        data = bytearray(members[pkl_name])
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, content in members.items():
                archive.writestr(name, bytes(data) if name == pkl_name else content)
        path = tmp_path / "mutated.pt"
        path.write_bytes(buffer.getvalue())
        try:
            state = load_checkpoint(path)
            load_model_state(model, state["model"], str(path))
            kinds.add("loaded")
        except CheckpointError as err:
            kinds.add(type(err.__cause__).__name__ if err.__cause__ else "CheckpointError")
    assert len(kinds) >= 3, kinds  # the mutations did reach several of the unpickler's failure modes


# --- load_model_state -------------------------------------------------------------------------------------

def small_net(hidden=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def test_load_model_state_names_missing_unexpected_and_misshapen_keys():
    model = small_net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = small_net(hidden=5).state_dict()  # another config: every tensor of the hidden layer differs
    state["extra.weight"] = torch.zeros(1)
    del state["2.bias"]
    with pytest.raises(CheckpointError) as info:
        load_model_state(model, state, "other.pt")
    assert str(info.value) == ("other.pt does not fit this model: missing: 2.bias; unexpected: extra.weight; "
                               "shape mismatch: 0.bias (5,) vs (4,), 0.weight (5, 3) vs (4, 3), "
                               "2.weight (2, 5) vs (2, 4)")
    for key, value in model.state_dict().items():  # nothing was loaded half-way
        assert torch.equal(value, before[key]), key


def test_load_model_state_shortens_long_lists_and_refuses_non_tensors():
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(4)])
    with pytest.raises(CheckpointError, match=r"missing: 0.bias, 0.weight, 1.bias, 1.weight, 2.bias \(\+3 more\)$"):
        load_model_state(model, {}, "empty.pt")
    with pytest.raises(CheckpointError, match="x.pt: the model state holds entries that are not tensors: a, b"):
        load_model_state(model, {**model.state_dict(), "a": 1, "b": "s"}, "x.pt")
    with pytest.raises(CheckpointError, match="x.pt: its 'model' entry is a list, not a state dict"):
        load_model_state(model, [1], "x.pt")


def test_load_model_state_loads_a_fitting_state():
    model, other = small_net(), nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    load_model_state(other, model.state_dict(), "ok.pt")
    for key, value in model.state_dict().items():
        assert torch.equal(other.state_dict()[key], value)


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path, {"model": {}, "rng": capture_rng_state()}, 1)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    restore_rng_state(load_checkpoint(tmp_path / "checkpoint_last.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_config_changes_are_named_as_config_json_writes_them():
    before = {"train": {"compile": False, "grad_clip": 0.0, "lr_schedule": "constant"}, "data": {"exclude": ()}}
    now = {"train": {"compile": True, "grad_clip": 0.5, "lr_schedule": "cosine"}, "data": {"exclude": ("LJ001",)}}
    assert config_changes(before, now) == ['data.exclude: [] -> ["LJ001"]', "train.compile: false -> true",
                                           "train.grad_clip: 0.0 -> 0.5", "train.lr_schedule: constant -> cosine"]



def test_a_key_newer_than_the_checkpoint_is_no_change_at_its_default(tmp_path, capsys):
    """A checkpoint recorded before a key existed (its config lacks it) resumes without a warning about the key where
    the run keeps its default; a value other than the default is still named."""
    dist, train = DistInfo(0, 0, 1, torch.device("cpu"), None), SimpleNamespace(sharded=False, keep_last=0)
    cfg = Config({"train": TrainConfig(), "tiny": ModelSection()})
    recorded = cfg.to_dict()
    del recorded["train"]["compile"]
    path = Checkpointer(owned_parts(seed=0), tmp_path, dist, train, PARTS.formats).write(
        {"model_name": "tiny", "config": recorded})
    Checkpointer(owned_parts(seed=1), tmp_path, dist, train, PARTS.formats).resume(path, load_checkpoint(path), cfg,
                                                                                     "tiny", 0)
    assert "the config differs" not in capsys.readouterr().err
    cfg.train.compile = True
    Checkpointer(owned_parts(seed=1), tmp_path, dist, train, PARTS.formats).resume(path, load_checkpoint(path), cfg,
                                                                                     "tiny", 0)
    assert "train.compile: unset -> true" in capsys.readouterr().err

# --- the checkpoint owner ---------------------------------------------------------------------------------------------

# The entries of a single-file training checkpoint, in the order of the parts, then the provenance: the names of the
# files written before the Checkpointer took its parts by name (which still resume).
FILE_ENTRIES = ["model", "optimizer", "scheduler", "scaler", "step", "epoch", "batch_in_epoch", "skipped_steps",
                "samples_in_epoch", "skipped_updates", "skips_in_a_row", "rng", "ema", "model_name", "config",
                "grad_accumulation"]


def owned_parts(seed: int) -> dict:
    """A tiny run's named stateful parts, trained one step (each seed gives other weights and moments)."""
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    ema = EMA(model, (), 0.5)
    model(torch.randn(4, 3)).square().sum().backward()
    optimizer.step()
    scheduler.step()
    ema.update()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler,
            "scaler": torch.amp.GradScaler("cpu", enabled=False), "position": TrainState(), "rng": RngStates(),
            "ema": ema}


def same(a, b) -> bool:
    """Whether two (nested) states hold the same values, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_the_checkpointer_writes_the_file_layout_and_puts_every_part_back(tmp_path):
    dist, train = DistInfo(0, 0, 1, torch.device("cpu"), None), SimpleNamespace(sharded=False, keep_last=0)
    parts = owned_parts(seed=0)
    parts["position"].step, parts["position"].epoch, parts["position"].samples_in_epoch = 7, 1, 12
    parts["position"].skipped_updates = {"model": 2}
    path = Checkpointer(parts, tmp_path, dist, train, PARTS.formats).write(
        {"model_name": "tiny", "config": {"train": {}}, "grad_accumulation": 3})
    after_save = torch.rand(3)
    saved = load_checkpoint(path)
    assert path == tmp_path / "checkpoint_7.pt" and list(saved) == FILE_ENTRIES

    fresh = owned_parts(seed=1)
    before = Checkpointer(fresh, tmp_path, dist, train, PARTS.formats).load(path, "tiny")
    assert before == Resumed(world_size=1, grad_accumulation=3, config={"train": {}}, tracker_runs={})
    assert torch.equal(torch.rand(3), after_save)  # this rank's generators, as they were at the save
    assert fresh["position"] == parts["position"]
    for name in ("model", "optimizer", "scheduler", "ema"):
        assert same(fresh[name].state_dict(), parts[name].state_dict()), name
    with pytest.raises(CheckpointError, match="holds a 'tiny' model, not 'other'"):
        Checkpointer(owned_parts(seed=1), tmp_path, dist, train, PARTS.formats).load(path, "other")


def test_a_part_a_checkpoint_lacks_starts_afresh_and_one_that_does_not_fit_is_named(tmp_path, capsys):
    """Every part is put back alike: the EMA of a checkpoint without one restarts from the weights loaded (said on
    stderr); averages of other parameters are one error naming the file and the entry."""
    dist, train = DistInfo(0, 0, 1, torch.device("cpu"), None), SimpleNamespace(sharded=False, keep_last=0)
    saved = load_checkpoint(Checkpointer(owned_parts(seed=0), tmp_path, dist, train, PARTS.formats).write(
        {"model_name": "tiny"}))
    without, other = tmp_path / "without.pt", tmp_path / "other.pt"
    torch.save({key: value for key, value in saved.items() if key != "ema"}, without)
    torch.save({**saved, "ema": {"other": torch.zeros(2)}}, other)
    fresh = owned_parts(seed=1)
    Checkpointer(fresh, tmp_path, dist, train, PARTS.formats).load(without, "tiny")
    assert same(fresh["ema"].state_dict(), saved["model"])
    assert f"note: {without} holds no 'ema' entry" in capsys.readouterr().err
    with pytest.raises(CheckpointError) as info:
        Checkpointer(owned_parts(seed=1), tmp_path, dist, train, PARTS.formats).load(other, "tiny")
    assert str(info.value) == (f"{other}: its 'ema' entry does not fit this run: EMA weights of other parameters "
                               "(missing: bias, weight; unexpected: other)")
