"""train.py under real launches: 2 gloo processes on the CPU, exact resume, signals, restarts, faults.

The reference run trains the tiny config for 12 steps with a checkpoint every 4 steps; the other runs
are stopped, killed or resumed part-way and must end with exactly the same weights.
"""

import dataclasses
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (ROOT, TEST_MODEL, alive, bound, clean_env, descendants, finish, flip_tensor_bytes, free_port,
                      made_once, rank_pids, run_ranks, shared_corpus, start_job, synth_corpus)
from torch.optim.optimizer import register_optimizer_step_post_hook

import train
from models import MODELS
from parts import config_schemas
from utils.config import load_config
from utils.errors import TrainingError
from utils.run_log import RunLog
from utils.training.criterion import loss_and_terms
from utils.training.guards import last_good_checkpoint

pytestmark = pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out


MODEL = TEST_MODEL
STEPS = 12
COMMON = ["--config", "config.json", "--model", MODEL, "--tiny", "--max-steps", str(STEPS),
          "--set", "train.log_interval=1", "--set", "train.checkpoint_interval=4", "--set", "train.keep_last=0",
          "--set", "train.val_interval=100", "--set", "data.num_workers=2",
          # an EMA of the weights: its averages must be saved and resumed exactly with the rest (assert_same_state)
          "--set", "train.ema_decay=0.9"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "train_corpus", 30)


# Every training forward of a job started with this on PYTHONPATH takes 0.25 s more: a job slow enough to be
# signalled or killed in the middle (the numbers it computes do not change).
SLOW_STEPS = """
import time
import torch


def _slow(module, args, output):
    if type(module).__name__ == "DistributedDataParallel" and module.training:
        time.sleep(0.25)


torch.nn.modules.module.register_module_forward_hook(_slow)
"""


def launch(out, corpus, *extra, nproc=2, restarts=0, launcher=(), log_dir=None, torchrun=False, plant=None,
           on_host=None):
    """Start ``multiproc.py [launcher] train.py`` on ``nproc`` processes per node, or plain ``torchrun``
    (returns the Popen, in a session of its own). ``plant``: a ``sitecustomize.py`` every process of the job
    runs first (a planted fault). ``on_host``: the job's processes on this machine, all nodes together (default
    ``nproc``): with fewer GPUs than that, the job runs on the CPU (two ranks cannot share a GPU under NCCL)."""
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    else:
        cmd = [sys.executable, "multiproc.py", "--nproc-per-node", str(nproc), "--max-restarts", str(restarts),
               "--log-dir", str(log_dir or out / "logs"), *launcher]
    cmd += ["train.py", *COMMON, "--dataset-path", str(corpus), "--output-dir", str(out), *extra]
    return start_job(cmd, out, on_host or nproc, plant)


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


def whole_job(proc, timeout=30):
    """The launcher's pid and all its descendants, once the 2 ranks and their 2 DataLoader workers each are all
    running (between epochs the workers are being replaced)."""
    deadline = time.monotonic() + timeout
    while len(job := [proc.pid, *descendants(proc.pid)]) < 1 + 2 + 2 * 2:
        assert proc.poll() is None and time.monotonic() < deadline, f"the job never had all its processes: {job}"
        time.sleep(0.05)
    return job


def final_weights(out):
    """The raw weights and their EMA (``ema.`` keys) of the run's last checkpoint."""
    state = torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["step"] == STEPS
    assert state["ema"].keys() <= state["model"].keys()
    assert any(not torch.equal(state["ema"][key], state["model"][key]) for key in state["ema"]), "the EMA lags"
    return {**state["model"], **{f"ema.{key}": value for key, value in state["ema"].items()}}


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs by {(a[key] - b[key]).abs().max()}"


