"""A rank that hangs is ended by the process-group timeout, with a message naming the rank that gave up.

Real jobs of 2 gloo processes through multiproc.py: rank 1 sleeps (or is stopped with SIGSTOP) while
rank 0 waits in a collective with a 5-10 s timeout. Nothing is mocked.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TEST_MODEL, bound, clean_env, free_port, made_once, rank_pids, synth_corpus

import distributed as D

pytestmark = pytest.mark.slow  # real multi-process jobs: python -m pytest -m "not slow" leaves them out


TIMEOUT_S = 5

# Rank 1 joins, then hangs (sleeps far past the timeout); rank 0 enters the collective named in argv[1].
SCRIPT = textwrap.dedent('''
    import sys, time
    import torch
    import distributed as D

    which, timeout_s = sys.argv[1], float(sys.argv[2])
    info = D.init_distributed(timeout_s=timeout_s)
    D.barrier()  # both ranks talk once (as DDP's first broadcast does in training), then rank 1 hangs
    print(f"rank {info.rank} joined", flush=True)
    if info.rank == 1:
        time.sleep(120)
        sys.exit(0)
    start = time.monotonic()
    try:
        if which == "reduce_tensor":
            D.reduce_tensor(torch.ones(3))
        elif which == "all_gather_object":
            D.all_gather_object({"rank": info.rank})
        else:
            D.barrier()
    except D.CollectiveTimeout as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        print(f"waited {time.monotonic() - start:.1f} s", flush=True)
        sys.exit(1)
    print("the collective returned", flush=True)
''')

# A job of 2 that only rank 0 ever joins.
ALONE = textwrap.dedent('''
    import sys, time
    import distributed as D

    start = time.monotonic()
    try:
        D.init_distributed(timeout_s=600, rendezvous_timeout_s=float(sys.argv[1]))
    except D.CollectiveTimeout as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        print(f"waited {time.monotonic() - start:.1f} s", flush=True)
        sys.exit(1)
    print("joined alone", flush=True)
''')

COLLECTIVES = {"reduce_tensor": "all_reduce (mean)", "all_gather_object": "all_gather_object",
               "barrier": "barrier"}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Start every hanging job at once (they mostly wait), then collect [returncode, stdout, stderr, seconds] of
    each (once per session: :func:`conftest.made_once`)."""
    def run(tmp):
        (tmp / "script.py").write_text(SCRIPT)
        (tmp / "alone.py").write_text(ALONE)
        started = {}
        for which in COLLECTIVES:
            cmd = [sys.executable, os.path.join(ROOT, "multiproc.py"), "--nproc-per-node", "2", "--log-dir",
                   str(tmp / f"logs_{which}"), str(tmp / "script.py"), which, str(TIMEOUT_S)]
            started[which] = (subprocess.Popen(cmd, cwd=tmp, env=clean_env(2, cpu_only=True), stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, start_new_session=True),
                              time.monotonic())
        alone_env = {**clean_env(2, cpu_only=True), "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port())}
        started["rendezvous"] = (subprocess.Popen([sys.executable, str(tmp / "alone.py"), str(TIMEOUT_S)], cwd=tmp,
                                                  env=alone_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                  text=True, start_new_session=True), time.monotonic())
        results = {}
        try:
            for name, (proc, start) in started.items():
                out, err = proc.communicate(timeout=bound(120))  # a real hang fails here, after killing the job
                results[name] = (proc.returncode, out, err, time.monotonic() - start)
        finally:
            for proc, _ in started.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        return results
    return made_once(tmp_path_factory, "hang_jobs", run)[1]


def waited(stdout: str) -> float:
    match = re.search(r"waited ([\d.]+) s", stdout)
    assert match, stdout
    return float(match.group(1))


@pytest.mark.parametrize("which", list(COLLECTIVES))
def test_a_hung_rank_ends_the_job_with_the_timeout_and_the_rank_named(jobs, which):
    code, out, err, seconds = jobs[which]
    console = out + err
    assert code == 1, console  # rank 0's exit code, passed on by multiproc
    assert seconds < bound(40), f"the job took {seconds:.0f} s to end"
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, console
    assert re.match(rf"ERROR: rank 0: {re.escape(COLLECTIVES[which])} timed out after {TIMEOUT_S} s waiting for "
                    rf"the other 1 rank\(s\) \(process-group timeout {TIMEOUT_S} s\): another rank hung or died",
                    errors[0]), errors[0]
    assert TIMEOUT_S - 0.5 <= waited(out) < TIMEOUT_S + 10, "ended by the process group's timeout, not sooner"
    # Exit 1 as the script says, or SIGABRT (-6): gloo sometimes aborts while tearing down a process group
    # whose collective timed out, after the ERROR line was printed. Either way rank 0 is named as failed.
    assert re.search(r"multiproc: rank 0 failed \(exit code (1|-6)\)", err), console
    assert "stopped the other rank(s): [1]" in err, console
    assert "the collective returned" not in out


def test_a_rank_that_never_starts_times_out_the_rendezvous(jobs):
    code, out, err, seconds = jobs["rendezvous"]
    assert code == 1, out + err
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and re.match(rf"ERROR: rank 0: rendezvous at 127\.0\.0\.1:\d+ timed out after "
                                         rf"\d+ s waiting for the other ranks \(rendezvous timeout {TIMEOUT_S} s\)",
                                         errors[0]), err
    assert TIMEOUT_S - 0.5 <= waited(out) < TIMEOUT_S + 10


# --- the same through train.py ----------------------------------------------------------------------------

def reached_step(metrics: Path, step: int) -> bool:
    """Whether rank 0 has logged ``step`` (complete lines only: the last one may be half written)."""
    text = metrics.read_text() if metrics.exists() else ""
    return any(json.loads(line)["step"] >= step for line in text[:text.rfind("\n") + 1].splitlines())


def test_train_py_names_the_rank_when_another_one_hangs(tmp_path):
    corpus = synth_corpus(tmp_path / "corpus", n=10)
    out = tmp_path / "out"
    timeout_s = 10
    cmd = [sys.executable, "multiproc.py", "--nproc-per-node", "2", "--log-dir", str(out / "logs"), "train.py",
           "--config", "config.json", "--model", TEST_MODEL, "--tiny", "--max-steps", "1000", "--dataset-path",
           str(corpus), "--output-dir", str(out), "--set", "data.num_workers=0", "--set", "train.log_interval=1",
           "--set", "train.val_interval=100000", "--set", "train.checkpoint_interval=100000",
           "--set", f"train.dist_timeout_s={timeout_s}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(2, cpu_only=True), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + bound(120)
        while not reached_step(out / "metrics.jsonl", 1):
            assert proc.poll() is None and time.monotonic() < deadline, "training did not reach step 1"
            time.sleep(0.2)
        pids = rank_pids(proc.pid)
        os.kill(pids[1], signal.SIGSTOP)  # rank 1 hangs: it will never reach the next gradient all-reduce
        stopped = pids[1]
        hung_at = time.monotonic()
        while pids[0] in rank_pids(proc.pid).values() and time.monotonic() < hung_at + timeout_s + 30:
            time.sleep(0.2)
        rank0_ended_after = time.monotonic() - hung_at
        os.kill(stopped, signal.SIGCONT)  # let it take the launcher's SIGTERM
        stdout, stderr = proc.communicate(timeout=bound(60))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    console = stdout + stderr
    assert rank0_ended_after < timeout_s + 25, f"rank 0 was still waiting {rank0_ended_after:.0f} s after the hang"
    assert proc.returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and "rank 0" in errors[0] and f"(process-group timeout {timeout_s} s)" in errors[0], \
        console
    assert "Traceback" not in console, console


def test_collective_converts_only_communication_errors(monkeypatch):
    """What ``collective()`` turns into a CollectiveError (in this process: no collective runs here)."""
    monkeypatch.setattr("distributed._timeout_s", 600.0)  # the process group's timeout, where collective() reads it
    with pytest.raises(RuntimeError, match="out of memory") as info:  # not a communication error: unchanged
        with D.collective("gradient all-reduce"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not isinstance(info.value, D.CollectiveError)
    with pytest.raises(D.CollectiveError) as info:  # a refused connect says "timed out" at once: not a timeout
        with D.collective("rendezvous", rank=3):
            raise RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
                               "Connection refused, remote=[127.0.0.1]:4242")
    assert not isinstance(info.value, D.CollectiveTimeout)
    assert str(info.value).startswith("rank 3: rendezvous failed after 0.0 s (another rank may have died): Gloo ")
    assert isinstance(info.value, torch.distributed.DistBackendError)  # what code catching torch's error expects
    with pytest.raises(D.CollectiveError, match=r"^rank 0: barrier failed after .* Connection closed by peer"):
        with D.collective("barrier"):
            raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5555")
