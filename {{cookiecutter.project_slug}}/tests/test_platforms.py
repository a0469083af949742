"""Launched unchanged where teams run: each platform's environment replayed on this host, the shipped launch files'
own commands, and a stop inside Kubernetes' grace period.

Every replay is two "nodes" of two processes on 127.0.0.1 (gloo on the CPU), set up as the platform sets up its
nodes (variables from the platforms' own sources, named in ``utils.platforms``: ``platform_topology``,
``check_process_rank`` and the platforms' folders; ``utils.launch.detect_launcher_env`` for the processes), and must
train with the losses of ``multiproc.py --nproc-per-node 4`` at every step. The contradictory environments are one
error line each.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (IN_A_POD, ROOT, TEST_MODEL, bound, clean_env, finish, free_port, launch_command, made_once,
                      run_train_main, shared_corpus)

import multiproc
import train
from utils.launch import detect_launcher_env
from utils.platforms import (check_process_rank, default_dataset_path, default_output_dir, hyperparameter_argv,
                             platform_topology, tensorboard_dir)

STEPS = 4
TRAIN_ARGS = ["--model", TEST_MODEL, "--tiny", "--max-steps", str(STEPS), "--set", "train.log_interval=1",
              "--set", "train.checkpoint_interval=2", "--set", "train.val_interval=100", "--set", "data.num_workers=1"]
TRAINJOB, PYTORCHJOB, SKYPILOT = (Path(ROOT) / "scripts" / "kubeflow" / "trainjob.yaml",
                                  Path(ROOT) / "scripts" / "kubeflow" / "pytorchjob.yaml",
                                  Path(ROOT) / "scripts" / "skypilot" / "train.yaml")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return shared_corpus(tmp_path_factory, "platforms_corpus", 30)


def losses(out: Path) -> list:
    return [(row["step"], row["loss"]) for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


def start(cmd: list, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finished(procs: list) -> list:
    """Every process's output, once all have exited 0."""
    results = [finish(proc, timeout=bound(120, 4)) for proc in procs]
    for code, output in results:
        assert code == 0, output[-4000:]
    return [output for _, output in results]


def shipped(path: Path, out: Path, corpus: Path, logs: Path, *extra: str) -> list:
    """The launch file's own command, run here: this Python, the ranks' logs in ``logs`` (``--log-dir``), its
    ``--output-dir`` and ``--dataset-path`` on this host's folders, the tiny config of :data:`TRAIN_ARGS` and ``extra``
    added."""
    cmd = launch_command(path)
    assert cmd[:2] == ["python", "multiproc.py"] and "train.py" in cmd, cmd
    for option, value in (("--output-dir", out), ("--dataset-path", corpus)):
        cmd[cmd.index(option) + 1] = str(value)
    return [sys.executable, "multiproc.py", "--log-dir", str(logs), *cmd[2:], *TRAIN_ARGS, *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    """``multiproc.py`` on 4 processes: the losses every platform's run of 2 nodes x 2 processes must repeat."""
    def run(out):
        cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "4", "--log-dir", str(out / "logs"), "train.py",
               "--config", "config.json", *TRAIN_ARGS, "--dataset-path", str(corpus), "--output-dir", str(out)]
        finished([start(cmd, clean_env(4))])
    return losses(made_once(tmp_path_factory, "platforms_reference", run)[0])


def two_nodes(env_of, cmd_of, tmp_path) -> list:
    """Start node 1, then node 0 (the later one must wait for the first, as on a cluster), each ``cmd_of(node)``
    with ``env_of(node)`` on top of :func:`clean_env`; their outputs once both have exited 0."""
    return finished([start(cmd_of(node), clean_env(4, **env_of(node))) for node in (1, 0)])


