"""Which launcher started this process, read from the environment in one place: per process
(:func:`detect_launcher_env`: torchrun, SLURM, OpenMPI), a launcher inside a launcher refused
(:func:`check_not_launched`), the CPUs a process may use, and the kernel's signal when the launcher dies. Sources:
https://pytorch.org/docs/stable/elastic/run.html,
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES,
https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_MASTER_PORT = 29500
_SLURM_PORT_BASE, _SLURM_PORT_SPAN = 15000, 17000  # ports 15000..31999: below Linux's ephemeral range (32768-)


def _int_var(environ: Mapping[str, str], name: str) -> int:
    value = environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list as ``scontrol show hostnames`` does (https://slurm.schedmd.com/scontrol.html), without
    SLURM: ``"node[01-04,07]"`` -> ``["node01", "node02", "node03", "node04", "node07"]``, zero padding kept (the lower
    bound's width); several bracket groups in one name (``"r[1-2]n[1-2]"``) expand to their product.

    Raises:
        ValueError: the list is empty, brackets are unbalanced, or a range is malformed (``"n[5-3]"``, ``"n[a-b]"``).
    """
    text = nodelist.strip()
    if not text:
        raise ValueError("SLURM node list is empty")
    hosts: list[str] = []
    for name in _split_outside_brackets(text, nodelist):
        if not name:
            raise ValueError(f"SLURM node list {nodelist!r} has an empty host name")
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
            choices = [literal + s for s in _expand_range_group(group, nodelist)] if group else [literal]
            expanded = [prefix + c for prefix in expanded for c in choices]
        hosts.extend(expanded)
    return hosts


def _split_outside_brackets(text: str, nodelist: str) -> list[str]:
    """``text`` split on the commas that are not inside brackets; ValueError for nested or unbalanced brackets."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth > 1:
            raise ValueError(f"SLURM node list {nodelist!r} has nested brackets")
        if depth < 0:
            raise ValueError(f"SLURM node list {nodelist!r} has an unmatched ']'")
        if ch == "," and depth == 0:
            names.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"SLURM node list {nodelist!r} has an unmatched '['")
    return [*names, text[start:]]


def _expand_range_group(group: str, nodelist: str) -> list[str]:
    out = []
    for item in group.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"SLURM node list {nodelist!r} has a bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"SLURM node list {nodelist!r} has a decreasing range {item!r}")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def slurm_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a SLURM job step without ``MASTER_PORT``: 15000..31999, below Linux's ephemeral ports,
    from the job *and* step ids (two steps of one allocation differ unless their ids differ by a multiple of 17000)."""
    return _SLURM_PORT_BASE + (job_id * 1_000_003 + step_id) % _SLURM_PORT_SPAN


def _first_slurm_host(nodelist: str, use_scontrol: bool) -> str:
    """First host of a SLURM node list, by ``scontrol show hostnames`` if present, else parsed."""
    scontrol = shutil.which("scontrol") if use_scontrol else None
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            logger.debug("scontrol failed (%s); parsing the node list ourselves", err)
        else:
            if done.returncode == 0 and done.stdout.split():
                return done.stdout.split()[0]
    return expand_nodelist(nodelist)[0]