def assert_same_state(a, b, path="checkpoint"):
    """Two checkpoints hold the same training state: weights, optimizer, RNG, loop position (not provenance)."""
    if isinstance(a, dict):
        keys = a.keys() - {"config", "git_commit", "torch_version"}
        assert keys == b.keys() - {"config", "git_commit", "torch_version"}, path
        for key in keys:
            assert_same_state(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, (path, a, b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """The uninterrupted run, with a checkpoint after every step to compare stopped runs with (one per session)."""
    def run(out):
        code, output = finish(launch(out, corpus, "--set", "train.checkpoint_interval=1"))
        assert code == 0, output
        assert "warning" not in output, output  # a clean run raises no alarm
    return made_once(tmp_path_factory, "train_reference", run)[0]


def test_two_processes_train_and_only_rank0_writes(reference):
    metrics = rows(reference)
    assert [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    assert metrics[-1]["loss"] < metrics[0]["loss"], [r["loss"] for r in metrics]
    assert {p.name for p in reference.glob("checkpoint_*.pt")} == {
        *(f"checkpoint_{step}.pt" for step in range(1, STEPS + 1)), "checkpoint_last.pt"}
    assert len(list((reference / "tensorboard").glob("events.*"))) == 1
    state = torch.load(reference / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in state["model"]), "checkpoints hold the unwrapped model"
    assert len(state["rng"]) == 2 and state["torch_version"] == str(torch.__version__)
    for key in ("optimizer", "scheduler", "scaler", "epoch", "batch_in_epoch", "config", "data_seed"):
        assert key in state


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, reference, corpus):
    """``(folder, output)`` of one ``--resume auto`` run (made once per session) in a folder holding the reference's
    checkpoints 1-4, its ``metrics.jsonl`` of all 12 steps and its ``checkpoint_last.pt`` (step 12) damaged: it falls
    back to ``checkpoint_4.pt``, a checkpoint inside an epoch, and trains steps 5-12 again."""
    def run(out):
        for step in range(1, 5):
            shutil.copy(reference / f"checkpoint_{step}.pt", out)
        shutil.copy(reference / "checkpoint_last.pt", out)
        flip_tensor_bytes(out / "checkpoint_last.pt")
        shutil.copy(reference / "metrics.jsonl", out)
        code, output = finish(launch(out, corpus, "--resume", "auto"))
        assert code == 0, output
        return output
    folder, output = made_once(tmp_path_factory, "train_resumed", run)
    return folder, output


def test_resume_from_a_mid_epoch_checkpoint_repeats_the_run_exactly(reference, resumed):
    folder, output = resumed
    state = torch.load(reference / "checkpoint_4.pt", map_location="cpu", weights_only=True)
    assert state["batch_in_epoch"] > 0, "the checkpoint must sit inside an epoch for this test to mean anything"
    assert f"resumed from {folder / 'checkpoint_4.pt'} at step 4 " in output, output
    # Same loss at every later step: gloo sums two values per element, so the order cannot differ. (The first run's
    # rows after step 4 are removed as the resume starts: test_a_fallback_resume...; these are the steps trained again.)
    ref_loss = {r["step"]: r["loss"] for r in rows(reference)}
    resumed_rows = rows(folder)[4:]
    assert [r["step"] for r in resumed_rows] == list(range(5, STEPS + 1))
    for r in resumed_rows:
        assert r["loss"] == ref_loss[r["step"]], (r["step"], r["loss"], ref_loss[r["step"]])
    assert_same_weights(final_weights(folder), final_weights(reference))


def test_a_fallback_resume_keeps_one_metrics_row_per_step_with_the_reference_losses(reference, resumed):
    """``--resume auto`` past a damaged ``checkpoint_last.pt`` to ``checkpoint_4.pt``: steps 5-12 are trained again, and
    their rows of the first run (in ``metrics.jsonl``, TensorBoard) go, said in one line; the earlier rows stay."""
    folder, output = resumed
    assert f"resuming from {folder / 'checkpoint_4.pt'}, the newest intact checkpoint" in output, output
    assert "note: metrics.jsonl: 8 row(s) after step 4, the step resumed from, removed" in output, output
    assert [(r["step"], r["loss"]) for r in rows(folder)] == [(r["step"], r["loss"]) for r in rows(reference)]


def test_an_option_and_a_set_of_the_same_setting_are_refused_in_one_line(capsys, tmp_path):
    code = train.main(["--set", "train.max_steps=-1", "--max-steps", "2", "--output-dir", str(tmp_path / "out")])
    assert code == 2 and capsys.readouterr().err == (
        "ERROR: --max-steps and --set train.max_steps=-1 both set train.max_steps; give one\n")
    assert not (tmp_path / "out").exists()


def signal_every_process(pid, sig):
    """What scancel or a SLURM time limit does: the signal to every process of the job step (the launcher, the
    ranks, their DataLoader workers), whatever their process groups."""
    for each in [pid, *descendants(pid)]:
        try:
            os.kill(each, sig)
        except ProcessLookupError:  # a DataLoader worker that ended since it was listed (an epoch ended)
            pass


# How a job is stopped in real life: the launcher alone (kill PID, torchrun's agent), every process of the
# job (scancel, a time limit), a terminal's Ctrl-C (SIGINT to the foreground process group: the launcher;
# torchrun starts each rank in a session of its own), or one rank alone: every rank stops at the same step.
STOPS = {"sigterm-rank1": (lambda pid: os.kill(rank_pids(pid)[1], signal.SIGTERM), 0, "another rank’s signal"),
         "sigterm-launcher": (lambda pid: os.kill(pid, signal.SIGTERM), 0, "SIGTERM"),
         "sigterm-every-process": (lambda pid: signal_every_process(pid, signal.SIGTERM), 0, "SIGTERM"),
         "ctrl-c": (lambda pid: os.killpg(pid, signal.SIGINT), 130, "SIGINT")}


@pytest.mark.parametrize("how", STOPS)
def test_a_stopped_job_saves_says_how_to_resume_and_leaves_nothing(reference, corpus, tmp_path, how):
    send, expected_code, name = STOPS[how]
    proc = launch(tmp_path, corpus, plant=SLOW_STEPS)
    wait_for_step(tmp_path, 3, proc)
    job = whole_job(proc)
    send(proc.pid)
    code, output = finish(proc)
    ended = time.monotonic()
    rank_logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*"))
    assert code == expected_code, output
    assert "Traceback" not in output + rank_logs, output + rank_logs
    stopped = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"]
    assert 3 <= stopped < STEPS
    hints = [line for line in output.splitlines() if "stopped at step" in line]
    assert hints == [f"stopped at step {stopped} on {name}; resume with the same command (--resume auto reads "
                     f"{tmp_path / 'checkpoint_last.pt'})"], output
    while alive(job) and time.monotonic() < ended + 10:
        time.sleep(0.2)
    assert not alive(job), "processes left 10 s after the launcher ended"
    # The stopped run saved exactly the state the uninterrupted one had at that step (training state, RNG, loop
    # position): resuming from such a state repeats the run exactly (test_resume_from_a_mid_epoch_checkpoint...),
    # and the same command resumes in a folder a stopped job left (test_a_killed_worker_is_restarted...).
    assert_same_state(torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True),
                      torch.load(reference / f"checkpoint_{stopped}.pt", map_location="cpu", weights_only=True))


def test_plain_torchrun_sigterm_saves_and_says_how_to_resume(reference, corpus, tmp_path):
    """torchrun's agent forwards SIGTERM to the ranks (then prints its own SignalException traceback and exits
    1: torchrun's behaviour, not ours); the ranks save the step reached and print the hint."""
    proc = launch(tmp_path, corpus, torchrun=True, plant=SLOW_STEPS)
    wait_for_step(tmp_path, 3, proc)
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    stopped = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"]
    assert f"stopped at step {stopped} on SIGTERM; resume with the same command" in output, output
    assert "train.py" not in "".join(output.split("Traceback")[1:]), "a traceback from train.py"
    assert_same_state(torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True),
                      torch.load(reference / f"checkpoint_{stopped}.pt", map_location="cpu", weights_only=True))