@pytest.fixture(scope="module")
def stopped_trainjob(tmp_path_factory, corpus):
    """``(folder, result)``: the TrainJob's manifest command on 2 nodes x 2 processes under Trainer v2's ``PET_*``
    variables (``--max-steps 1000``), then SIGTERM to each node's command once :data:`STEPS` steps are logged, as
    Kubernetes stops a TrainJob's pods; ``folder / "out"`` its output, ``result`` each node's exit code and output
    (node 1, node 0) and the seconds from the SIGTERM to every node's exit. Made once per session for the two tests of
    it (:func:`conftest.made_once`)."""
    def run(folder):
        port = free_port()
        nodes = [start(shipped(TRAINJOB, folder / "out", corpus, folder / f"logs{node}", "--max-steps", "1000"),
                       clean_env(4, **IN_A_POD, PET_NNODES="2", PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(node),
                                 PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))) for node in (1, 0)]
        deadline = time.monotonic() + bound(120, 4)
        while not (folder / "out" / "metrics.jsonl").exists() or len(losses(folder / "out")) < STEPS:
            if time.monotonic() > deadline or any(proc.poll() is not None for proc in nodes):
                for proc in nodes:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                said = [proc.communicate()[0][-3000:] for proc in nodes]
                pytest.fail(f"no step {STEPS}:\n" + "\n".join(said))
            time.sleep(0.1)
        sent = time.monotonic()
        for proc in nodes:
            os.kill(proc.pid, signal.SIGTERM)
        results = [finish(proc) for proc in nodes]
        return {"codes": [code for code, _ in results], "outputs": [output for _, output in results],
                "elapsed": time.monotonic() - sent}
    folder, result = made_once(tmp_path_factory, "platforms_stopped_trainjob", run)
    return folder / "out", result


@pytest.mark.slow
def test_kubeflow_trainjob_runs_its_manifest_command_with_the_losses_of_multiproc(reference, stopped_trainjob):
    """Trainer v2: only torchrun's ``PET_*`` variables on each node; the manifest's command as it is. The run is the one
    the SIGTERM test stops (:func:`stopped_trainjob`): its first :data:`STEPS` steps have the reference's losses (the
    tiny config's learning rate is constant: ``--max-steps`` changes none of them)."""
    out, _ = stopped_trainjob
    assert losses(out)[:STEPS] == reference


@pytest.mark.slow
def test_kubeflow_pytorchjob_runs_its_manifest_command_with_the_losses_of_multiproc(reference, corpus, tmp_path):
    """Training Operator v1: the pod's index as ``RANK`` beside the processes' ``WORLD_SIZE``, ``MASTER_*`` and
    ``PET_NNODES``/``PET_NPROC_PER_NODE``/``PET_NODE_RANK``."""
    port = free_port()
    two_nodes(lambda node: dict(IN_A_POD, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(node),
                                WORLD_SIZE="4", PET_NNODES="2", PET_NPROC_PER_NODE="2", PET_NODE_RANK=str(node)),
              lambda node: shipped(PYTORCHJOB, tmp_path / "out", corpus, tmp_path / f"logs{node}"),
              tmp_path)
    assert losses(tmp_path / "out") == reference


@pytest.mark.slow
def test_skypilot_runs_its_task_command_with_the_losses_of_multiproc(reference, corpus, tmp_path):
    """SkyPilot: ``SKYPILOT_*`` on each node and the task's ``run`` command (the port here a free one, through
    ``MASTER_PORT``; on SkyPilot's own nodes 29500)."""
    port = free_port()
    two_nodes(lambda node: dict(SKYPILOT_NUM_NODES="2", SKYPILOT_NODE_RANK=str(node),
                                SKYPILOT_NODE_IPS="127.0.0.1\n127.0.0.1", SKYPILOT_NUM_GPUS_PER_NODE="2",
                                MASTER_PORT=str(port)),
              lambda node: shipped(SKYPILOT, tmp_path / "out", corpus, tmp_path / f"logs{node}"),
              tmp_path)
    assert losses(tmp_path / "out") == reference


