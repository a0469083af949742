"""Tests of distributed.py and of the launcher-environment parsing it uses (utils/launch.py), and real 2-process gloo
jobs on CPU.

The multi-process tests start two real Python processes with the variables a launcher would set
(torchrun, SLURM, OpenMPI) and compare what they computed with a single-process computation.
"""

import os
import runpy
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import LAUNCHER_PREFIXES, LAUNCHER_VARS, ROOT, bound, clean_env, finish_all, free_port, made_once
from torch import nn

import distributed as D
from utils.launch import available_cpus, cpu_threads, detect_launcher_env, first_host, slurm_port

# Run by each rank: python worker.py <mode> <out_dir>. Also imported by the test (runpy) for
# make_model / make_data, so the reference and the ranks build exactly the same things.
WORKER = textwrap.dedent('''
    import sys
    import torch
    from torch import nn

    N_BATCH = 8

    def make_model(seed):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()

    def make_data():
        g = torch.Generator().manual_seed(1234)
        return (torch.randn(N_BATCH, 5, generator=g, dtype=torch.float64),
                torch.randn(N_BATCH, 3, generator=g, dtype=torch.float64))

    def loss_fn(model, x, y):
        return ((model(x) - y) ** 2).mean()

    def main(mode, out_dir):
        import distributed as D
        info = D.init_distributed(timeout_s=60)
        again = D.init_distributed(timeout_s=60)
        result = {"info": (info.rank, info.local_rank, info.world_size, str(info.device),
                           info.backend, info.is_main),
                  "idempotent": again == info,
                  "helpers": (info.rank, D.get_world_size(), info.is_main)}
        t = torch.tensor([info.rank + 1.0, 10.0 * (info.rank + 1)])
        ops = ("mean", "sum", "max", "min")
        result["reduced"] = {op: D.reduce_tensor(t, op).tolist() for op in ops}
        result["input_unchanged"] = t.tolist() == [info.rank + 1.0, 10.0 * (info.rank + 1)]
        result["int_sum"] = D.reduce_tensor(torch.tensor([info.rank + 1]), "sum").tolist()
        computed = []  # the ranks that ran what from_rank0 was given
        def refuse():
            computed.append(info.rank)
            raise FileExistsError(17, "rank 0's reason", "out")
        result["from_rank0"] = D.from_rank0(lambda: computed.append(info.rank) or {"rank": info.rank}, ValueError)
        try:
            D.from_rank0(refuse, ValueError, OSError)
        except OSError as err:
            result["rank0_error"] = (type(err).__name__, str(err))
        result["computed"] = computed
        if mode == "full":
            model = make_model(seed=100 + info.rank)  # ranks differ until DDP broadcasts rank 0's
            before = [p.detach().clone() for p in model.parameters()]
            ddp = D.apply_gradient_allreduce(model, bucket_cap_mb=1)
            result["wrapped"] = type(ddp).__name__
            result["unwrapped_is_model"] = D.unwrap_model(ddp) is model
            result["broadcast_changed_params"] = any(
                not torch.equal(a, b) for a, b in zip(before, model.parameters()))
            x, y = make_data()
            half = N_BATCH // info.world_size
            rows = slice(info.rank * half, (info.rank + 1) * half)
            loss_fn(ddp, x[rows], y[rows]).backward()
            result["grads"] = [p.grad.detach().clone() for p in model.parameters()]
        D.barrier()
        D.cleanup()
        result["cleaned_up"] = not torch.distributed.is_initialized()
        torch.save(result, f"{out_dir}/rank{info.rank}.pt")

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
''')