def test_ranks_and_their_workers_die_with_a_killed_launcher(corpus, tmp_path):
    proc = launch(tmp_path, corpus, plant=SLOW_STEPS)
    wait_for_step(tmp_path, 2, proc)
    job = whole_job(proc)
    os.kill(proc.pid, signal.SIGKILL)  # no handler, no forwarding: the ranks must notice on their own
    proc.wait()
    limit = bound(10, starts=1)  # a rank finishes its step and saves; slower on a busy host
    deadline = time.monotonic() + limit
    while alive(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(job), f"orphans left {limit:.0f} s after the launcher was killed"
    proc.communicate()


def test_two_nodes_on_one_host_reach_the_same_loss_as_one_node(reference, corpus, tmp_path):
    """Two ``multiproc.py --nnodes 2`` of one process each on 127.0.0.1: the global batch and the gradient
    all-reduce of the 2-process reference run, so the same loss at every step (gloo sums 2 values exactly)."""
    port = free_port()
    nodes = [launch(tmp_path, corpus, nproc=1, log_dir=tmp_path / f"logs_node{node}", on_host=2,
                    launcher=["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                              "--master-port", str(port), "--rdzv-timeout", "120"]) for node in (1, 0)]
    for proc in nodes:
        code, output = finish(proc)
        assert code == 0, output
    assert [(r["step"], r["loss"]) for r in rows(tmp_path)] == [(r["step"], r["loss"]) for r in rows(reference)]


RAY_WORKER = """
import os
import sys
import threading

import torch.distributed as dist

import train

# What Ray Train does in each worker: its own process group, the rank variables, then the training function in a
# thread of the worker (no MASTER_ADDR/MASTER_PORT needed once the group exists).
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
os.environ.update(LOCAL_WORLD_SIZE="2", NODE_RANK="0")
del os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
result = []
worker = threading.Thread(target=lambda: result.append(train.main(ARGV)))
worker.start()
worker.join()
assert result == [0], result
assert dist.is_initialized(), "the caller's process group was destroyed"
dist.barrier()
dist.destroy_process_group()
print("ray worker done")
"""


def test_the_callable_entry_trains_in_a_process_group_ray_made_like_multiproc(reference, corpus, tmp_path):
    """Ray Train's case: ``train.main(argv)`` called in a thread of each of 2 workers whose gloo group exists
    already: it trains in that group (the reference run's losses), installs no signal handler outside the main
    thread, and leaves the group to its owner."""
    argv = [*COMMON[:1], os.path.join(ROOT, "config.json"), *COMMON[2:], "--dataset-path", str(corpus),
            "--output-dir", str(tmp_path / "out")]
    outputs = run_ranks(RAY_WORKER.replace("ARGV", repr(argv)), tmp_path)
    assert all("ray worker done" in output for output in outputs), outputs
    # The same steps and losses, to float32 rounding: trained in a thread the caller made, a CPU kernel may split a sum
    # differently from the main thread's on a many-core host (seen: 7e-8 relative, 16 cores); a wrong group, rank or
    # batch would differ from the first step by far more.
    ray, reference_rows = rows(tmp_path / "out"), rows(reference)
    assert [r["step"] for r in ray] == [r["step"] for r in reference_rows]
    assert [r["loss"] for r in ray] == pytest.approx([r["loss"] for r in reference_rows], rel=1e-5, abs=0)


def test_node_local_output_folders_that_disagree_are_refused_on_every_rank(reference, corpus, tmp_path):
    """Two "nodes" (one rank each, own working folder) given ``--output-dir out``: only node 0's holds a
    checkpoint. Resuming on rank 0 alone would train mismatched steps; every rank must refuse instead."""
    port = free_port()
    procs = []
    for rank in range(2):
        node = tmp_path / f"node{rank}"
        (node / "out").mkdir(parents=True)
        if rank == 0:
            shutil.copy(reference / "checkpoint_4.pt", node / "out" / "checkpoint_last.pt")
        env = clean_env(2, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *COMMON, "--config",
                                       os.path.join(ROOT, "config.json"), "--dataset-path", str(corpus),
                                       "--output-dir", "out"], cwd=node, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True))
    for rank, proc in enumerate(procs):
        code, output = finish(proc, timeout=120)
        errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
        assert code == 1 and len(errors) == 1 and "Traceback" not in output, output
        assert errors[0].startswith(f"ERROR: rank {rank}: ranks disagree about out/checkpoint_last.pt: rank 0 sees "
                                    ), errors[0]
        assert "rank 1 sees no file; --output-dir must be one folder shared by every node" in errors[0]
    assert not (tmp_path / "node1" / "out" / "metrics.jsonl").exists()


def test_a_killed_worker_is_restarted_and_the_run_finishes(reference, corpus, tmp_path):
    proc = launch(tmp_path, corpus, restarts=1, plant=SLOW_STEPS)
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
    """The model under test with a criterion that returns NaN from the step given in the test on
    (``nan_loss["nan_from"] = 3``), or, with ``nan_loss["only"] = step`` and ``nan_loss["poison"]``, that
    changes the loss of that one step (a loss spike)."""
    spec = MODELS[MODEL]
    calls = {"step": 0, "nan_from": 1, "only": None, "poison": lambda loss: loss * float("nan")}

    def poison(loss):
        calls["step"] += 1
        if calls["step"] == calls["only"] or (calls["only"] is None and calls["step"] >= calls["nan_from"]):
            return calls["poison"](loss)
        return loss

    phases = spec.training.phases
    if phases is not None:  # a model with several optimizers: its last phase's loss (the generator's, say)
        def train_step(phase, nets, batch):
            loss, metrics = phases.train_step(phase, nets, batch)
            return (poison(loss) if phase == phases.names[-1] else loss), metrics
        monkeypatch.setitem(MODELS, MODEL, with_training(spec, phases=dataclasses.replace(phases,
                                                                                          train_step=train_step)))
        return calls

    def build_criterion(cfg):
        criterion = spec.training.build_criterion(cfg)

        def poisoned(outputs, batch):
            loss, terms = loss_and_terms(criterion(outputs, batch))
            return (poison(loss) if torch.is_grad_enabled() else loss), terms  # a training step, not validation
        return poisoned
    monkeypatch.setitem(MODELS, MODEL, with_training(spec, build_criterion=build_criterion))
    return calls


def with_training(spec, **changes):
    """``spec`` with these fields of its ``Training`` group replaced (``dataclasses.replace`` of the nested group)."""
    return dataclasses.replace(spec, training=dataclasses.replace(spec.training, **changes))


def poisoned_weights(state: dict) -> dict:
    """The weights of a checkpoint that the poisoned loss trains: all of them, or for a model with several
    optimizers those of its last phase's network (the earlier phases' updates are not the poisoned step's)."""
    spec = MODELS[MODEL]
    if not spec.phase_names:
        return state
    model = spec.build_model(load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True))
    net = spec.training.phases.networks(model)[spec.phase_names[-1]]
    owned = {id(tensor) for tensor in net.state_dict(keep_vars=True).values()}
    return {k: v for k, v in state.items() if id(model.state_dict(keep_vars=True)[k]) in owned}


def test_a_criterion_returns_its_loss_or_its_loss_and_named_scalar_terms_and_nothing_else():
    """What the loop takes from a criterion (``loss_and_terms``), and the line a run ends with for anything else."""
    loss, term = torch.tensor(1.5, requires_grad=True), torch.tensor(0.5)
    assert loss_and_terms(loss)[0] is loss and loss_and_terms(loss)[1] == {}
    taken = loss_and_terms((loss, {"mae": term}))
    assert taken[0] is loss and taken[1] == {"mae": term}
    wrong = {"a tuple of 1": (loss,), "a list": [loss, {}], "a tuple of 2": (1.5, {}), "a term named 'loss'":
             (loss, {"loss": term}), "a term named 1": (loss, {1: term}), "term 'mae' as float": (loss, {"mae": 0.5}),
             "term 'mae' as a tensor of shape (2,)": (loss, {"mae": torch.ones(2)})}
    for said, returned in wrong.items():
        with pytest.raises(TrainingError, match=re.escape(f"the model's criterion returned {said}")):
            loss_and_terms(returned)


def test_non_finite_loss_stops_with_step_and_utterance_ids(capsys, nan_loss, corpus, tmp_path):
    nan_loss["nan_from"] = 3
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_nonfinite=stop",
                                "--set", "train.checkpoint_interval=2")
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "step 3: non-finite loss" in errors[0] and "SYN-" in errors[0], err
    assert f"last good checkpoint: {tmp_path / 'checkpoint_2.pt'}" in errors[0]  # a first anomaly: maybe the batch's
    assert torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == 2


