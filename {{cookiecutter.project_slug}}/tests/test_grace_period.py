"""A stop inside the platform's grace period, for every model of the project: ``python -m scripts.grace_period`` times
SIGTERM to a durable checkpoint on the shipped TrainJob's own command. (The platforms' replays are in
``test_platforms.py``; a grace period too short for a checkpoint, said at start-up, in ``test_train.py``.)"""

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import IN_A_POD, ROOT, TEST_MODEL, bound, clean_env, launch_command, run_main, synth_corpus

from models import MODELS

pytestmark = pytest.mark.slow  # real jobs: python -m pytest -m "not slow" leaves them out

TRAINJOB = os.path.join(ROOT, "scripts", "kubeflow", "trainjob.yaml")
TRAIN_ARGS = ["--model", TEST_MODEL, "--tiny", "--max-steps", "1", "--set", "data.num_workers=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("corpus"), n=30)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_trainjob_command_of_each_model_stops_inside_kubernetes_grace_period(name, corpus, tmp_path):
    """``python -m scripts.grace_period`` on the TrainJob's own command under Trainer v2's variables (one node, tiny
    config): the checkpoint is durable and every process gone within Kubernetes' 30 s, exit 143. ``TEST_MODEL``'s job
    has 2 processes (the launcher forwarding the SIGTERM to several ranks, rank 0 saving: the same for every model);
    every other model's has 1, its own steps and checkpoint being what differs between models."""
    nproc = 2 if name == TEST_MODEL else 1
    cmd = launch_command(TRAINJOB)
    at = cmd.index("train.py")
    train_args = [*cmd[at + 1:], "--model", name, "--tiny", "--set", "data.num_workers=1"]
    train_args[train_args.index("--dataset-path") + 1] = str(corpus)
    del train_args[train_args.index("--output-dir"):train_args.index("--output-dir") + 2]  # the script's own
    env = clean_env(nproc, **IN_A_POD, PET_NNODES="1", PET_NPROC_PER_NODE=str(nproc))
    done = subprocess.run([sys.executable, "-m", "scripts.grace_period", "--after-steps", "2",
                           f"--launcher={' '.join(cmd[2:at])}", "--json", str(tmp_path / "stop.json"), "--",
                           *train_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=bound(120, 3))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "stop.json").read_text())
    assert result["exit_code"] == 143 and not result["traceback"], result
    assert result["sigterm_to_durable_s"] <= result["sigterm_to_exit_s"] < 30, result
    assert result["stopped_at_step"] >= 2 and result["checkpoint_bytes"] > 0, result
    assert re.search(r"checkpoint durable after \d+\.\d s \(.* MB\)", done.stdout), done.stdout


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_and_exits_0(flag):
    done = run_main("scripts.grace_period", flag, check=False)  # argparse's own help: in this process
    assert done.returncode == 0 and "usage: python -m scripts.grace_period" in done.stdout, done.stderr
    assert "--after-steps" in done.stdout and not done.stderr


def test_a_json_path_that_cannot_be_written_is_refused_before_measuring(tmp_path):
    """Nothing is started (the measurement takes minutes, and its result would be lost): one line, exit 2 (the script's
    ``main`` in this process)."""
    for target, why in ((tmp_path / "missing" / "stop.json", f"the folder {tmp_path / 'missing'} does not exist"),
                        (tmp_path, "a folder, not a file")):
        done = run_main("scripts.grace_period", "--json", str(target), "--", "--tiny", check=False)
        assert done.returncode == 2 and done.stderr == f"grace_period: ERROR: --json {target}: {why}\n", done.stderr
        assert "running:" not in done.stdout, done.stdout
