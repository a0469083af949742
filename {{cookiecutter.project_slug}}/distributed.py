"""Multi-process (data-parallel) training helpers with NVIDIA's multi-GPU names, done by ``torch.distributed``
(``init_process_group``, DDP, ``all_reduce``). In a script started by ``multiproc.py``
(torchrun), ``srun`` or ``mpirun``::

    info = init_distributed()                 # reads the launcher's environment (utils/launch.py)
    model = apply_gradient_allreduce(MyNet().to(info.device))
    loss_for_logging = reduce_tensor(loss.detach())   # mean over all ranks
    if info.is_main:
        torch.save(unwrap_model(model).state_dict(), "checkpoint.pt")
    cleanup()

Every helper is safe in a plain single process (no launcher, world size 1): nothing is initialised and the helpers are
identities. Sources: https://pytorch.org/docs/stable/distributed.html, https://pytorch.org/docs/stable/notes/ddp.html.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import logging
import os
import sys
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from utils.collectives import CollectiveError as CollectiveError  # re-exported: distributed is the one face
from utils.collectives import CollectiveTimeout as CollectiveTimeout
from utils.collectives import collective, remember_timeout
from utils.launch import _int_var, detect_launcher_env, die_with_launcher
from utils.parts import optional_part

logger = logging.getLogger(__name__)


# "mean" is a sum divided by the world size (ReduceOp.AVG is NCCL-only)
_REDUCE_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job: global ``rank`` (``0 <= rank < world_size``), ``local_rank`` (its GPU's
    index on this node), ``world_size`` (1 for a plain process), ``device`` (``cuda:<local_rank>`` or ``cpu``) and the
    process group's ``backend`` (``"nccl"``/``"gloo"``; ``None`` without a process group)."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: Optional[str]

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that logs, validates and saves checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when a process group exists (world size > 1)."""
        return self.backend is not None


def _select_device(local_rank: int) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise RuntimeError(f"LOCAL_RANK={local_rank} but only {count} GPU(s) are visible "
                           f"(CUDA_VISIBLE_DEVICES={visible}); start at most {count} processes per node")
    # Before init_process_group: otherwise every rank's NCCL/CUDA context lands on GPU 0.
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


RENDEZVOUS_FLOOR_S = 300.0  # the shortest default rendezvous timeout: ranks start minutes apart (CUDA, image pulls)


def init_distributed(backend: Optional[str] = None, timeout_s: float = 1800,
                     rendezvous_timeout_s: Optional[float] = None) -> DistInfo:
    """Join the job described by the launcher's environment (:func:`utils.launch.detect_launcher_env`).

    With world size > 1: sets the device (``cuda:<local_rank>`` or ``cpu``), exports ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and calls ``init_process_group`` (``backend``: default NCCL with
    CUDA, bound to this GPU by ``device_id``, else gloo). An existing group (an earlier call's, Ray Train's) is used as
    it is. ``timeout_s``: seconds a collective waits for the other ranks before failing. ``rendezvous_timeout_s``:
    seconds to wait for every rank to start, default ``max(timeout_s, RENDEZVOUS_FLOOR_S)`` (under SLURM start with
    ``srun``, or rank 0 of ``sbatch --ntasks=N`` waits this long for ranks that never start). Under torchrun the
    process first arranges to get SIGTERM if the launcher dies.

    Raises:
        ValueError: inconsistent launcher variables (from :func:`detect_launcher_env`), a non-positive ``timeout_s`` or
            ``rendezvous_timeout_s``, or ``backend="nccl"`` without CUDA.
        RuntimeError: ``LOCAL_RANK`` >= the number of visible GPUs.
        CollectiveTimeout: the rendezvous timed out (a rank never started); CollectiveError: it failed otherwise.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if rendezvous_timeout_s is None:
        rendezvous_timeout_s = max(timeout_s, RENDEZVOUS_FLOOR_S)
    if rendezvous_timeout_s <= 0:
        raise ValueError(f"rendezvous_timeout_s must be > 0, got {rendezvous_timeout_s}")
    die_with_launcher()
    if _initialized():  # ours from an earlier call, or the caller's (Ray Train)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        local_rank = _int_var(os.environ, "LOCAL_RANK") if os.environ.get("LOCAL_RANK") else 0
        return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, dist.get_backend())
    platforms = optional_part("utils.platforms")
    if platforms:  # a Kubeflow PyTorchJob pod's index is no process's rank
        platforms.check_process_rank(os.environ)
    env = detect_launcher_env(os.environ)
    device = _select_device(env["local_rank"])
    if env["world_size"] == 1:
        logger.debug("single process on %s (launcher: %s)", device, env["launcher"])
        return DistInfo(env["rank"], env["local_rank"], 1, device, None)
    return _join(env, device, backend, timeout_s, rendezvous_timeout_s)


def _join(env: dict, device: torch.device, backend: Optional[str], timeout_s: float,
          rendezvous_timeout_s: float) -> DistInfo:
    """:func:`init_distributed` with world size > 1: the process group of :func:`detect_launcher_env`'s job."""
    rank, local_rank, world_size = env["rank"], env["local_rank"], env["world_size"]
    if not dist.is_available():
        raise RuntimeError(f"this PyTorch build has no torch.distributed; cannot run {world_size} processes")
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("backend 'nccl' needs CUDA, which is not available; use 'gloo'")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR=str(env["master_addr"]), MASTER_PORT=str(env["master_port"]))
    remember_timeout(timeout_s)
    with collective(f"rendezvous at {env['master_addr']}:{env['master_port']}", rank=rank,
                    timeout=("rendezvous timeout", rendezvous_timeout_s)):
        store = _rendezvous_store(env["master_addr"], env["master_port"], rank, world_size,
                                  datetime.timedelta(seconds=rendezvous_timeout_s))
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    logger.debug("rank %d/%d (local %d) on %s, backend %s, rendezvous %s:%s via %s", rank, world_size, local_rank,
                 device, backend, env["master_addr"], env["master_port"], env["launcher"])
    return DistInfo(rank, local_rank, world_size, device, backend)