def test_non_finite_loss_steps_are_skipped_and_counted(capsys, nan_loss, corpus, tmp_path):
    nan_loss["nan_from"] = 2
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_nonfinite=skip", "--max-steps", "4",
                                "--set", "train.checkpoint_interval=1")
    assert code == 0, err
    assert rows(tmp_path)[-1]["skipped_steps"] == 3
    anomalies = [json.loads(line) for line in (tmp_path / "anomalies.jsonl").read_text().splitlines()]
    assert [a["step"] for a in anomalies] == [2, 3, 4] and all(a["kind"] == "nonfinite" and a["ids"]
                                                                 for a in anomalies)
    after_one = torch.load(tmp_path / "checkpoint_1.pt", map_location="cpu", weights_only=True)["model"]
    last = torch.load(tmp_path / "checkpoint_4.pt", map_location="cpu", weights_only=True)["model"]
    assert_same_weights(poisoned_weights(last), poisoned_weights(after_one))  # no update was applied after step 1
    first = rows(tmp_path)[0]
    assert first["step"] == 1 and first["loss"] == first["loss"]  # step 1 trained, with a finite loss


def updates(state: dict) -> dict:
    """``{phase: (optimizer steps taken, scheduler steps taken)}`` of a checkpoint (Adam's per-parameter step count;
    the scheduler's ``last_epoch``); one phase, ``"model"``, for a one-loss model."""
    spec = MODELS[MODEL]
    optimizers = state["optimizer"] if spec.phase_names else {"model": state["optimizer"]}
    schedulers = state["scheduler"] if spec.phase_names else {"model": state["scheduler"]}
    return {phase: (int(max((s["step"] for s in optimizers[phase]["state"].values()), default=0)),
                    schedulers[phase]["last_epoch"]) for phase in optimizers}


