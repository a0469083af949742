"""Tests of multiproc.py: real launches of 2 CPU processes (gloo) through torchrun's machinery."""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import ROOT, bound, clean_env, free_port

import multiproc

MULTIPROC = os.path.join(ROOT, "multiproc.py")

# Each rank: join the job via distributed.py, all-reduce its rank, write what it saw to a file.
SCRIPT = textwrap.dedent('''
    import json, os, sys, time
    import torch
    import distributed as D

    info = D.init_distributed(timeout_s=30)
    print(f"hello from rank {info.rank} of {info.world_size}", flush=True)
    print(f"stderr line of rank {info.rank}", file=sys.stderr, flush=True)
    if "--fail" in sys.argv:
        if info.rank == 1:
            raise SystemExit(3)
        time.sleep(600)  # rank 0 would wait here; the launcher must stop it
    total = D.reduce_tensor(torch.tensor([float(info.rank)]), "sum").item()
    out_dir = sys.argv[1]
    with open(os.path.join(out_dir, f"rank{info.rank}.json"), "w") as f:
        json.dump({"world_size_env": os.environ["WORLD_SIZE"], "local_rank": info.local_rank,
                   "rank_sum": total, "argv": sys.argv[1:]}, f)
    D.cleanup()
''')


def launch(tmp_path, *args):
    """Run ``python multiproc.py *args`` in tmp_path; returns (CompletedProcess, seconds)."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = clean_env(2, cpu_only=True)  # the script's tensors are CPU tensors: gloo
    start = time.monotonic()
    done = subprocess.run([sys.executable, MULTIPROC, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=bound(120, 3))
    return done, time.monotonic() - start


def test_two_ranks_run_and_rank1_logs_to_files(tmp_path):
    log_dir = tmp_path / "my_logs"  # does not exist yet: multiproc creates it
    passthrough = ["--nproc-per-node", "7", "--log-dir", "x", "--flag"]  # the script's, not ours
    done, _ = launch(tmp_path, "--nproc-per-node", "2", "--log-dir", str(log_dir),
                     "script.py", str(tmp_path), *passthrough)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console

    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["world_size_env"] == "2"
        assert seen["local_rank"] == rank
        assert seen["rank_sum"] == 1.0  # 0 + 1, all-reduced over the two processes
        assert seen["argv"] == [str(tmp_path), *passthrough]

    assert f"multiproc: 2 processes (world size 2), logs of ranks 1.. in {log_dir}" in done.stdout
    assert "hello from rank 0 of 2" in done.stdout
    assert "of rank 1" not in console and "rank 1 of 2" not in console  # rank 1: files only
    assert "hello from rank 1 of 2" in (log_dir / "rank_1.stdout.log").read_text()
    assert "stderr line of rank 1" in (log_dir / "rank_1.stderr.log").read_text()
    assert not (log_dir / "rank_0.stdout.log").exists()


def test_failing_rank_stops_the_job_and_is_named(tmp_path):
    done, elapsed = launch(tmp_path, "--nproc-per-node", "2", "--log-dir", "logs",
                           "script.py", str(tmp_path), "--fail")
    assert done.returncode == 3, done.stdout + done.stderr  # the failed rank's exit code
    assert elapsed < bound(30), f"took {elapsed:.1f}s: rank 0 was not stopped promptly (it sleeps 600 s)"
    log = os.path.join("logs", "rank_1.stderr.log")
    assert f"multiproc: rank 1 failed (exit code 3); its log: {log}" in done.stderr
    assert "multiproc: rank 0 failed" not in done.stderr  # rank 0 was stopped, not a cause
    assert "stderr line of rank 1" in (tmp_path / log).read_text()


# Rank 0 fails with an error of its own, as train.py reports one; rank 1, in an all-reduce, loses its peer (gloo's
# "Connection closed by peer"). Rank 1 ignores torchrun's SIGTERM: it ends by its own error, as a rank in a collective
# does before torchrun's stop reaches it.
LOSES_ITS_PEER = textwrap.dedent('''
    import signal, sys
    import torch
    import distributed as D
    from distributed import CollectiveError
    from utils.launch import record_failure

    info = D.init_distributed(timeout_s=60)
    if info.rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    D.reduce_tensor(torch.ones(1), "sum")  # both ranks are connected
    if info.rank == 0:
        print("ERROR: rank 0: the corpus went away (planted)", file=sys.stderr)
        record_failure("rank 0: the corpus went away (planted)")
        D.cleanup()
        sys.exit(1)
    try:
        D.reduce_tensor(torch.ones(1), "sum")
    except CollectiveError as err:
        print(f"ERROR: {err}", file=sys.stderr)
        record_failure(str(err), err.collective)
        D.cleanup()
        sys.exit(1)
''')


def test_a_rank_that_lost_its_peer_is_summed_up_by_the_error_of_the_rank_that_failed_first(tmp_path):
    (tmp_path / "loses.py").write_text(LOSES_ITS_PEER)
    done = subprocess.run([sys.executable, MULTIPROC, "--nproc-per-node", "2", "--log-dir", "logs", "loses.py"],
                          cwd=tmp_path, env=clean_env(2, cpu_only=True), capture_output=True, text=True,
                          timeout=bound(120, 3))
    assert done.returncode == 1, done.stdout + done.stderr
    summary = [line for line in done.stderr.splitlines() if line.startswith("multiproc: rank")]
    log = os.path.join("logs", "rank_1.stderr.log")
    # Rank 0 may still be ending (its process group's teardown) when torchrun stops it: exit code -15.
    assert len(summary) == 2 and re.fullmatch(r"multiproc: rank 0 failed \(exit code (1|-15)\): rank 0: the corpus "
                                              r"went away \(planted\); its log: the console above", summary[0]), summary
    assert summary[1] == ("multiproc: rank 1 failed (exit code 1): it lost its peer in all_reduce (sum) when rank 0 "
                          f"failed: rank 0: the corpus went away (planted); its log: {log}"), summary
    assert "Connection closed" in (tmp_path / log).read_text()  # gloo's words stay in the rank's log


@pytest.mark.slow  # real processes: the fast tier keeps one 2-process smoke run
def test_a_module_runs_on_every_rank_as_python_m_runs_it(tmp_path):
    """``multiproc.py -m package.module``: each rank runs the module as ``python -m`` does (its ``__main__`` part; the
    launcher only imports it, for a ``check_command_line`` it may have), with the arguments after the module name."""
    package = tmp_path / "jobs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ranks.py").write_text("def main():\n" + textwrap.indent(SCRIPT, "    ") +
                                      "\n\nif __name__ == '__main__':\n    main()\n")
    env = clean_env(2, cpu_only=True)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    done = subprocess.run([sys.executable, MULTIPROC, "--nproc-per-node", "2", "--log-dir", "logs", "-m", "jobs.ranks",
                           str(tmp_path), "--flag"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=bound(120, 3))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["rank_sum"] == 1.0 and seen["local_rank"] == rank and seen["argv"] == [str(tmp_path), "--flag"]
    missing = subprocess.run([sys.executable, MULTIPROC, "--nproc-per-node", "2", "-m", "no_such_package.job"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=bound(60, 1))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
        "multiproc: ERROR: module not found: no_such_package.job (run multiproc.py from the project's folder)"], \
        missing.stderr


def test_missing_script_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # multiproc's main in this process, as the bad options below: nothing is launched
    with pytest.raises(SystemExit) as exit_info:
        multiproc.main(["--nproc-per-node", "2", "no_such_script.py", "--x"])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["multiproc: ERROR: training script not found: no_such_script.py"]
    assert out == ""


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "0", "t.py"], "--nproc-per-node must be >= 1, got 0"),
    (["--nnodes", "2", "--node-rank", "0", "t.py"], "--nnodes 2 needs --master-addr (the host of node 0)"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "t.py"], "must be in 0..1"),
    (["--max-restarts", "-1", "t.py"], "--max-restarts must be >= 0"),
    (["--bogus", "t.py"], "unrecognized arguments: --bogus"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        multiproc.main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("multiproc: ERROR: ") and message in err[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_more_processes_than_gpus_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        multiproc.main(["--nproc-per-node", str(torch.cuda.device_count() + 1), "t.py"])
    assert exit_info.value.code == 2
    assert "GPU(s) are visible" in capsys.readouterr().err


@pytest.mark.slow
def test_a_node_that_never_comes_is_reported_within_the_rendezvous_timeout(tmp_path):
    port = free_port()
    done, seconds = launch(tmp_path, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                           "--master-port", str(port), "--rdzv-timeout", "3", "script.py", str(tmp_path))
    assert done.returncode != 0 and seconds < bound(3 + 15, 1), (done.returncode, seconds)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multiproc: ERROR: "), done.stderr
    assert f"rendezvous on 127.0.0.1:{port}: 1 of 2 nodes joined within 3 s" in lines[0]
    assert not list(tmp_path.glob("rank*.json")), "no rank may start before every node joined"


@pytest.mark.slow
def test_a_node_whose_node_0_never_answers_is_reported(tmp_path):
    with socket.socket() as held:  # bound, never listening: a connect there is refused, and nobody else can take it
        held.bind(("127.0.0.1", free_port()))
        port = held.getsockname()[1]
        done, seconds = launch(tmp_path, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--rdzv-timeout", "3", "script.py", str(tmp_path))
    assert done.returncode != 0 and seconds < bound(3 + 15, 1), (done.returncode, seconds)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"node 1: node 0 did not answer at 127.0.0.1:{port} within 3 s" in lines[0], \
        done.stderr