@pytest.mark.slow
def test_vertex_ai_per_node_variables_and_its_folders(reference, corpus, tmp_path):
    """Vertex AI: per node ``WORLD_SIZE`` (nodes), ``RANK`` (this node), ``MASTER_ADDR``/``MASTER_PORT``; no
    ``--output-dir``: checkpoints in ``AIP_CHECKPOINT_DIR``, TensorBoard in ``AIP_TENSORBOARD_LOG_DIR``."""
    port, checkpoints, board = free_port(), tmp_path / "aip_checkpoints", tmp_path / "aip_tensorboard"
    cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "train.py", "--config", "config.json", *TRAIN_ARGS,
           "--dataset-path", str(corpus)]
    outputs = two_nodes(lambda node: dict(WORLD_SIZE="2", RANK=str(node), MASTER_ADDR="127.0.0.1",
                                          MASTER_PORT=str(port), AIP_CHECKPOINT_DIR=str(checkpoints),
                                          AIP_TENSORBOARD_LOG_DIR=str(board)),
                        lambda node: [*cmd[:2], "--log-dir", str(tmp_path / f"logs{node}"), *cmd[2:]], tmp_path)
    assert "node 0 of 2, options from a per-node launcher's WORLD_SIZE (nodes) and RANK (this node)" in outputs[1]
    assert losses(checkpoints) == reference
    assert (checkpoints / "checkpoint_last.pt").is_file() and any(board.glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_sagemaker_torchrun_with_hyperparameters_as_arguments_and_its_channel(reference, corpus, tmp_path):
    """SageMaker (``torch_distributed``): its own ``torchrun --nnodes ... --node_rank i`` per node, the
    hyperparameters as ``--name value`` (``--tiny True``, ``--train.log_interval 1``), the corpus from the
    ``training`` channel (``SM_CHANNEL_TRAINING``, no ``--dataset-path``)."""
    port = free_port()
    hyperparameters = ["--model", TEST_MODEL, "--tiny", "True", "--max-steps", str(STEPS), "--train.log_interval", "1",
                       "--train.checkpoint_interval", "2", "--train.val_interval", "100", "--data.num_workers", "1",
                       "--output-dir", str(tmp_path / "out")]

    def torchrun(node):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(port), "--node_rank", str(node), "train.py", "--config",
                "config.json", *hyperparameters]

    two_nodes(lambda node: dict(SM_CHANNEL_TRAINING=str(corpus), SM_CURRENT_HOST=f"algo-{node + 1}",
                                SM_HOSTS='["algo-1", "algo-2"]', SM_TRAINING_ENV="{}"), torchrun, tmp_path)
    assert losses(tmp_path / "out") == reference