def stepped_per_step(phase: str) -> bool:
    """Whether the scheduler of ``phase`` steps with every optimizer step (not per epoch)."""
    phases = MODELS[MODEL].training.phases
    if phases is None or phases.build_scheduler is None:
        return True
    cfg = train.load_run_config(train.parse_args(["--config", "config.json", "--model", MODEL, "--tiny"]))
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return phases.build_scheduler(phase, probe, cfg)[1] == "step"


def test_fp16_overflows_skip_the_update_and_its_schedule_and_are_counted(capsys, nan_loss, corpus, tmp_path):
    """Inf gradients at steps 2 and 3 of the last phase under fp16 (the loss stays finite): the GradScaler skips those
    updates, its scheduler does not advance for them, the skips are counted per optimizer, and no gradient norm of
    a skipped update is logged as a number. (On a GPU fp16 also overflows by itself in the first steps, while the
    GradScaler finds its scale: those skips are counted the same way.)"""
    forced, steps = {2, 3}, 4
    spec = MODELS[MODEL]

    def inf_gradients(loss):
        if nan_loss["step"] in forced:
            loss.register_hook(lambda grad: grad * math.inf)
        return loss
    nan_loss["nan_from"], nan_loss["poison"] = 1, inf_gradients
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.precision=fp16", "--max-steps", str(steps),
                                "--set", "train.checkpoint_interval=100", "--set", "train.log_interval=1")
    assert code == 0, err
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    last = spec.phase_names[-1] if spec.phase_names else "model"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))

    def norm(row, phase):  # the phase's gradient norm of the step (a one-loss model logs it as grad_norm)
        return row["losses"][f"grad_norm_{phase}"] if spec.phase_names else row["grad_norm"]
    skipped = {phase: [r["step"] for r in rows if norm(r, phase) is None] for phase in (spec.phase_names or ["model"])}
    assert set(forced) <= set(skipped[last]), skipped  # every forced overflow is a skipped update, logged as null
    assert sum(r["fp16_overflows"] for r in rows) == sum(len(s) for s in skipped.values())
    assert state["skipped_updates"] == rows[-1]["skipped_updates"] == {p: len(s) for p, s in skipped.items() if s}
    for phase, (optimizer_steps, scheduler_steps) in updates(state).items():
        assert optimizer_steps == steps - len(skipped[phase]), (phase, skipped)  # the optimizer's real steps
        if stepped_per_step(phase):  # a per-epoch schedule counts epochs
            assert scheduler_steps == optimizer_steps, (phase, optimizer_steps, scheduler_steps)


