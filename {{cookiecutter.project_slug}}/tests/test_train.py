"""train.py under real launches: 2 gloo processes on the CPU, exact resume, signals, restarts, faults.

The reference run trains the tiny config for 12 steps with a checkpoint every 4 steps; the other runs
are stopped, killed or resumed part-way and must end with exactly the same weights.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import train
from conftest import ROOT, TEST_MODEL, clean_env, rank_pids, synth_corpus
from model import MODELS

MODEL = TEST_MODEL
STEPS = 12
COMMON = ["--config", "config.json", "--model", MODEL, "--tiny", "--max-steps", str(STEPS),
          "--set", "train.log_interval=1", "--set", "train.checkpoint_interval=4", "--set", "train.keep_last=0",
          "--set", "train.val_interval=100", "--set", "data.num_workers=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("corpus"), n=30)


def launch(out, corpus, *extra, nproc=2, restarts=0):
    """Start ``multiproc.py train.py`` on ``nproc`` processes (returns the Popen)."""
    cmd = [sys.executable, "multiproc.py", "--nproc-per-node", str(nproc), "--max-restarts", str(restarts),
           "--log-dir", str(out / "logs"), "train.py", *COMMON, "--dataset-path", str(corpus),
           "--output-dir", str(out), *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(nproc), start_new_session=True)


def finish(proc, timeout=300):
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, output


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def wait_for_step(out, step, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").exists() and any(r["step"] >= step for r in rows(out)):
            return
        assert proc.poll() is None, f"run ended early:\n{proc.stdout.read()}"
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def final_weights(out):
    state = torch.load(out / "checkpoint_last.pt", weights_only=True)
    assert state["step"] == STEPS
    return state["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs by {(a[key] - b[key]).abs().max()}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("reference")
    code, output = finish(launch(out, corpus))
    assert code == 0, output
    return out


def test_two_processes_train_and_only_rank0_writes(reference):
    metrics = rows(reference)
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    assert metrics[-1]["loss"] < metrics[0]["loss"], [r["loss"] for r in metrics]
    assert {p.name for p in reference.glob("checkpoint_*.pt")} == {
        "checkpoint_4.pt", "checkpoint_8.pt", "checkpoint_12.pt", "checkpoint_last.pt"}
    assert len(list((reference / "tensorboard").glob("events.*"))) == 1
    state = torch.load(reference / "checkpoint_last.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state["model"]), "checkpoints hold the unwrapped model"
    assert len(state["rng"]) == 2 and state["torch_version"] == str(torch.__version__)
    for key in ("optimizer", "scheduler", "scaler", "epoch", "batch_in_epoch", "config", "data_seed"):
        assert key in state


def test_resume_from_a_mid_epoch_checkpoint_repeats_the_run_exactly(reference, corpus, tmp_path):
    state = torch.load(reference / "checkpoint_4.pt", weights_only=True)
    assert state["batch_in_epoch"] > 0, "the checkpoint must sit inside an epoch for this test to mean anything"
    shutil.copy(reference / "checkpoint_4.pt", tmp_path / "checkpoint_last.pt")
    code, output = finish(launch(tmp_path, corpus, "--resume", "auto"))
    assert code == 0, output
    assert "resumed from" in output
    # Same loss at every later step: gloo sums two values per element, so the order cannot differ.
    ref_loss = {r["step"]: r["loss"] for r in rows(reference)}
    resumed = rows(tmp_path)
    assert [r["step"] for r in resumed] == list(range(5, STEPS + 1))
    for r in resumed:
        assert r["loss"] == ref_loss[r["step"]], (r["step"], r["loss"], ref_loss[r["step"]])
    assert_same_weights(final_weights(tmp_path), final_weights(reference))


def test_sigterm_on_one_rank_saves_and_resume_matches(reference, corpus, tmp_path):
    proc = launch(tmp_path, corpus)
    wait_for_step(tmp_path, 2, proc)
    os.kill(rank_pids(proc.pid)[1], signal.SIGTERM)  # rank 1 alone: the ranks must agree to stop
    code, output = finish(proc)
    assert code == 0, output
    assert "stopped at step" in output and "resume" in output
    stopped = torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["step"]
    assert 2 <= stopped < STEPS
    code, output = finish(launch(tmp_path, corpus, "--resume", "auto"))
    assert code == 0, output
    assert_same_weights(final_weights(tmp_path), final_weights(reference))


def test_a_killed_worker_is_restarted_and_the_run_finishes(reference, corpus, tmp_path):
    proc = launch(tmp_path, corpus, restarts=1)
    wait_for_step(tmp_path, 6, proc)  # past the checkpoint of step 4
    os.kill(rank_pids(proc.pid)[1], signal.SIGKILL)
    code, output = finish(proc)
    assert code == 0, output
    assert "resumed from" in output
    assert_same_weights(final_weights(tmp_path), final_weights(reference))


def run_single(capsys, tmp_path, corpus, *extra):
    """``train.main`` in this process, one process, no launcher: (exit code, stdout, stderr)."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        code = train.main([*COMMON, "--set", "data.num_workers=0", "--dataset-path", str(corpus),
                           "--output-dir", str(tmp_path), *extra])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def nan_loss(monkeypatch):
    """The model under test with a criterion that returns NaN from the step given in the test on."""
    spec = MODELS[MODEL]
    calls = {"step": 0, "nan_from": 1}

    def build_criterion(cfg):
        criterion = spec.build_criterion(cfg)

        def poisoned(outputs, batch):
            loss = criterion(outputs, batch)
            if torch.is_grad_enabled():  # a training step, not validation
                calls["step"] += 1
                if calls["step"] >= calls["nan_from"]:
                    return loss * float("nan")
            return loss
        return poisoned
    monkeypatch.setitem(MODELS, MODEL, dataclasses.replace(spec, build_criterion=build_criterion))
    return calls


def test_non_finite_loss_stops_with_step_and_utterance_ids(capsys, nan_loss, corpus, tmp_path):
    nan_loss["nan_from"] = 3
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_nonfinite=stop",
                                "--set", "train.checkpoint_interval=2")
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "step 3: non-finite loss" in errors[0] and "SYN-" in errors[0], err
    assert f"last good checkpoint: {tmp_path / 'checkpoint_last.pt'}" in errors[0]
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["step"] == 2


def test_non_finite_loss_steps_are_skipped_and_counted(capsys, nan_loss, corpus, tmp_path):
    nan_loss["nan_from"] = 2
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_nonfinite=skip", "--max-steps", "4",
                                "--set", "train.checkpoint_interval=1")
    assert code == 0, err
    assert rows(tmp_path)[-1]["skipped_steps"] == 3
    anomalies = [json.loads(line) for line in (tmp_path / "anomalies.jsonl").read_text().splitlines()]
    assert [a["step"] for a in anomalies] == [2, 3, 4] and all(a["kind"] == "nonfinite" and a["ids"]
                                                                 for a in anomalies)
    after_one = torch.load(tmp_path / "checkpoint_1.pt", weights_only=True)["model"]
    last = torch.load(tmp_path / "checkpoint_4.pt", weights_only=True)["model"]
    assert_same_weights(last, after_one)  # no update was applied after step 1
    first = rows(tmp_path)[0]
    assert first["step"] == 1 and first["loss"] == first["loss"]  # step 1 trained, with a finite loss
