"""The experiment trackers (``train.trackers``, ``utils/tracking``), read back with each tracker's own library
(``tests/tracker_readers.py``). Few tiny jobs, each read by several tests:

* per Tacotron2 and HiFi-GAN example the project registers (else ``TEST_MODEL``), a 2-process run logging to
  TensorBoard, W&B (offline) and MLflow (a local store) at once, stopped by SIGTERM past step 3, then resumed on 1
  process from ``checkpoint_2.pt`` (a fallback resume) with W&B online and no network: made once per session
  (:func:`logged`);
* a 1-process run with MLflow at a server that never answers;
* a launcher whose chosen tracker library is not installed.

Outages (a server that never answers, a service that stops, a store that fills): ``tests/test_trackers_outages.py``.

The fan-out's skipping, dropping and bounded end, MLflow's artifact location in a SQLite store, and the config's
refusals, are tested in this process."""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from conftest import (ROOT, TEST_MODEL, bound, clean_env, finish, free_port, made_once, planted, shared_corpus,
                      start_up_wait)
from models import MODELS
from test_train import SLOW_STEPS, wait_for_step
from tracker_readers import READERS, flat
from utils.run import git_commit
from utils.run_log import PER_RANK, SCALARS
from utils.tracking import TrackerContext, Trackers, TrackerSettings

STEPS = 6
TRACKERS = ["tensorboard", *READERS]


def makes_mels(name: str) -> bool:
    """Whether model ``name`` is a text-to-mel model (its inference takes a vocoder)."""
    return bool(MODELS[name].inference and MODELS[name].inference.takes_vocoder)


LOGGED = sorted({min((n for n in MODELS if makes_mels(n)), default=None),
                 min((n for n in MODELS if len(MODELS[n].phase_names) > 1), default=None)} - {None}) or [TEST_MODEL]
"""The models whose runs every tracker is read back from: the first text-to-mel model and the first model of two
optimizers (a GAN vocoder) where registered, else the test model."""


def media_of(name: str) -> tuple[str, ...]:
    """What model ``name``'s validation gives TensorBoard: a text-to-mel model's figures and audio, a vocoder's audio,
    nothing without ``log_validation`` (then neither do the trackers)."""
    if MODELS[name].training.log_validation is None:
        return ()
    return ("images", "audio") if makes_mels(name) else ("audio",)


def settings(name: str) -> tuple[str, ...]:
    """A text-to-mel model's short Griffin-Lim clips beside its figures (where its section has the key)."""
    return (f"{name}.val_audio_seconds=0.05",) if "val_audio_seconds" in MODELS[name].config_cls.model_fields else ()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "trackers_corpus", 16)