def test_updates_skipped_in_a_row_stop_the_run_naming_the_last_good_checkpoint(capsys, nan_loss, corpus, tmp_path):
    """A run whose every update from step 3 on is non-finite (what a learning rate of 1e6 does) is not skipped for
    ever: ``train.max_skips_in_a_row`` updates later it stops, non-zero, with one line."""
    nan_loss["nan_from"] = 3
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_nonfinite=skip", "--set",
                                "train.max_skips_in_a_row=4", "--set", "train.checkpoint_interval=1", "--max-steps", "20")
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "step 6: the update" in errors[0] and "skipped 4 steps in a row" in errors[0], err
    # Not checkpoint_5, nor 2: every checkpoint from step 2 on holds the weights whose steps failed since step 3.
    assert errors[0].endswith(f"last good checkpoint: {tmp_path / 'checkpoint_1.pt'}"), errors[0]
    assert torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == 5
    rows = [json.loads(line) for line in (tmp_path / "anomalies.jsonl").read_text().splitlines()]
    assert [row["message"].rpartition("last good checkpoint: ")[2] for row in rows] == [
        str(tmp_path / "checkpoint_2.pt"), *[str(tmp_path / "checkpoint_1.pt")] * 3]  # from the second skip on


def test_last_good_checkpoint_names_one_before_the_weights_that_kept_failing(tmp_path):
    for name in ("checkpoint_3.pt", "checkpoint_7.pt", "checkpoint_8.pt", "checkpoint_9.pt", "checkpoint_12.pt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "checkpoint_5").mkdir()  # a sharded one
    assert last_good_checkpoint(tmp_path, 10, 0) == str(tmp_path / "checkpoint_9.pt")  # a first anomaly at step 10
    assert last_good_checkpoint(tmp_path, 10, 1) == str(tmp_path / "checkpoint_7.pt")  # since 9: 8's weights failed
    assert last_good_checkpoint(tmp_path, 10, 3) == str(tmp_path / "checkpoint_5")  # since 7: 6's weights failed
    assert last_good_checkpoint(tmp_path, 6, 2) == "none kept from before step 3"


def test_weights_that_are_not_finite_are_never_saved_nor_make_a_good_checkpoint_go(capsys, corpus, tmp_path):
    """From the third optimizer step on, the first parameter of the optimizer holds NaN (broken weights with a finite
    loss: what a damaged checkpoint or a bad kernel leaves behind; a global optimizer post-step hook, in this process:
    what is proven is the loop's check before a save, not the launch)."""
    spec = MODELS[MODEL]
    broken_at = -(-3 // len(spec.phase_names or "x"))  # the step of the third optimizer step
    steps = [0]

    def break_weights(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] >= 3:
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].fill_(float("nan"))
    hook = register_optimizer_step_post_hook(break_weights)
    try:
        code, out, err = run_single(capsys, tmp_path, corpus, "--max-steps", "8", "--set",
                                    "train.checkpoint_interval=1", "--set", "train.keep_last=1")
    finally:
        hook.remove()
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code != 0 and len(errors) == 1, out + err
    assert f"step {broken_at}: the weights are not finite" in errors[0] and "not saved" in errors[0], errors[0]
    good = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert good["step"] == broken_at - 1 and all(torch.isfinite(v).all() for v in good["model"].values()
                                                 if v.is_floating_point())
    assert (tmp_path / f"checkpoint_{broken_at - 1}.pt").is_file()  # keep_last=1 did not prune the good one


SPIKE_STEP = 6  # past the spike monitors' warm-up (train.spike_warmup=4 here)


@pytest.mark.parametrize("on_spike", ["log", "skip", "stop"])
def test_a_loss_spike_is_logged_with_its_utterances_and_handled_as_on_spike_says(capsys, nan_loss, corpus, tmp_path,
                                                                                on_spike):
    nan_loss["only"], nan_loss["poison"] = SPIKE_STEP, lambda loss: loss * 20 + 1000.0  # also steeper gradients
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", f"train.on_spike={on_spike}",
                                "--max-steps", str(SPIKE_STEP + 1), "--set", "train.checkpoint_interval=1",
                                "--set", "train.spike_warmup=4")
    if on_spike == "stop":
        errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
        assert code == 1 and len(errors) == 1, err
        assert f"step {SPIKE_STEP}: loss " in errors[0] and "(3x the highest of its last" in errors[0], errors[0]
        good = tmp_path / f"checkpoint_{SPIKE_STEP - 1}.pt"
        assert "SYN-" in errors[0] and f"last good checkpoint: {good}" in errors[0]
        assert torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == \
            SPIKE_STEP - 1
        return
    assert code == 0, err
    anomalies = [json.loads(line) for line in (tmp_path / "anomalies.jsonl").read_text().splitlines()]
    assert [(a["step"], a["kind"]) for a in anomalies] == [(SPIKE_STEP, "spike")], anomalies
    assert anomalies[0]["ids"] and all(i.startswith("SYN-") for i in anomalies[0]["ids"])
    assert "last good checkpoint: " in anomalies[0]["message"]
    assert f"warning: step {SPIKE_STEP}: loss " in out + err
    before = torch.load(tmp_path / f"checkpoint_{SPIKE_STEP - 1}.pt", map_location="cpu", weights_only=True)
    at = torch.load(tmp_path / f"checkpoint_{SPIKE_STEP}.pt", map_location="cpu", weights_only=True)
    if on_spike == "skip":
        assert_same_weights(poisoned_weights(at["model"]), poisoned_weights(before["model"]))  # changed nothing
        assert at["skipped_steps"] == 1
    else:
        assert any(not torch.equal(at["model"][k], before["model"][k]) for k in at["model"])
        assert at["skipped_steps"] == 0