@pytest.mark.slow
def test_azure_ml_starts_every_process_itself_with_the_losses_of_multiproc(reference, corpus, tmp_path):
    """Azure ML (``PyTorchDistribution``): one ``python train.py`` per process with ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, no launcher in between."""
    port = free_port()
    cmd = [sys.executable, "train.py", "--config", "config.json", *TRAIN_ARGS, "--dataset-path", str(corpus),
           "--output-dir", str(tmp_path / "out")]
    procs = [start(cmd, clean_env(4, RANK=str(2 * node + local), LOCAL_RANK=str(local), WORLD_SIZE="4",
                                  NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for node in (1, 0) for local in (0, 1)]
    finished(procs)
    assert losses(tmp_path / "out") == reference


@pytest.mark.slow
def test_sigterm_to_every_node_of_a_trainjob_saves_and_exits_143_within_30_s(stopped_trainjob):
    """What Kubernetes does to a TrainJob's pods: SIGTERM to each node's command (the manifest's), SIGKILL 30 s later
    by default. Every node saves, says so without a traceback and exits 143 (128 + SIGTERM: retryable, where 0 would
    end the Job as complete) well before that (the run: :func:`stopped_trainjob`)."""
    out, result = stopped_trainjob
    for code, output in zip(result["codes"], result["outputs"]):
        assert code == 143 and "Traceback" not in output, output[-3000:]
    assert "stopped at step" in result["outputs"][1]
    assert torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] >= STEPS
    assert result["elapsed"] < 30, f"{result['elapsed']:.1f} s from SIGTERM to every node's exit"


def test_a_node_rank_beside_a_process_world_size_without_a_launcher_is_one_error_line(tmp_path):
    """A PyTorchJob's pod running ``train.py`` itself: ``RANK`` is the pod's index, ``WORLD_SIZE`` counts processes
    (train.py's ``main`` in this process: it stops before any process group)."""
    env = dict(RANK="1", WORLD_SIZE="4", PET_NPROC_PER_NODE="2", PET_NNODES="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        code, _, err = run_train_main(["--config", os.path.join(ROOT, "config.json"), "--model", TEST_MODEL, "--tiny",
                                       "--output-dir", str(tmp_path / "out")])
    errors = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(errors) == 1, err
    assert "node (pod) index" in errors[0] and "multiproc.py" in errors[0], errors
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.path.ismount("/gcs"), reason="Cloud Storage is mounted here")
def test_a_cloud_storage_folder_without_its_mount_is_one_error_line_before_any_rank_starts(tmp_path, monkeypatch,
                                                                                          capsys):
    """``AIP_CHECKPOINT_DIR=gs://...`` off Vertex AI: the checkpoints would go to a local ``/gcs/...`` folder."""
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", "gs://bucket/x")
    monkeypatch.chdir(ROOT)  # multiproc's main in this process: its check of train.py's command line starts nothing
    code = multiproc.main(["--log-dir", str(tmp_path / "logs"), "train.py", "--config", "config.json", "--model",
                           TEST_MODEL, "--tiny"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("multiproc: ERROR: AIP_CHECKPOINT_DIR=gs://bucket/x: no Cloud Storage is mounted at "
                          "/gcs here"), err
    assert not (tmp_path / "logs").exists()
    assert not Path("/gcs/bucket").exists()


@pytest.mark.parametrize("environ, expected", [
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "1", "PET_MASTER_ADDR": "head",
      "PET_MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "16"},
     dict(nnodes="2", nproc_per_node="8", node_rank="1", master_addr="head", master_port="23456")),
    ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "1", "MASTER_ADDR": "job-master-0",
      "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "16"},
     dict(nnodes="2", nproc_per_node="8", node_rank="1", master_addr="job-master-0", master_port="23456")),
    ({"SKYPILOT_NUM_NODES": "3", "SKYPILOT_NODE_RANK": "2", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7",
      "SKYPILOT_NUM_GPUS_PER_NODE": "8"},
     dict(nnodes="3", node_rank="2", master_addr="10.0.0.5", nproc_per_node="8")),
    ({"WORLD_SIZE": "4", "RANK": "3", "MASTER_ADDR": "cmle-training-workerpool0-0", "MASTER_PORT": "2222"},
     dict(nnodes="4", node_rank="3", master_addr="cmle-training-workerpool0-0", master_port="2222")),
    ({}, {}),
], ids=["trainjob", "pytorchjob", "skypilot", "vertex", "none"])
def test_platform_topology_reads_each_platform_in_the_documented_order(environ, expected):
    assert platform_topology(environ)[1] == expected