def job(out, corpus, model, *sets, nproc=2, env=(), plant=None, args=()):
    """Start a tiny run of ``model`` into ``out/run`` (``multiproc.py`` on ``nproc`` processes, or ``train.py`` alone
    for 1), a row per step, ``--set`` each of ``sets``, with the variables ``env``; the Popen, in a session of its own."""
    launcher = ["multiproc.py", "--nproc-per-node", str(nproc), "--log-dir", str(out / "logs")] if nproc > 1 else []
    cmd = [sys.executable, *launcher, "train.py", "--config", "config.json", "--model", model, "--tiny",
           "--dataset-path", str(corpus), "--output-dir", str(out / "run"), "--set", "train.log_interval=1",
           "--set", "data.num_workers=0", *[item for setting in sets for item in ("--set", setting)], *args]
    environ = clean_env(nproc, **dict(env))
    if plant is not None:
        planted(out, plant, environ)
    return subprocess.Popen(cmd, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def warnings_of(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("warning:")]


def expected_scalars(run_dir) -> dict:
    """``{tag: {step: value}}`` of what TensorBoard gets from a run's ``metrics.jsonl`` and ``val_metrics.jsonl``."""
    found = {}
    for row in rows(run_dir / "metrics.jsonl"):
        named = {f"train/{key}": value for key, value in row.get("losses", {}).items()}
        each = {f"ranks/{key}/rank{rank}": value for key in PER_RANK for rank, value in enumerate(row.get(key, []))}
        for tag, value in {**{f"train/{key}": row.get(key) for key in SCALARS}, **named, **each}.items():
            if value is not None:
                found.setdefault(tag, {})[row["step"]] = value
    for row in rows(run_dir / "val_metrics.jsonl"):
        named = {f"val/{key}": value for key, value in row.get("losses", {}).items()}
        for tag, value in {"val/loss": row["val_loss"], **named}.items():
            found.setdefault(tag, {})[row["step"]] = value
    return found


def once_each(scalars: dict) -> dict:
    """A reader's ``{tag: [(step, value), ...]}`` as ``{tag: {step: value}}``, every step logged once only."""
    for tag, logged in scalars.items():
        steps = [step for step, _ in logged]
        assert len(steps) == len(set(steps)), (tag, steps)
    return {tag: dict(logged) for tag, logged in scalars.items()}


def tensorboard_media(run_dir) -> dict:
    """``{"images": {tag: [steps]}, "audio": {tag: [steps]}}`` of a run's TensorBoard log."""
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0, "audio": 0})
    events.Reload()
    return {kind: {tag: sorted(event.step for event in getattr(events, kind.title())(tag)) for tag in events.Tags()[kind]}
            for kind in ("images", "audio")}


def rewound(before: dict, after: dict, step: int) -> dict:
    """``{tag: {step: value}}`` a tracker holds after a fallback resume from a checkpoint older than ``step``, the last
    step it held: ``before``'s (the stopped run's) up to ``step``, ``after``'s (the resumed run's) past it."""
    held = {tag: {**{s: v for s, v in before.get(tag, {}).items() if s <= step},
                  **{s: v for s, v in after.get(tag, {}).items() if s > step}} for tag in before.keys() | after.keys()}
    return {tag: logged for tag, logged in held.items() if logged}