def test_a_gradient_norm_spike_alone_is_caught(capsys, nan_loss, corpus, tmp_path):
    """A loss whose value is ordinary but whose gradient is 1000x steeper: only the gradient norm spikes."""
    nan_loss["only"] = SPIKE_STEP
    nan_loss["poison"] = lambda loss: loss + 999 * (loss - loss.detach())
    code, out, err = run_single(capsys, tmp_path, corpus, "--set", "train.on_spike=skip",
                                "--max-steps", str(SPIKE_STEP), "--set", "train.checkpoint_interval=100",
                                "--set", "train.spike_warmup=4")
    assert code == 0, err
    anomalies = [json.loads(line) for line in (tmp_path / "anomalies.jsonl").read_text().splitlines()]
    assert [a["step"] for a in anomalies] == [SPIKE_STEP], anomalies
    assert anomalies[0]["message"].startswith("gradient norm "), anomalies[0]["message"]


NOISE_UTT = "SYN-0015"


@pytest.mark.skipif("waveglow" not in MODELS, reason="the planted clip is tuned to WaveGlow's likelihood, which this "
                                                      "project no longer has (the synthetic spikes above still run)")
def test_a_clip_of_loud_noise_is_caught_as_a_spike_named_and_skipped(tmp_path):
    """A real fault, not a poisoned loss: one clip of the corpus is loud white noise. Once WaveGlow has learnt
    the voiced clips (about 20 steps), the batch holding it has a gradient norm several times the highest of the
    steps before.
    With one clip per rank and 28 training clips an epoch is 14 steps, so the clip comes back at least once
    after the model has learnt (step 15 or later): that return must be flagged, skipped and named, and no step
    without the clip may be flagged."""
    corpus = synth_corpus(tmp_path / "corpus", n=30, loud_noise=(NOISE_UTT,))
    out = tmp_path / "out"
    code, output = finish(launch(out, corpus, "--model", "waveglow", "--max-steps", "24", "--set",
                                 "waveglow.batch_size=1", "--set", "train.on_spike=skip", "--set",
                                 "train.spike_warmup=4", "--set", "train.checkpoint_interval=1",
                                 # the audio settings it was tuned on (the tiny block's are smaller)
                                 "--set", "audio.n_mels=80", "--set", "audio.win_length=1024"))
    assert code == 0, output
    anomalies = [json.loads(line) for line in (out / "anomalies.jsonl").read_text().splitlines()]
    assert anomalies and all(a["kind"] == "spike" and NOISE_UTT in a["ids"] for a in anomalies), anomalies
    with_noise = [a["step"] for a in anomalies]
    assert max(with_noise) >= 15, anomalies  # the clip's return in the second epoch, when the model knows voices
    for step in with_noise:
        assert re.search(rf"warning: step {step}: .*\(3x the highest of its last \d+ steps.*step skipped", output)
        before = torch.load(out / f"checkpoint_{step - 1}.pt", map_location="cpu", weights_only=True)
        at = torch.load(out / f"checkpoint_{step}.pt", map_location="cpu", weights_only=True)
        assert_same_weights(at["model"], before["model"])  # the noisy step changed no weight
    assert rows(out)[-1]["skipped_steps"] == len(with_noise)