def test_a_sagemaker_training_channel_that_is_no_folder_is_named_in_one_line(capsys, tmp_path, monkeypatch):
    missing = tmp_path / "training"
    monkeypatch.setenv("SM_CHANNEL_TRAINING", str(missing))
    code = train.main(["--config", os.path.join(ROOT, "config.json"), "--tiny", "--output-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code != 0 and "Traceback" not in out + err, err
    assert err.splitlines() == [f"ERROR: SM_CHANNEL_TRAINING={missing}: no such folder (SageMaker's training channel: "
                                "check the job's input channels), or pass --dataset-path"], err
    assert not (tmp_path / "out").exists()


def test_platform_folders_and_sagemaker_arguments(monkeypatch, tmp_path):
    mounted = {"/gcs/bucket"}  # Vertex AI's Cloud Storage FUSE, one bucket mounted at /gcs/<bucket>
    monkeypatch.setattr("utils.platforms.os.path.ismount", lambda path: path in mounted)
    assert default_output_dir({"AIP_CHECKPOINT_DIR": "gs://bucket/run/checkpoints/", "SM_CURRENT_HOST": "algo-1"}) \
        == "/gcs/bucket/run/checkpoints/"
    mounted = {"/gcs"}  # all buckets under one mount
    assert tensorboard_dir({"AIP_TENSORBOARD_LOG_DIR": "gs://b/logs"}, "out") == "/gcs/b/logs"
    mounted = set()  # not on Vertex AI: the files would stay on this machine, in a local /gcs folder
    with pytest.raises(ValueError) as info:
        default_output_dir({"AIP_CHECKPOINT_DIR": "gs://bucket/x"})
    assert str(info.value) == ("AIP_CHECKPOINT_DIR=gs://bucket/x: no Cloud Storage is mounted at /gcs here (Vertex AI "
                               "mounts it), so /gcs/bucket/x would be a folder of this machine; unset "
                               "AIP_CHECKPOINT_DIR or pass --output-dir")
    with pytest.raises(ValueError, match="^AIP_TENSORBOARD_LOG_DIR=gs://b/logs: no Cloud Storage is mounted at /gcs"):
        tensorboard_dir({"AIP_TENSORBOARD_LOG_DIR": "gs://b/logs"}, "out")
    assert default_output_dir({"SM_CURRENT_HOST": "algo-1"}) == "/opt/ml/checkpoints"
    assert default_output_dir({}) == "output"
    assert default_dataset_path({"SM_CHANNEL_TRAINING": str(tmp_path)}) == str(tmp_path)
    assert default_dataset_path({"SM_CHANNEL_EVAL": "/x"}) is None
    assert tensorboard_dir({}, "out") == "out/tensorboard"
    assert hyperparameter_argv(["--config", "config.json", "--tiny", "True", "--train.lr", "1e-4", "--data.x=2",
                                "--max-steps", "3"], ["--tiny"]) == \
        ["--config", "config.json", "--tiny", "--set", "train.lr=1e-4", "--set", "data.x=2", "--max-steps", "3"]
    assert hyperparameter_argv(["--tiny", "False", "--model", "m"], ["--tiny"]) == ["--model", "m"]


def test_a_platform_rank_with_one_process_per_node_or_under_a_launcher_is_a_process_rank():
    """PyTorchJob with one process per pod (its RANK is then the process's), and torchrun or multiproc.py started
    under it (they set LOCAL_RANK and the process ranks)."""
    platform = {"RANK": "1", "WORLD_SIZE": "2", "PET_NPROC_PER_NODE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    check_process_rank(platform)
    assert detect_launcher_env(platform)["rank"] == 1
    launched = {**platform, "PET_NPROC_PER_NODE": "2", "WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}
    check_process_rank(launched)
    assert detect_launcher_env(launched)["rank"] == 3


def test_a_pytorchjob_pods_index_taken_for_a_rank_is_refused_naming_the_launcher():
    """Kubeflow's PyTorchJob (v1) gives the script run without a launcher its pod's index as RANK beside the
    processes' WORLD_SIZE: never a silently wrong world."""
    pod = {"RANK": "1", "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1", "PET_NNODES": "2",
           "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
    with pytest.raises(ValueError) as info:
        check_process_rank(pod)
    assert str(info.value) == ("RANK=1 and WORLD_SIZE=4 without LOCAL_RANK, and PET_NPROC_PER_NODE=2: RANK is the "
                               "platform's node (pod) index, not a process's rank (Kubeflow's PyTorchJob); start the "
                               "job with python multiproc.py train.py ... (it reads PET_* and starts 2 processes per "
                               "node) or torchrun")
    check_process_rank({**pod, "RANK": "x"})  # malformed: detect_launcher_env names it
    with pytest.raises(ValueError, match="RANK='x' is not an integer"):
        detect_launcher_env({**pod, "RANK": "x"})


def test_a_second_node_without_its_host_names_the_platforms_variables(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        multiproc.main(["--nnodes", "2", "--node-rank", "0", "t.py"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "multiproc: ERROR: --nnodes 2 needs --master-addr (the host of node 0), or a platform's variable: "
        "PET_MASTER_ADDR (Kubeflow), SKYPILOT_NODE_IPS (SkyPilot), or MASTER_ADDR beside WORLD_SIZE and RANK (a "
        "per-node launcher); none gave it"]


def test_a_platform_value_that_is_not_a_whole_number_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    monkeypatch.setenv("PET_NNODES", "two")
    with pytest.raises(SystemExit) as exit_info:
        multiproc.main(["t.py"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "multiproc: ERROR: torchrun's PET_* variables (Kubeflow): 'two' for --nnodes is not a whole number"]


def test_the_help_texts_name_the_platforms_folders_and_kubernetes(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: SageMaker's SM_CHANNEL_TRAINING when set)" in text
    assert "(default: Vertex AI's AIP_CHECKPOINT_DIR, SageMaker's /opt/ml/checkpoints, else output)" in text
    with pytest.raises(SystemExit):
        multiproc.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "inside Kubernetes' default 30 s" in text and "128 + the signal inside Kubernetes, where 0" in text
