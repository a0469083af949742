"""Which launcher started this process (:func:`detect_launcher_env`: torchrun, SLURM, OpenMPI), a launcher inside a
launcher refused, the CPUs a process may use, and the kernel's signal when the launcher dies. Sources:
https://pytorch.org/docs/stable/elastic/run.html,
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES,
https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)
_HOST = r"(?:[^\[\],]+|\[[^\[\]]*\])+"  # one name of a SLURM node list: text and bracket groups
LAUNCHERS = (  # the first whose rank and world size are set started this process: its rank, local rank, world size
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"))


def _int_var(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list, as ``scontrol show hostnames`` lists it: ``"gpu[003-005],gpu010"`` ->
    ``"gpu003"`` (each bracket group's first number, zero padding kept; ``"r[1-2]n[1,3]"`` -> ``"r1n1"``). Raises
    ValueError for an empty list, an empty name, unbalanced brackets or a bad range (``"n[5-3]"``)."""
    text = nodelist.strip()
    items = [item.partition("-") for group in re.findall(r"\[([^\]]*)\]", text) for item in group.split(",")]
    bad_range = any(not lo.isdigit() or (sep and not (hi.isdigit() and int(hi) >= int(lo))) for lo, sep, hi in items)
    if bad_range or not re.fullmatch(rf"{_HOST}(?:,{_HOST})*", text):
        raise ValueError(f"SLURM node list {nodelist!r} is malformed (an empty name, unbalanced brackets, a bad range)")
    return re.sub(r"\[(\d+)[^\]]*\]", r"\1", re.match(_HOST, text).group())