# Rank 1 of a job started with this on PYTHONPATH holds 600 MB more than rank 0 and computes 0.15 s more in each of
# its first SLOW_FORWARDS training forward passes (a busy loop in a global forward hook on the DDP wrapper: CPU time, as
# a rank with more work spends; the straggler check of CPU ranks compares CPU seconds); and every DataLoader fetch of
# every rank sleeps 0.1 s (an input pipeline that cannot keep up, planted in the workers, which inherit the patch from
# their rank): planted faults for the balance and data warnings, of one job. Rank 1 is slow only in the first steps,
# the balance warnings' window: a slow rank would hide rank 0's wait for data (it would wait for rank 1 instead).
SLOW_FORWARDS = 6
UNBALANCED = f"""
import os
import time
import torch
import torch.utils.data._utils.fetch as fetch

_fetch = fetch._MapDatasetFetcher.fetch


def _slow_fetch(self, possibly_batched_index):
    time.sleep(0.1)
    return _fetch(self, possibly_batched_index)


fetch._MapDatasetFetcher.fetch = _slow_fetch

if os.environ.get("RANK") == "1":
    BALLAST = bytearray(600 * 2**20)
    BALLAST[::4096] = b"x" * len(BALLAST[::4096])  # touch every page: resident memory
    _forwards = [0]

    def _slow(module, args, output):
        if type(module).__name__ == "DistributedDataParallel" and module.training and _forwards[0] < {SLOW_FORWARDS}:
            _forwards[0] += 1
            end = time.process_time() + 0.15
            while time.process_time() < end:
                pass
    torch.nn.modules.module.register_module_forward_hook(_slow)
"""


@pytest.fixture(scope="module")
def unbalanced(tmp_path_factory, corpus):
    """``(folder, output)`` of the job with :data:`UNBALANCED` planted, one DataLoader worker per rank, for 3 steps past
    the data-wait warm-up (made once per session)."""
    def run(out):
        code, output = finish(launch(out, corpus, "--max-steps", str(RunLog.DATA_WAIT_WARMUP + 3), "--set",
                                     "data.num_workers=1", plant=UNBALANCED))
        assert code == 0, output
        return output
    folder, output = made_once(tmp_path_factory, "train_unbalanced", run)
    return folder, output


def test_a_rank_with_extra_memory_and_a_slow_rank_are_named(unbalanced):
    folder, output = unbalanced
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert any("rank 1 holds" in w and "above the median" in w for w in warnings), output
    assert any("rank 1 is a straggler" in w and "for 3 log intervals" in w for w in warnings), output
    last, slow = rows(folder)[-1], rows(folder)[SLOW_FORWARDS - 1]  # the last step, and rank 1's last slow one
    assert len(last["memory_gib"]) == 2 and last["memory_gib"][1] > last["memory_gib"][0] + 0.4
    assert slow["compute_s"][1] > slow["compute_s"][0] + 0.1


def test_a_slow_input_pipeline_is_named_with_a_fix_this_project_has(unbalanced):
    _, output = unbalanced
    warnings = [line for line in output.splitlines() if "per step for data" in line]
    assert len(warnings) == 1, output  # once, past the warm-up, not every step
    assert warnings[0].endswith(f"{MODELS[MODEL].training.data_advice} (data.num_workers is 1)"), warnings[0]
    for script in re.findall(r"scripts/\S+\.(?:py|sh)", warnings[0]):  # a fix the project has
        assert os.path.isfile(os.path.join(ROOT, script)), script
    for module in re.findall(r"-m (scripts\.\w+)", warnings[0]):  # ... or names as a module
        assert os.path.isfile(os.path.join(ROOT, *module.split(".")) + ".py"), module


def test_a_checkpoint_that_cannot_fit_the_grace_period_is_said_at_start_up(capsys, monkeypatch, corpus, tmp_path):
    """A grace period shorter than any checkpoint's write (1 ns, as ``multiproc.py --stop-timeout`` gives it to the
    ranks): one warning at start-up, with what to raise. (With multiproc's default of 25 s a tiny run warns of
    nothing: this file's reference run holds no warning.) In this process: the launcher's side is the variable."""
    monkeypatch.setenv("MULTIPROC_STOP_TIMEOUT", "1e-9")
    code, out, err = run_single(capsys, tmp_path / "out", corpus, "--max-steps", "1")
    assert code == 0, err[-3000:]
    warnings = [line for line in out.splitlines() + err.splitlines() if "grace period" in line]
    assert len(warnings) == 1, out + err
    assert warnings[0].startswith("warning: a checkpoint takes ~") and "--stop-timeout" in warnings[0] \
        and "terminationGracePeriodSeconds" in warnings[0], warnings