def snapshot(folder) -> dict:
    """What the run in ``folder/run`` left: its last checkpoint's step and tracker run ids, its config, the scalars and
    media TensorBoard got, and each tracker's runs read back (a JSON value, for :func:`made_once`)."""
    run_dir = folder / "run"
    saved = torch.load(run_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    return {"step": saved["step"], "tracker_runs": saved["tracker_runs"],
            "config": json.loads((run_dir / "config.json").read_text()),
            "expected": {tag: sorted(logged.items()) for tag, logged in expected_scalars(run_dir).items()},
            "media": tensorboard_media(run_dir), "trackers": {name: read(folder) for name, (_, read) in READERS.items()}}


def stop_and_resume(folder, corpus, model: str) -> dict:
    """A 2-process run of ``model`` logging to every tracker (a checkpoint and a row per step, a validation every 2),
    stopped by SIGTERM past step 3, then resumed on 1 process from ``checkpoint_2.pt`` to step :data:`STEPS` with W&B
    online and no network (its server's port refuses; ``train.tracker_start_timeout_s``: ``wait``): ``{"first":
    snapshot after the stop, "resumed": snapshot at the end (:func:`snapshot`), "wait", "took": the resume's seconds,
    "output": the resume's}``."""
    env = {key: value for make_env, _ in READERS.values() for key, value in make_env(folder).items()}
    wait = start_up_wait()  # W&B's import, its refused online attempt and its offline start: seconds, not all of it
    sets = (f"train.trackers={json.dumps(TRACKERS)}", "train.val_interval=2", "train.checkpoint_interval=1",
            "train.keep_last=0", "train.tracker_log_checkpoint=true", f"train.tracker_start_timeout_s={wait}",
            *settings(model))
    proc = job(folder, corpus, model, *sets, env=env, plant=SLOW_STEPS, args=["--max-steps", str(STEPS)])
    wait_for_step(folder / "run", 3, proc, timeout=bound(120))
    os.kill(proc.pid, signal.SIGTERM)
    code, output = finish(proc)
    assert code == 0 and "stopped at step" in output and not warnings_of(output), output
    first = snapshot(folder)
    no_network = {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{free_port()}", "WANDB_API_KEY": "x" * 40}
    began = time.monotonic()
    code, output = finish(job(folder, corpus, model, *sets, nproc=1, env={**env, **no_network},
                              args=["--max-steps", str(STEPS), "--resume", str(folder / "run" / "checkpoint_2.pt")]))
    took = time.monotonic() - began
    assert code == 0, output
    return {"first": first, "resumed": snapshot(folder), "wait": wait, "took": took, "output": output}


@pytest.fixture(scope="module", params=LOGGED)
def logged(request, tmp_path_factory, corpus):
    """``(model, stop_and_resume's result)``, made once per session for every pytest-xdist worker."""
    for library in ("wandb", "mlflow"):
        pytest.importorskip(library)
    model = request.param
    return model, made_once(tmp_path_factory, f"trackers_{model}", lambda folder: stop_and_resume(folder, corpus,
                                                                                                  model))[1]


def as_dicts(expected: dict) -> dict:
    """:func:`snapshot`'s ``expected`` (``{tag: [[step, value], ...]}``) as ``{tag: {step: value}}``."""
    return {tag: dict(map(tuple, logged)) for tag, logged in expected.items()}


@pytest.mark.slow
def test_rank_0_alone_gives_each_tracker_every_scalar_the_config_and_the_media_tensorboard_gets(logged):
    """The stopped 2-process run: one run per tracker (rank 0's), every scalar of ``metrics.jsonl`` and
    ``val_metrics.jsonl`` at its step, the resolved config as parameters, the metadata as tags, exactly TensorBoard's
    images and audio, and the checkpoint it stopped at (``train.tracker_log_checkpoint``)."""
    model, done = logged
    first = done["first"]
    assert 3 <= first["step"] < STEPS
    media = first["media"]
    for kind in media_of(model):  # an example's validation logs media: the comparison below is not of nothing
        assert media[kind], f"{model}'s validation gave TensorBoard no {kind}"
    for name, runs in first["trackers"].items():
        assert len(runs) == 1, f"{name}: {len(runs)} runs (rank 0 alone logs)"
        (run,) = runs
        assert run["status"] == "FINISHED" and first["tracker_runs"][name] == run["id"], name
        assert once_each(run["scalars"]) == as_dicts(first["expected"]), name
        assert run["params"] == dict(flat(first["config"])), name
        assert run["params"]["train.trackers"] == json.dumps(TRACKERS), name
        assert {kind: {tag: sorted(steps) for tag, steps in run[kind].items()} for kind in media} == media, name
        assert run["tags"]["world_size"] == "2" and run["tags"]["model_name"] == model, name
        assert {"torch_version", "launcher"} <= run["tags"].keys(), name
        assert f"checkpoint_{first['step']}.pt" in run["files"], name


@pytest.mark.slow
def test_a_stopped_run_resumed_on_one_process_continues_each_trackers_run_and_logs_no_step_twice(logged):
    """The fallback resume on 1 process from ``checkpoint_2.pt``: each tracker continues the run of the checkpoint's
    ``tracker_runs`` (W&B offline, after its online start failed); it keeps what it held up to the step the run
    stopped at (those steps are trained again, not logged again) and gets every scalar and medium after it."""
    _, done = logged
    first, resumed = done["first"], done["resumed"]
    stopped = first["step"]
    assert resumed["step"] == STEPS and resumed["tracker_runs"] == first["tracker_runs"]
    expected = rewound(as_dicts(first["expected"]), as_dicts(resumed["expected"]), stopped)
    for name, runs in resumed["trackers"].items():
        (run,) = runs
        (before,) = first["trackers"][name]
        assert run["id"] == before["id"] == resumed["tracker_runs"][name] and run["status"] == "FINISHED", name
        assert once_each(run["scalars"]) == expected, name
        for kind, tensorboard in resumed["media"].items():
            held = {tag: sorted([*before[kind].get(tag, []), *[s for s in tensorboard.get(tag, []) if s > stopped]])
                    for tag in before[kind].keys() | tensorboard.keys()}
            assert {tag: sorted(steps) for tag, steps in run[kind].items()} == {
                tag: steps for tag, steps in held.items() if steps}, (name, kind)
        assert f"checkpoint_{STEPS}.pt" in run["files"], name


@pytest.mark.slow
def test_wandb_without_a_network_costs_the_bounded_start_up_wait_and_one_warning_and_logs_offline(logged):
    """The resume of :func:`stop_and_resume`, with W&B online and its server's port refusing: the run finishes within
    ``train.tracker_start_timeout_s`` and its usual time, with one warning naming the ``wandb sync`` line; W&B's run
    goes on offline (what it logged: the test above)."""
    _, done = logged
    warnings = warnings_of(done["output"])
    assert len(warnings) == 1, done["output"]
    warning = warnings[0]
    assert warning.startswith("warning: wandb: ") and "; logging offline in " in warning, done["output"]
    assert "upload it later with `wandb sync " in warning, done["output"]
    assert done["took"] < done["wait"] + bound(30, starts=1), done["took"]


@pytest.mark.slow
def test_a_tracking_server_that_does_not_answer_costs_the_bounded_start_up_wait_and_one_warning(corpus, tmp_path):
    """MLflow at a server that accepts and never answers, with a request timeout of 10 minutes (as a user may set):
    the run waits ``train.tracker_start_timeout_s``, says so in one line, and logs to TensorBoard as ever."""
    pytest.importorskip("mlflow")
    wait = round(bound(2, starts=2))  # all of it spent: TensorBoard starts within it, beside MLflow's import
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        env = {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{silent.getsockname()[1]}", "MLFLOW_HTTP_REQUEST_TIMEOUT": "600"}
        began = time.monotonic()
        code, output = finish(job(tmp_path, corpus, TEST_MODEL, 'train.trackers=["tensorboard", "mlflow"]',
                                  f"train.tracker_start_timeout_s={wait}", nproc=1, env=env, args=["--max-steps", "2"]))
        took = time.monotonic() - began
    assert code == 0, output
    assert warnings_of(output) == [f"warning: mlflow did not start within train.tracker_start_timeout_s={wait} s (is "
                                   "its server reachable?); training goes on without it"], output
    assert took < wait + bound(30, starts=1), took
    run_dir = tmp_path / "run"
    assert [row["step"] for row in rows(run_dir / "metrics.jsonl")] == [1, 2]
    assert EventAccumulator(str(run_dir / "tensorboard")).Reload().Tags()["scalars"]


@pytest.mark.slow
def test_mlflow_s_run_names_its_entry_script_and_no_unknown_git_commit(logged):
    """MLflow's run has the tags ``mlflow.start_run`` gives (``mlflow.source.name``: the entry script, train.py), and
    ``git_commit`` only when the project is a git checkout (not the text "None")."""
    _, done = logged
    (run,) = done["first"]["trackers"]["mlflow"]
    assert Path(run["tags"]["mlflow.source.name"]).name == "train.py", run["tags"]
    assert run["tags"].get("git_commit") == git_commit(), run["tags"]


@pytest.mark.slow  # MLflow's import and a SQLite store's set-up: seconds of CPU
def test_an_mlflow_experiment_in_a_sqlite_store_keeps_its_artifacts_beside_the_database(tmp_path, monkeypatch):
    """Runs started in one folder logging to a SQLite store in another (``mlflow_tracker.start`` in this process): the
    experiment they create keeps its runs' artifacts in ``mlartifacts`` beside the database, not in ``./mlruns`` of the
    folder they started in; an experiment created with an artifact location keeps it."""
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs SQLAlchemy (not in mlflow-skinny)")
    from utils.tracking import mlflow_tracker

    store, started, chosen = tmp_path / "store", tmp_path / "started_here", tmp_path / "chosen"
    store.mkdir()
    started.mkdir()
    monkeypatch.chdir(started)
    uri = f"sqlite:///{store / 'mlflow.db'}"
    for key, value in {"MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}.items():
        monkeypatch.setenv(key, value)  # start() sets the last two where unset: put back after the test
    mlflow.MlflowClient(uri).create_experiment("chosen", artifact_location=chosen.as_uri())
    checkpoint = tmp_path / "checkpoint_1.pt"
    checkpoint.write_bytes(b"weights")
    runs = {}
    for project in ("new", "new", "chosen"):  # created, found, the user's
        ctx = TrackerContext(settings=TrackerSettings(tracker_project=project), config={"train": {"seed": 1}},
                             metadata={"git_commit": None}, output_dir=tmp_path / "run", tensorboard_dir="",
                             run_name="run", run_id=None, resumed_step=0)
        tracker = mlflow_tracker.start(ctx)
        tracker.log_artifact(checkpoint)
        tracker.close(False)
        runs.setdefault(project, []).append(tracker.run_id)
    beside = sorted(path.relative_to(store).parts for path in store.rglob("checkpoint_1.pt"))
    assert beside == sorted(("mlartifacts", "new", run, "artifacts", checkpoint.name) for run in runs["new"]), beside
    assert [path.relative_to(chosen).parts[0] for path in chosen.rglob("checkpoint_1.pt")] == runs["chosen"]
    assert not list(started.iterdir()), "nothing is written where the runs started"


@pytest.mark.slow
def test_a_tracker_not_installed_is_an_error_line_before_any_work(corpus, tmp_path):
    began = time.monotonic()
    code, output = finish(job(tmp_path, corpus, TEST_MODEL, 'train.trackers=["tensorboard", "mlflow"]',
                              plant="import sys\nsys.modules['mlflow'] = None\n"), timeout=bound(30, starts=1))
    assert code != 0, output
    assert output.splitlines() == ["multiproc: ERROR: train.trackers: mlflow chosen but not installed: pip install "
                                   "-r requirements-trackers.txt"], output  # the launcher's check, before any rank
    assert time.monotonic() - began < bound(10, starts=1) and not (tmp_path / "run").exists()


class Recorder:
    """A tracker that records its calls; ``fail``: the method that raises ``OSError``."""

    def __init__(self, name, last_step=0, fail=None):
        self.name, self.run_id, self.last_step, self.fail, self.calls = name, f"{name}-id", last_step, fail, []

    def __getattr__(self, method):
        def call(*args):
            if method == self.fail:
                raise OSError(f"{self.name} is unreachable")
            self.calls.append((method, *args))
        return call


def test_the_http_clients_import_says_nothing_of_socks_support_the_run_does_not_use():
    """urllib3's SOCKS module, imported by W&B's and MLflow's HTTP client (requests) in a tracker's start thread, warns
    when PySocks is missing (the first process: it does); in a process that has imported the trackers' package, as
    every run with trackers has before its trackers start, it says nothing (the second)."""
    if importlib.util.find_spec("socks") is not None:
        pytest.skip("PySocks is installed: urllib3 has nothing to warn of")
    socks = "try:\n    import urllib3.contrib.socks\nexcept ImportError:\n    pass\n"
    said = [subprocess.run([sys.executable, "-c", first + socks], cwd=ROOT, env=clean_env(1), capture_output=True,
                           text=True, check=True).stderr for first in ("", "import utils.tracking\n")]
    assert "SOCKS support in urllib3" in said[0] and said[1] == "", said


def test_the_fan_out_skips_the_steps_a_resumed_run_holds_and_drops_a_failing_tracker(capsys):
    resumed, fresh, failing = Recorder("resumed", last_step=3), Recorder("fresh"), Recorder("failing", fail="add_image")
    trackers = Trackers([resumed, fresh, failing])
    for step in (2, 3, 4):
        trackers.add_scalar("train/loss", step / 10, step)
        trackers.add_scalar("train/lr", 0.001, step)
        trackers.add_audio("audio/vocoded", torch.zeros(1, 8), step, sample_rate=22050)
    trackers.add_figure("alignment", Figure(figsize=(2, 2)), 4)
    trackers.add_scalar("val/loss", 0.5, 4)
    trackers.close()
    scalars = [(call[2], call[1]) for call in resumed.calls if call[0] == "add_scalars"]
    assert scalars == [(4, {"train/loss": 0.4, "train/lr": 0.001, "val/loss": 0.5})]  # steps 2, 3: skipped
    assert [call[3] for call in resumed.calls if call[0] == "add_audio"] == [4]
    assert [call[2] for call in fresh.calls if call[0] == "add_scalars"] == [2, 3, 4]
    image = next(call[2] for call in fresh.calls if call[0] == "add_image")
    assert image.dtype == "uint8" and image.ndim == 3 and image.shape[2] == 3
    clip = next(call[2] for call in fresh.calls if call[0] == "add_audio")
    assert clip.shape == (8,) and clip.dtype == "float32"
    assert ("close", False) in fresh.calls and ("close", False) not in failing.calls  # dropped at its first failure
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: failing failed (failing is unreachable) and is dropped; training goes on logging "
                        "to the others"]
    assert trackers.run_ids() == {"resumed": "resumed-id", "fresh": "fresh-id", "failing": "failing-id"}


def test_the_fan_out_ends_within_the_finish_timeout_and_abandons_a_tracker_that_hangs_or_fails(capsys):
    """``close`` gives every tracker ``finish_timeout_s`` together: one still ending its run then, or failing, is
    dropped with one warning line and abandoned (its ``abandon``); the others end theirs, as failed when ``close`` runs
    while an error is raised."""
    release = threading.Event()
    fine, hanging, failing = Recorder("fine"), Recorder("hanging"), Recorder("failing", fail="close")
    hanging.close = lambda failed: release.wait(60)  # a finish that waits for a server, until abandoned
    hanging.abandon = release.set
    trackers = Trackers([fine, hanging, failing], finish_timeout_s=0.5)
    began = time.monotonic()
    trackers.close()
    assert time.monotonic() - began < 5 and release.is_set()
    assert ("close", False) in fine.calls and ("abandon",) in failing.calls and ("abandon",) not in fine.calls
    assert warnings_of(capsys.readouterr().out) == [
        "warning: hanging did not end its run within train.tracker_finish_timeout_s=0.5 s (is its server reachable?) "
        "and is abandoned", "warning: failing failed to end its run (failing is unreachable)"]
    after_error = Recorder("after_error")
    with pytest.raises(KeyError):
        try:
            raise KeyError("a step's error")
        finally:
            Trackers([after_error]).close()
    assert after_error.calls == [("close", True)]


@pytest.mark.parametrize("trackers, says", [
    ('["tensorboard", "comet"]', "config key 'train.trackers[1]' must be one of"),
    ('["mlflow", "tensorboard", "mlflow"]', "train.trackers names mlflow more than once")])
def test_an_unknown_or_repeated_tracker_is_refused_in_one_line(capsys, tmp_path, trackers, says):
    code = train.main(["--config", f"{ROOT}/config.json", "--model", TEST_MODEL, "--output-dir", str(tmp_path / "out"),
                       "--set", f"train.trackers={trackers}"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("ERROR: ") and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