def _rendezvous_store(addr: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The store ``env://`` would make, with its own ``timeout`` for every rank to join: rank 0 hosts it at
    ``addr:port``; under torchrun the launcher's store serves every restart, and a prefix per attempt keeps a restarted
    rank from reading its dead predecessors' addresses."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=timeout)
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
        if restart is not None:
            store = dist.PrefixStore(f"/attempt_{restart}", store)
    else:
        store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=timeout, multi_tenant=True)
    # Every rank checks in, then waits for all: the backend's own connection set-up that follows is bounded by the
    # collectives' timeout, which must not have to cover a rank that starts late.
    store.set(f"rendezvous/joined/{rank}", "1")
    store.wait([f"rendezvous/joined/{other}" for other in range(world_size)], timeout)
    return store


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank of this process; 0 without a process group."""
    return dist.get_rank() if _initialized() else 0


def get_world_size() -> int:
    """Number of processes in the job; 1 without a process group."""
    return dist.get_world_size() if _initialized() else 1


def is_main_process() -> bool:
    """True on global rank 0 (and in a single process)."""
    return get_rank() == 0


def barrier() -> None:
    """Wait until every rank reaches this point (``torch.distributed.barrier``); no-op alone.

    Raises:
        CollectiveTimeout: past the process group's timeout (``init_distributed(timeout_s=...)``).
    """
    if get_world_size() > 1:
        with collective("barrier"):
            dist.barrier()


def cleanup() -> None:
    """Destroy the default process group if one exists (``destroy_process_group``). Garbage is collected first, so that
    objects in reference cycles bound to it (DDP's reducer, a sharded model's state) die before it: left to the interpreter's exit,
    their C++ threads aborted the process (SIGABRT)."""
    if _initialized():
        gc.collect()
        dist.destroy_process_group()


def apply_gradient_allreduce(model: nn.Module, **ddp_options) -> nn.Module:
    """Make ``model``'s gradients the average over all ranks: after ``backward()`` each rank holds the gradient of the
    mean loss over all ranks' batches (equal batches, per-rank mean losses). ``DistributedDataParallel``: every rank
    holds the whole model and optimizer state; ``backward()`` all-reduces the gradients in buckets of ``bucket_cap_mb``
    MiB, overlapping the rest of the backward; ``ddp_options``: ``device_ids`` (the model's one GPU),
    ``gradient_as_bucket_view=True`` (one gradient copy fewer). Move the model to its device first. Returns the wrapped
    model, or ``model`` itself without a process group, with world size 1 or when already wrapped (or split over the
    ranks: :func:`split_over_ranks`).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (DDP raises its own TypeError for an unknown option).

    Source: https://pytorch.org/docs/stable/notes/ddp.html.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_gradient_allreduce needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, DistributedDataParallel) or split_over_ranks(model) or get_world_size() == 1:
        return model
    return _wrap_ddp(model, ddp_options)


def _wrap_ddp(model: nn.Module, ddp_options: dict) -> DistributedDataParallel:
    options = {"gradient_as_bucket_view": True, **ddp_options}
    devices = {p.device for p in model.parameters()}
    if "device_ids" not in options and len(devices) == 1 and (device := devices.pop()).type == "cuda":
        options["device_ids"] = [device.index]
        options.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **options)


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's values of ``model``'s buffers (BatchNorm's running statistics) on every rank, one broadcast per dtype,
    as DDP before every forward (sharded models run it then, and before a sharded checkpoint is written); nothing alone.

    Raises:
        CollectiveTimeout / CollectiveError: another rank did not join.
    """
    buffers = list(model.buffers())
    if not buffers or get_world_size() == 1:
        return
    with collective("broadcast of rank 0's buffers"), torch.no_grad():
        for dtype in dict.fromkeys(buffer.dtype for buffer in buffers):
            group = [buffer for buffer in buffers if buffer.dtype == dtype]
            flat = torch.cat([buffer.reshape(-1) for buffer in group])
            dist.broadcast(flat, src=0)
            for buffer, value in zip(group, flat.split([buffer.numel() for buffer in group])):
                buffer.copy_(value.view_as(buffer))


@contextlib.contextmanager
def no_sync(model: nn.Module):
    """Inside the block, backward passes accumulate gradients locally, without DDP's all-reduce or a sharded model's
    reduce-scatter (gradient accumulation's micro-batches before the last); a plain module needs nothing. Sources:
    ``DistributedDataParallel.no_sync``, ``set_requires_gradient_sync`` of a model split over the ranks."""
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif split_over_ranks(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def split_over_ranks(obj: object) -> bool:
    """Whether ``obj`` is split over the ranks: a ``DTensor`` (each rank holds a shard: a sharded model's parameters,
    gradients, total norm), or a module that shards its parameters itself (``reshard``, ``set_requires_gradient_sync``:
    torch.distributed's ``fully_shard``; between a forward and its backward its parameters may be gathered, plain
    tensors). ``DTensor`` is imported on first use (0.6 s of every process's start): until then nothing is split."""
    if sys.modules.get("torch.distributed.tensor") is None:
        return False
    if isinstance(obj, nn.Module):
        return callable(getattr(obj, "reshard", None)) and callable(getattr(obj, "set_requires_gradient_sync", None))
    return isinstance(obj, sys.modules["torch.distributed.tensor"].DTensor)


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s whole value as a plain tensor: a ``DTensor`` (a sharded model's parameters, gradients,
    ``clip_grad_norm_``'s total norm) is gathered (a collective: every rank must call it), a plain tensor returned as
    is."""
    if split_over_ranks(tensor):
        with collective("gather of a sharded tensor"):
            return tensor.full_tensor()
    return tensor


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and/or ``torch.compile`` wrappers, in any nesting (for saving, exporting)."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def reduce_tensor(tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """All-reduce a detached copy of ``tensor`` (any shape) over all ranks, element-wise; ``tensor`` is unchanged.

    For a loss or metric rank 0 logs job-wide (``torch.distributed.all_reduce``); every rank must call it with the same
    shape and dtype. ``op``: ``"mean"`` (floating dtypes), ``"sum"``, ``"max"`` or ``"min"``. CPU tensors work with
    NCCL too (via the current GPU). Returns a new tensor of the same shape, dtype and device (alone: a clone).

    Raises:
        ValueError: unknown ``op``.
        TypeError: ``tensor`` is not a tensor, or ``op="mean"`` on a non-floating dtype (use ``"sum"`` for counts).
        CollectiveTimeout: another rank did not join within the process group's timeout; CollectiveError: the
            all-reduce failed otherwise (e.g. a peer died).
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce_tensor: unknown op {op!r}; use one of {sorted(_REDUCE_OPS)}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"reduce_tensor needs a torch.Tensor, got {type(tensor).__name__}")
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"reduce_tensor: op='mean' needs a floating-point tensor, got {tensor.dtype}; "
                        "use op='sum' for counts")
    result = tensor.detach().clone()
    if get_world_size() == 1:
        return result
    on_host = dist.get_backend() == "nccl" and result.device.type != "cuda"
    work = result.to(torch.device("cuda", torch.cuda.current_device())) if on_host else result
    with collective(f"all_reduce ({op})"):
        dist.all_reduce(work, op=_REDUCE_OPS[op])
    if op == "mean":
        work /= dist.get_world_size()
    return work.to(tensor.device) if work is not result else result


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` (any picklable value) on every rank, for decisions one rank makes for all; ``obj`` alone.
    Every rank must call it; past the process group's timeout it raises :class:`CollectiveTimeout`. Source:
    ``torch.distributed.broadcast_object_list``."""
    if get_world_size() == 1:
        return obj
    box = [obj]
    with collective("broadcast_object"):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's ``obj`` (any picklable value), in rank order, on every rank; ``[obj]`` alone. For small, rare
    exchanges (a bad batch's utterance ids, RNG states), not hot-path tensors. Every rank must call it; past the process
    group's timeout it raises :class:`CollectiveTimeout`. Source: ``torch.distributed.all_gather_object``."""
    if get_world_size() == 1:
        return [obj]
    gathered = [None] * dist.get_world_size()
    with collective("all_gather_object"):
        dist.all_gather_object(gathered, obj)
    return gathered