def slurm_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a SLURM job step without ``MASTER_PORT``: 15000..31999, below Linux's ephemeral ports,
    from the job *and* step ids (two steps of one allocation differ unless their ids differ by a multiple of 17000)."""
    return 15000 + (job_id * 1_000_003 + step_id) % 17000


def detect_launcher_env(env: Mapping[str, str]) -> dict:
    """``{"launcher", "rank", "local_rank", "world_size", "master_addr", "master_port"}`` of the first of
    :data:`LAUNCHERS` whose variables ``env`` holds (none: rank 0 of 1, no address). Raises ValueError: a variable that
    is no integer, ``RANK`` without ``WORLD_SIZE`` or the reverse, inconsistent values, several processes without an
    address."""
    master_addr = env.get("MASTER_ADDR") or None
    master_port: Optional[int] = _int_var(env, "MASTER_PORT") if env.get("MASTER_PORT") else None
    if ("RANK" in env) != ("WORLD_SIZE" in env):
        missing, given = ("WORLD_SIZE", "RANK") if "RANK" in env else ("RANK", "WORLD_SIZE")
        raise ValueError(f"{missing} is not set although {given} is")
    found = [launcher for launcher in LAUNCHERS if launcher[1] in env and launcher[3] in env]
    if not found:
        return {"launcher": "none", "rank": 0, "local_rank": 0, "world_size": 1,
                "master_addr": None, "master_port": None}
    launcher, rank_var, local_var, size_var = found[0]
    rank, world_size = _int_var(env, rank_var), _int_var(env, size_var)
    local_rank = _int_var(env, local_var) if local_var in env else (rank if launcher == "torchrun" else 0)
    if launcher == "slurm":
        master_addr, master_port = _slurm_address(env, world_size, master_addr, master_port)
    if launcher == "openmpi" and world_size > 1 and (master_addr is None or master_port is None):
        raise ValueError("OpenMPI launch needs MASTER_ADDR and MASTER_PORT in the environment "
                         "(e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...)")
    for bad, message in ((world_size < 1, f"world size must be >= 1, got {world_size}"),
                         (not 0 <= rank < world_size, f"rank {rank} is outside 0..{world_size - 1}"),
                         (local_rank < 0, f"local rank must be >= 0, got {local_rank}"),
                         (world_size > 1 and (master_addr is None or master_port is None),
                          f"world size {world_size} needs MASTER_ADDR and MASTER_PORT"),
                         (master_port is not None and not 0 < master_port < 65536,
                          f"MASTER_PORT must be in 1..65535, got {master_port}")):
        if bad:
            raise ValueError(f"{launcher}: {message}")
    return {"launcher": launcher, "rank": rank, "local_rank": local_rank, "world_size": world_size,
            "master_addr": master_addr, "master_port": master_port}


def _slurm_address(env: Mapping[str, str], world_size: int, master_addr: Optional[str],
                   master_port: Optional[int]) -> tuple[Optional[str], int]:
    """The rendezvous address of a SLURM step: ``MASTER_ADDR``/``MASTER_PORT`` when given, else :func:`first_host` of
    ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``/``SLURM_NODELIST``) and :func:`slurm_port` of the job and step
    ids (29500 without a job id). Raises ValueError for several tasks, no ``MASTER_ADDR`` and no node list."""
    if master_addr is None and world_size > 1:
        nodelist = next((env[v] for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)),
                        None)
        if nodelist is None:
            raise ValueError("SLURM launch: none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, "
                             "SLURM_NODELIST is set and MASTER_ADDR is not given")
        master_addr = first_host(nodelist)
    if master_port is None:
        step = next((v for v in ("SLURM_STEP_ID", "SLURM_STEPID") if env.get(v)), None)
        master_port = (slurm_port(_int_var(env, "SLURM_JOB_ID"), _int_var(env, step) if step else 0)
                       if env.get("SLURM_JOB_ID") else 29500)
    return master_addr, master_port


def available_cpus() -> float:
    """CPUs this process may use: its affinity mask (``taskset``, a scheduler's binding), capped by the cgroup's CPU
    quota (a container's or scheduler's grant; cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), not the host's cores."""
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            words = Path(quota_file).read_text().split()
            quota, period = words[0], words[1] if period_file is None else Path(period_file).read_text().strip()
        except (OSError, IndexError):  # no such cgroup file here (another cgroup version, not Linux)
            continue
        if quota not in ("max", "-1") and float(period) > 0:
            cpus = min(cpus, float(quota) / float(period))
        break
    return max(cpus, 1.0)


def cpu_threads(local_world_size: int = 1) -> int:
    """Intra-op threads for one of ``local_world_size`` processes on this machine: their fair share of
    :func:`available_cpus`, at least 1 (PyTorch's default, every core of the host, is slow in a small container)."""
    return max(1, int(available_cpus() // max(local_world_size, 1)))


def check_not_launched(environ: Mapping[str, str], launchers: str = "torchrun") -> None:
    """Refuse a second launcher inside a first: with ``LOCAL_RANK`` set (not blank) this process is one a launcher
    (``launchers``) started, which must run ``train.py`` itself. Raises ValueError naming both."""
    local_rank = environ.get("LOCAL_RANK", "").strip()
    if local_rank:
        raise ValueError(f"LOCAL_RANK={local_rank} is set: this process is already one of the processes a launcher "
                         f"started ({launchers}); run train.py itself there, not multiproc.py")


def die_with_launcher() -> None:
    """Have the kernel send SIGTERM to this process when its launcher dies (prctl(2) ``PR_SET_PDEATHSIG``): torchrun
    starts every rank in its own session, so a launcher killed with SIGKILL would leave its ranks training. Only under
    torchrun (``TORCHELASTIC_RUN_ID``) on Linux; at once when the parent is no longer ``MULTIPROC_PID``."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # 1: PR_SET_PDEATHSIG in <linux/prctl.h>
        logger.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return
    launcher = os.environ.get("MULTIPROC_PID", "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(os.getpid(), signal.SIGTERM)


def record_failure(line: str, lost_peer: Optional[str] = None) -> None:
    """Leave this rank's ``ERROR:`` line (without the prefix) for ``multiproc.py``'s summary in torchrun's
    ``TORCHELASTIC_ERROR_FILE`` (nothing without it), as torchrun writes it (``{"message", "timestamp"}``).
    ``lost_peer``: the collective that failed when the rank merely lost a peer (another rank's error is the cause)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        record = {"message": line, "timestamp": int(time.time()), "lost_peer": lost_peer}
        try:
            Path(path).write_text(json.dumps(record))
        except OSError as err:  # the summary then says less; the ERROR line itself is printed
            logger.debug("cannot write %s: %s", path, err)