def detect_launcher_env(environ: Mapping[str, str], use_scontrol: bool = True) -> dict:
    """Rank, local rank, world size and rendezvous address from ``environ`` (not modified), of the first launcher
    whose variables are present (so torchrun inside an ``srun`` step is torchrun):

    * torchrun (``multiproc.py``, a framework that starts the processes itself): ``RANK``, ``WORLD_SIZE``,
      ``LOCAL_RANK`` (default ``RANK``).
    * SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``; without ``MASTER_ADDR``/``MASTER_PORT``
      the address of :func:`_slurm_address` (``use_scontrol``: expand the node list with ``scontrol`` on ``PATH``).
    * OpenMPI (``mpirun -x MASTER_ADDR -x MASTER_PORT``): ``OMPI_COMM_WORLD_RANK``, ``..._LOCAL_RANK``, ``..._SIZE``.
    * none: a plain single process (rank 0 of 1).

    Returns ``{"launcher": "torchrun" | "slurm" | "openmpi" | "none", "rank", "local_rank", "world_size",
    "master_addr", "master_port"}``; the address and port (``MASTER_ADDR``/``MASTER_PORT``) are ``None`` only alone.

    Raises:
        ValueError: a variable is not an integer, inconsistent values (``rank >= world_size``, negative, port out of
            range, :func:`_torchrun_ranks`), or a multi-process launch without ``MASTER_ADDR``/``MASTER_PORT``.
    """
    env = environ
    master_addr = env.get("MASTER_ADDR") or None
    master_port: Optional[int] = _int_var(env, "MASTER_PORT") if env.get("MASTER_PORT") else None
    if "RANK" in env or "WORLD_SIZE" in env:
        launcher, (rank, local_rank, world_size) = "torchrun", _torchrun_ranks(env)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher, (rank, local_rank, world_size) = "slurm", _ranks(env, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
        master_addr, master_port = _slurm_address(env, world_size, master_addr, master_port, use_scontrol)
    elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        launcher, (rank, local_rank, world_size) = "openmpi", _ranks(
            env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE")
        if world_size > 1 and (master_addr is None or master_port is None):
            raise ValueError("OpenMPI launch needs MASTER_ADDR and MASTER_PORT in the environment "
                             "(e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500 ...)")
    else:
        return {"launcher": "none", "rank": 0, "local_rank": 0, "world_size": 1,
                "master_addr": None, "master_port": None}
    _check_topology(launcher, rank, local_rank, world_size, master_addr, master_port)
    return {"launcher": launcher, "rank": rank, "local_rank": local_rank, "world_size": world_size,
            "master_addr": master_addr, "master_port": master_port}


def _ranks(env: Mapping[str, str], rank: str, local_rank: str, world_size: str) -> tuple[int, int, int]:
    """``(rank, local rank, world size)`` from the variables of these names (local rank 0 when unset)."""
    return _int_var(env, rank), _int_var(env, local_rank) if local_rank in env else 0, _int_var(env, world_size)


def _torchrun_ranks(env: Mapping[str, str]) -> tuple[int, int, int]:
    """torchrun's ``RANK``, ``LOCAL_RANK`` (``RANK`` when unset) and ``WORLD_SIZE``.

    Raises:
        ValueError: one of ``RANK``/``WORLD_SIZE`` without the other.
    """
    missing = [v for v in ("RANK", "WORLD_SIZE") if v not in env]
    if missing:
        raise ValueError(f"{missing[0]} is not set although {'WORLD_SIZE' if missing[0] == 'RANK' else 'RANK'} is")
    rank, world_size = _int_var(env, "RANK"), _int_var(env, "WORLD_SIZE")
    local_rank = _int_var(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    return rank, local_rank, world_size


def _slurm_address(env: Mapping[str, str], world_size: int, master_addr: Optional[str], master_port: Optional[int],
                   use_scontrol: bool) -> tuple[Optional[str], int]:
    """The rendezvous address of a SLURM step: ``MASTER_ADDR``/``MASTER_PORT`` when given, else the first host of
    ``SLURM_STEP_NODELIST`` (else ``SLURM_JOB_NODELIST``/``SLURM_NODELIST``) and :func:`slurm_port` of the job and step
    ids (29500 without a job id). Raises ValueError for several tasks, no ``MASTER_ADDR`` and no node list."""
    if master_addr is None and world_size > 1:
        nodelist = next((env[v] for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)),
                        None)
        if nodelist is None:
            raise ValueError("SLURM launch: none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, "
                             "SLURM_NODELIST is set and MASTER_ADDR is not given")
        master_addr = _first_slurm_host(nodelist, use_scontrol)
    if master_port is None:
        step = next((v for v in ("SLURM_STEP_ID", "SLURM_STEPID") if env.get(v)), None)
        master_port = (slurm_port(_int_var(env, "SLURM_JOB_ID"), _int_var(env, step) if step else 0)
                       if env.get("SLURM_JOB_ID") else DEFAULT_MASTER_PORT)
    return master_addr, master_port


def _check_topology(launcher: str, rank: int, local_rank: int, world_size: int, master_addr: Optional[str],
                    master_port: Optional[int]) -> None:
    """Refuse inconsistent launcher values (one line naming the launcher)."""
    if world_size < 1:
        raise ValueError(f"{launcher}: world size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"{launcher}: rank {rank} is outside 0..{world_size - 1}")
    if local_rank < 0:
        raise ValueError(f"{launcher}: local rank must be >= 0, got {local_rank}")
    if world_size > 1 and (master_addr is None or master_port is None):
        raise ValueError(f"{launcher}: world size {world_size} needs MASTER_ADDR and MASTER_PORT")
    if master_port is not None and not 0 < master_port < 65536:
        raise ValueError(f"{launcher}: MASTER_PORT must be in 1..65535, got {master_port}")


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
    """Intra-op threads for one of ``local_world_size`` processes computing on this machine's CPUs: their fair share of
    :func:`available_cpus`, at least 1 (PyTorch's default, every core of the host, runs a 2-CPU container of a 64-core
    host ten times slower)."""
    return max(1, int(available_cpus() // max(local_world_size, 1)))


def check_not_launched(environ: Mapping[str, str], launchers: str = "torchrun") -> None:
    """Refuse a second launcher inside a first: with ``LOCAL_RANK`` set this process is one that a launcher
    (``launchers``) started, which must run ``train.py`` itself; ``multiproc.py`` there would start another world.

    Raises:
        ValueError: ``LOCAL_RANK`` is set (not blank), naming it and ``launchers``.
    """
    local_rank = environ.get("LOCAL_RANK", "").strip()
    if local_rank:
        raise ValueError(f"LOCAL_RANK={local_rank} is set: this process is already one of the processes a launcher "
                         f"started ({launchers}); run train.py itself there, not multiproc.py")


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its launcher dies (prctl(2) ``PR_SET_PDEATHSIG``): torchrun
    starts every rank in its own session, so a launcher killed with SIGKILL would leave its ranks training
    unsupervised; on SIGTERM a rank finishes its step, rank 0 saves, and it exits. Armed only under a torchrun-style
    launcher (``TORCHELASTIC_RUN_ID``); when the parent is no longer ``MULTIPROC_PID`` (``multiproc.py`` died before
    this call), ``sig`` is sent at once. Returns whether it was armed (not off Linux, nor when ``prctl`` failed)."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        logger.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    launcher = os.environ.get("MULTIPROC_PID", "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        os.kill(os.getpid(), sig)
    return True


def record_failure(line: str, lost_peer: Optional[str] = None) -> None:
    """Leave this rank's ``ERROR:`` line (without the prefix) for ``multiproc.py`` in the file torchrun names in
    ``TORCHELASTIC_ERROR_FILE`` (nothing without it), in torchrun's own format (``{"message", "timestamp"}``), where the
    launcher's summary reads it: rank 0 prints to the console, which the launcher does not read. ``lost_peer``: the
    collective that failed when the rank merely lost a peer (then another rank's error is the cause)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        record = {"message": line, "timestamp": int(time.time()), "lost_peer": lost_peer}
        try:
            Path(path).write_text(json.dumps(record))
        except OSError as err:  # the summary then says less; the ERROR line itself is printed
            logger.debug("cannot write %s: %s", path, err)