def run_two_ranks(tmp_path, rank_env, mode: str) -> None:
    """Start 2 real processes with the variables ``rank_env(rank, port)`` returns, in ``tmp_path``, and wait until both
    have exited 0 (:func:`rank_results` reads what they saved)."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    port = free_port()
    procs = []
    for rank in range(2):
        env = clean_env(2, cpu_only=True, **rank_env(rank, port))  # the workers' models are CPU modules
        procs.append(subprocess.Popen([sys.executable, str(worker), mode, str(tmp_path)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = finish_all(procs, bound(120))
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out}"


def rank_results(folder) -> list:
    """What each rank of :func:`run_two_ranks` saved in ``folder``, rank 0 first."""
    return [torch.load(folder / f"rank{r}.pt") for r in range(2)]


def torchrun_env(rank, port):
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    folder, _ = made_once(tmp_path_factory, "torchrun_job", lambda out: run_two_ranks(out, torchrun_env, "full"))
    return rank_results(folder)


# ----------------------------------------------------------------------- real 2-rank jobs

def test_ddp_gradients_equal_single_process_full_batch(torchrun_job, tmp_path):
    """2 ranks x half the batch through apply_gradient_allreduce == 1 process x whole batch."""
    (tmp_path / "w.py").write_text(WORKER)
    w = runpy.run_path(str(tmp_path / "w.py"))
    model = w["make_model"](seed=100)
    x, y = w["make_data"]()
    w["loss_fn"](model, x, y).backward()
    reference = [p.grad for p in model.parameters()]

    for rank, result in enumerate(torchrun_job):
        assert result["wrapped"] == "DistributedDataParallel"
        assert result["unwrapped_is_model"]
        assert len(result["grads"]) == len(reference)
        for got, want in zip(result["grads"], reference):
            assert got.shape == want.shape
            assert (got - want).abs().max().item() < 1e-6, f"rank {rank}"
    assert not torchrun_job[0]["broadcast_changed_params"]  # rank 0's weights are the source
    assert torchrun_job[1]["broadcast_changed_params"]      # rank 1 received them


def test_init_distributed_in_two_real_processes(torchrun_job):
    for rank, result in enumerate(torchrun_job):
        assert result["info"] == (rank, rank, 2, "cpu", "gloo", rank == 0)
        assert result["helpers"] == (rank, 2, rank == 0)
        assert result["idempotent"]
        assert result["cleaned_up"]


def test_reduce_tensor_over_two_ranks(torchrun_job):
    for result in torchrun_job:
        assert result["reduced"] == {"mean": [1.5, 15.0], "sum": [3.0, 30.0],
                                     "max": [2.0, 20.0], "min": [1.0, 10.0]}
        assert result["input_unchanged"]
        assert result["int_sum"] == [3]


def test_rank_0s_value_or_error_reaches_every_rank(torchrun_job):
    """``from_rank0``: what rank 0 computed, it alone, on every rank; an error of the kinds named that it raised, raised
    on every rank with its type and message."""
    for result in torchrun_job:
        assert result["from_rank0"] == {"rank": 0}
        assert result["rank0_error"] == ("FileExistsError", "[Errno 17] rank 0's reason: 'out'")
    assert [result["computed"] for result in torchrun_job] == [[0, 0], []]


@pytest.mark.slow
def test_real_init_from_slurm_and_openmpi_variables(tmp_path):
    """Rank 0 is placed by SLURM's variables, rank 1 by OpenMPI's: both must agree on the job."""
    def mixed_env(rank, port):
        if rank == 0:
            return {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
                    "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "127.0.0.[1]",  # -> 127.0.0.1
                    "MASTER_PORT": str(port)}
        return {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    run_two_ranks(tmp_path, mixed_env, "init")
    results = rank_results(tmp_path)
    assert [r["info"] for r in results] == [(0, 0, 2, "cpu", "gloo", True),
                                            (1, 1, 2, "cpu", "gloo", False)]
    assert results[0]["reduced"]["sum"] == results[1]["reduced"]["sum"] == [3.0, 30.0]


# ----------------------------------------------------------------------- single process

@pytest.fixture
def no_launcher(monkeypatch):
    for key in list(os.environ):
        if key in LAUNCHER_VARS or key.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(key)


def test_single_process_without_launcher(no_launcher):
    info = D.init_distributed()
    assert (info.rank, info.local_rank, info.world_size, info.backend) == (0, 0, 1, None)
    assert info.is_main and info.backend is None
    assert info.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert not torch.distributed.is_initialized()
    assert D.get_world_size() == 1
    D.barrier()
    D.cleanup()
    assert "RANK" not in os.environ


def test_world_size_one_from_a_launcher_makes_no_process_group(no_launcher, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # e.g. multiproc.py --nproc-per-node 1
    info = D.init_distributed()
    assert (info.rank, info.world_size, info.backend) == (0, 1, None)
    assert not torch.distributed.is_initialized()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_local_rank_beyond_visible_gpus_is_refused(no_launcher, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", str(torch.cuda.device_count()))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(RuntimeError, match="GPU\\(s\\) are visible"):
        D.init_distributed()


def test_single_process_helpers_are_identities(no_launcher):
    t = torch.tensor([1.0, -2.0], requires_grad=True)
    for op in ("mean", "sum", "max", "min"):
        out = D.reduce_tensor(t, op)
        assert torch.equal(out, t.detach()) and out is not t
        assert not out.requires_grad and out.data_ptr() != t.data_ptr()
    model = nn.Linear(2, 2)
    assert D.apply_gradient_allreduce(model) is model
    assert D.unwrap_model(model) is model
    assert D.unwrap_model(torch.compile(model)) is model  # compile is lazy: nothing is built here


def test_reduce_tensor_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown op 'avg'"):
        D.reduce_tensor(torch.ones(2), "avg")
    with pytest.raises(TypeError, match="floating-point"):
        D.reduce_tensor(torch.ones(2, dtype=torch.int64), "mean")
    with pytest.raises(TypeError, match="torch.Tensor"):
        D.reduce_tensor([1.0, 2.0], "sum")


def test_init_distributed_rejects_bad_timeout(no_launcher):
    with pytest.raises(ValueError, match="timeout_s"):
        D.init_distributed(timeout_s=0)


# ----------------------------------------------------------------------- launcher parsing

def test_detect_torchrun():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29400", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}  # torchrun wins
    assert detect_launcher_env(env) == {"launcher": "torchrun", "rank": 3, "local_rank": 1,
                                        "world_size": 4, "master_addr": "10.0.0.1",
                                        "master_port": 29400}


def test_detect_slurm_with_nodelist_expansion():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "123456",
           "SLURM_NODELIST": "gpu[003-005],gpu010"}
    got = detect_launcher_env(env)
    assert got == {"launcher": "slurm", "rank": 5, "local_rank": 1, "world_size": 8,
                   "master_addr": "gpu003", "master_port": slurm_port(123456, 0)}
    # the step's node list wins over the job's; MASTER_ADDR / MASTER_PORT override both
    env["SLURM_STEP_NODELIST"] = "node[07,01-02]"
    assert detect_launcher_env(env)["master_addr"] == "node07"
    env.update(MASTER_ADDR="head", MASTER_PORT="31000")
    got = detect_launcher_env(env)
    assert (got["master_addr"], got["master_port"]) == ("head", 31000)


def test_slurm_port_differs_per_step_and_stays_below_the_ephemeral_range():
    """Two steps of one job running at once must not share a port; ports stay in 15000..31999."""
    ports = {(job, step): slurm_port(job, step) for job in (1, 19999, 123456, 2**31 - 1) for step in range(8)}
    assert all(15000 <= port < 32768 for port in ports.values()), ports
    for job in (1, 19999, 123456, 2**31 - 1):
        assert len({ports[(job, step)] for step in range(8)}) == 8, job
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "19999", "SLURM_NODELIST": "n1"}
    first = detect_launcher_env({**env, "SLURM_STEP_ID": "0"})["master_port"]
    second = detect_launcher_env({**env, "SLURM_STEP_ID": "1"})["master_port"]
    assert first != second and max(first, second) < 32768
    override = detect_launcher_env({**env, "MASTER_ADDR": "head", "MASTER_PORT": "40000"})
    assert (override["master_addr"], override["master_port"]) == ("head", 40000)


def test_detect_openmpi():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    assert detect_launcher_env(env) == {"launcher": "openmpi", "rank": 2, "local_rank": 0,
                                        "world_size": 4, "master_addr": "h0",
                                        "master_port": 29500}
    del env["MASTER_ADDR"]
    with pytest.raises(ValueError, match="OpenMPI launch needs MASTER_ADDR and MASTER_PORT"):
        detect_launcher_env(env)


def test_detect_none():
    assert detect_launcher_env({"PATH": "/bin"}) == {
        "launcher": "none", "rank": 0, "local_rank": 0, "world_size": 1,
        "master_addr": None, "master_port": None}


@pytest.mark.parametrize("env, message", [
    ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "rank 2 is outside"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "needs MASTER_ADDR and MASTER_PORT"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "1..65535"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_STEP_NODELIST"),
])
def test_detect_rejects_bad_environments(env, message):
    with pytest.raises(ValueError, match=message):
        detect_launcher_env(env)


@pytest.mark.parametrize("nodelist, host", [
    ("node01", "node01"),
    ("node[01-04,07]", "node01"),
    ("gpu[003-005],gpu010", "gpu003"),
    ("node[07,01-02]", "node07"),
    ("a,b[9-11]", "a"),
    ("r[1-2]n[1,3]", "r1n1"),
])
def test_first_host_of_a_nodelist(nodelist, host):
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "node[01-02", "node01]", "n[5-3]", "n[a-b]", "a,,b", "a,b[3-1]", "n[[1]]"])
def test_first_host_rejects_a_malformed_nodelist(nodelist):
    with pytest.raises(ValueError, match="SLURM node list"):
        first_host(nodelist)


def test_cpu_threads_are_a_fair_share_of_the_cpus_this_process_may_use():
    """One process bound to one CPU (as taskset or a scheduler binds it) gets one thread, whatever the host has."""
    script = ("import os\nfrom utils.launch import available_cpus, cpu_threads\n"
              "os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
              "print(available_cpus(), cpu_threads(1), cpu_threads(4))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=clean_env(1), capture_output=True, text=True,
                          timeout=bound(60, 1))
    assert done.returncode == 0 and done.stdout.split() == ["1.0", "1", "1"], done.stderr
    assert cpu_threads(1) == max(1, int(available_cpus())) and available_cpus() <= (os.cpu_count() or 1)
