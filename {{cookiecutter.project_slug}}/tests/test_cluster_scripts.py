"""The cluster scripts: ``scripts/slurm/train.sbatch`` and ``scripts/mpirun.sh`` parse, pass the rendezvous they
promise, and two SLURM steps of one job train side by side (under an emulated ``srun``; real processes, gloo)."""

import os
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import ROOT, TEST_MODEL, clean_env, finish, synth_corpus

from utils.launch import slurm_port


# srun as SLURM runs a job step: SLURM_NTASKS copies of the command, each with its task's variables.
FAKE_SRUN = textwrap.dedent('''\
    #!/usr/bin/env bash
    while [[ "$1" == -* ]]; do shift; done  # srun's own options
    pids=()
    for ((task = 0; task < SLURM_NTASKS; task++)); do
        SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_STEP_ID=$EMULATED_STEP_ID "$@" &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    exit $status
''')


def python_on_path(bin_dir) -> None:
    """``bin_dir/python``: a script that runs this interpreter, for scripts that call ``python`` from PATH.

    Not a symlink: an interpreter started through a link outside its virtual environment no longer finds the
    environment (its ``pyvenv.cfg`` sits beside the environment's ``bin/``), so it would miss the packages.
    """
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)


def test_python_on_path_runs_this_interpreter_with_its_packages(tmp_path):
    python_on_path(tmp_path)
    done = subprocess.run([str(tmp_path / "python"), "-c", "import sys, torch; print(sys.prefix, torch.__version__)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [sys.prefix, torch.__version__]


@pytest.mark.slow  # real processes: the fast tier keeps one 2-process smoke run
def test_two_slurm_steps_of_one_job_train_side_by_side_through_the_sbatch_script(tmp_path):
    """scripts/slurm/train.sbatch under an emulated srun, twice at once in one allocation (steps 0 and 1): each
    step gets its own port (utils.launch.slurm_port of job and step id), its own process group, and finishes."""
    corpus = synth_corpus(tmp_path / "corpus", n=12)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    python_on_path(bin_dir)
    steps = {}
    for step in (0, 1):
        env = clean_env(2, SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_JOB_NODELIST="127.0.0.[1]",
                        SLURM_SUBMIT_DIR=ROOT, EMULATED_STEP_ID=str(step), OUTPUT_DIR=str(tmp_path / f"step{step}"),
                        PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
        steps[step] = subprocess.Popen(
            ["bash", os.path.join(ROOT, "scripts", "slurm", "train.sbatch"), "--model", TEST_MODEL, "--tiny",
             "--max-steps", "3", "--dataset-path", str(corpus), "--set", "train.val_interval=100"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
    assert slurm_port(4242, 0) != slurm_port(4242, 1)
    for step, proc in steps.items():
        code, output = finish(proc)
        assert code == 0, output
        assert "on 2 process(es)" in output, output
        state = torch.load(tmp_path / f"step{step}" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
        assert state["step"] == 3 and len(state["rng"]) == 2  # both ranks of this step, none of the other's


@pytest.mark.parametrize("script", ["scripts/slurm/train.sbatch", "scripts/mpirun.sh"])
def test_cluster_scripts_parse(script):
    done = subprocess.run(["bash", "-n", os.path.join(ROOT, script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_mpirun_script_counts_slots_binds_to_none_and_passes_the_rendezvous(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text('#!/usr/bin/env bash\necho "mpirun $*"\n')  # prints what it was asked
    (bin_dir / "mpirun").chmod(0o755)
    env = clean_env(1, PATH=os.pathsep.join([str(bin_dir), os.environ["PATH"]]))
    script = os.path.join(ROOT, "scripts", "mpirun.sh")
    missing = subprocess.run(["bash", script, str(tmp_path / "nope")], capture_output=True, text=True, env=env)
    assert missing.returncode == 2 and missing.stderr.startswith("ERROR: usage:"), missing.stderr
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\ngpu-a slots=8\ngpu-b slots=4\n")
    done = subprocess.run(["bash", script, str(hostfile), "--model", "m"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"mpirun -np 12 --hostfile {hostfile} --bind-to none "), done.stdout
    assert "-x MASTER_ADDR=gpu-a -x MASTER_PORT=29500" in done.stdout
    assert done.stdout.rstrip().endswith("python train.py --config config.json --model m"), done.stdout
