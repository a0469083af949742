"""Data-parallel training helpers with NVIDIA's multi-GPU names (``init_distributed``, ``apply_gradient_allreduce``,
``reduce_tensor``, ``cleanup``), done by ``torch.distributed``; alone (world size 1) every helper is an identity.
Sources: https://pytorch.org/docs/stable/distributed.html, https://pytorch.org/docs/stable/notes/ddp.html."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import logging
import os
import re
import sys
import time
from typing import Callable, Mapping, Optional, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from utils.launch import _int_var, detect_launcher_env, die_with_launcher
from utils.run_log import one_line

logger = logging.getLogger(__name__)
# "mean" is a sum divided by the world size (ReduceOp.AVG is NCCL-only)
_REDUCE_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_timeout_s: Optional[float] = None  # the process group's timeout (init_distributed's timeout_s), for error messages


class CollectiveError(dist.DistBackendError):
    """A collective failed on this rank; ``collective``: its name."""

    def __init__(self, message: str, collective: str):
        super().__init__(message)
        self.collective = collective


class CollectiveTimeout(CollectiveError):
    """A collective waited past the group's timeout: another rank hung or died (gloo's error names neither)."""


@contextlib.contextmanager
def collective(name: str, rank: Optional[int] = None, timeout: Optional[tuple[str, float]] = None):
    """A communication failure inside (torch's ``DistError``, or gloo's bare ``RuntimeError`` by its text) as one line
    naming this rank, the collective ``name`` and the timeout (``timeout``: its name and seconds; default the process
    group's): :class:`CollectiveTimeout` after at least 80% of the timeout, else :class:`CollectiveError`. Other errors
    (out of memory) pass unchanged."""
    start = time.monotonic()
    try:
        yield
    except CollectiveError:
        raise
    except RuntimeError as err:
        if not isinstance(err, dist.DistError) and not _COMMUNICATION_RE.search(str(err)):
            raise
        elapsed, reason = time.monotonic() - start, one_line(err).strip()
        rank = (dist.get_rank() if dist.is_initialized() else 0) if rank is None else rank
        world = dist.get_world_size() if dist.is_initialized() else None
        others = f"the other {world - 1} rank(s)" if world else "the other ranks"
        label, seconds = timeout or ("process-group timeout", _timeout_s)
        after = f"{seconds:g} s" if seconds is not None else "the process group's timeout"
        # "timed out" in gloo's text is not always the group's timeout: a refused connect says it too, at once.
        if (seconds is None or elapsed >= 0.8 * seconds) and re.search(r"time[d ]?\s?out", reason, re.IGNORECASE):
            raise CollectiveTimeout(f"rank {rank}: {name} timed out after {elapsed:.0f} s waiting for {others} ({label} "
                                    f"{after}): another rank hung or died before reaching it ({reason})", name) from err
        raise CollectiveError(f"rank {rank}: {name} failed after {elapsed:.1f} s (another rank may have died): "
                              f"{reason}", name) from err


_COMMUNICATION_RE = re.compile(r"gloo|nccl|time[d ]?\s?out|connection (?:closed|reset|refused)|broken pipe",
                               re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job; ``local_rank``: its GPU's index on this node; ``backend``: None alone."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: Optional[str]

    @property
    def is_main(self) -> bool:  # global rank 0 logs, validates and saves checkpoints
        return self.rank == 0


RENDEZVOUS_FLOOR_S = 300.0  # the shortest default rendezvous timeout: ranks start minutes apart (CUDA, image pulls)


def init_distributed(backend: Optional[str] = None, timeout_s: float = 1800,
                     rendezvous_timeout_s: Optional[float] = None,
                     check_environ: Optional[Callable[[Mapping[str, str]], None]] = None) -> DistInfo:
    """Join the launcher's job (:func:`utils.launch.detect_launcher_env`): the device (``cuda:<local_rank>``, set
    before any CUDA call, or ``cpu``) and with world size > 1 the process group (NCCL bound to this GPU, else gloo;
    an existing group is used as is). ``timeout_s``: seconds a collective waits; ``rendezvous_timeout_s``: for every
    rank to start (default ``max(timeout_s, RENDEZVOUS_FLOOR_S)``); ``check_environ``: a check of the environment
    before it is read. Under torchrun, SIGTERM if the launcher dies.

    Raises:
        ValueError: inconsistent launcher variables (or ``check_environ``'s), a non-positive timeout, NCCL without CUDA.
        RuntimeError: ``LOCAL_RANK`` >= the number of visible GPUs.
        CollectiveTimeout: the rendezvous timed out (a rank never started); CollectiveError: it failed otherwise.
    """
    rendezvous_timeout_s = max(timeout_s, RENDEZVOUS_FLOOR_S) if rendezvous_timeout_s is None else rendezvous_timeout_s
    for name, seconds in (("timeout_s", timeout_s), ("rendezvous_timeout_s", rendezvous_timeout_s)):
        if seconds <= 0:
            raise ValueError(f"{name} must be > 0, got {seconds}")
    die_with_launcher()
    if dist.is_initialized():  # ours from an earlier call, or the caller's
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        local_rank = _int_var(os.environ, "LOCAL_RANK") if os.environ.get("LOCAL_RANK") else 0
        return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, dist.get_backend())
    if check_environ is not None:
        check_environ(os.environ)
    env = detect_launcher_env(os.environ)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if env["local_rank"] >= count > 0:
        raise RuntimeError(f"LOCAL_RANK={env['local_rank']} but only {count} GPU(s) are visible (CUDA_VISIBLE_DEVICES="
                           f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); start at most {count} processes per node")
    device = torch.device("cuda", env["local_rank"]) if count else torch.device("cpu")
    if count:  # before init_process_group: otherwise every rank's NCCL/CUDA context lands on GPU 0
        torch.cuda.set_device(device)
    if env["world_size"] == 1:
        logger.debug("single process on %s (launcher: %s)", device, env["launcher"])
        return DistInfo(env["rank"], env["local_rank"], 1, device, None)
    return _join(env, device, backend, timeout_s, rendezvous_timeout_s)


def _join(env: dict, device: torch.device, backend: Optional[str], timeout_s: float,
          rendezvous_timeout_s: float) -> DistInfo:
    """:func:`init_distributed`'s process group, exporting ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``, on a store with its own join timeout: rank 0's, or under torchrun the launcher's with a prefix per
    restart (a restarted rank must not read its predecessors' addresses)."""
    rank, local_rank, world_size = env["rank"], env["local_rank"], env["world_size"]
    addr, port, wait = env["master_addr"], env["master_port"], datetime.timedelta(seconds=rendezvous_timeout_s)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("backend 'nccl' needs CUDA, which is not available; use 'gloo'")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size), MASTER_ADDR=str(addr),
                      MASTER_PORT=str(port))
    global _timeout_s
    _timeout_s = timeout_s
    with collective(f"rendezvous at {addr}:{port}", rank=rank, timeout=("rendezvous timeout", rendezvous_timeout_s)):
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            store = dist.TCPStore(addr, port, world_size, is_master=False, timeout=wait)
            if (restart := os.environ.get("TORCHELASTIC_RESTART_COUNT")) is not None:
                store = dist.PrefixStore(f"/attempt_{restart}", store)
        else:
            store = dist.TCPStore(addr, port, world_size, is_master=rank == 0, timeout=wait, multi_tenant=True)
        # Wait for every rank: the backend set-up below has only the collectives' timeout, too short for a late rank
        store.set(f"rendezvous/joined/{rank}", "1")
        store.wait([f"rendezvous/joined/{other}" for other in range(world_size)], wait)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if backend == "nccl" else None)
    logger.debug("rank %d/%d (local %d) on %s, backend %s, rendezvous %s:%s via %s", rank, world_size, local_rank,
                 device, backend, addr, port, env["launcher"])
    return DistInfo(rank, local_rank, world_size, device, backend)


def get_world_size() -> int:
    """Number of processes in the job; 1 without a process group."""
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    """Wait until every rank reaches this point."""
    if get_world_size() > 1:
        with collective("barrier"):
            dist.barrier()


def cleanup() -> None:
    """Destroy the default process group, if any, after a garbage collection: objects in reference cycles bound to it
    (DDP's reducer), left to the interpreter's exit, abort it (SIGABRT)."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def apply_gradient_allreduce(model: nn.Module, **ddp_options) -> nn.Module:
    """``model`` (on its device) in ``DistributedDataParallel`` with ``ddp_options`` (defaults: ``device_ids``, its one
    GPU; ``gradient_as_bucket_view``): after ``backward()`` each rank holds the gradient of the mean loss over all
    ranks' batches, all-reduced in buckets during the backward. ``model`` itself alone, or already wrapped or split over
    the ranks. Raises TypeError for what is no ``nn.Module``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_gradient_allreduce needs an nn.Module, got {type(model).__name__}")
    if isinstance(model, DistributedDataParallel) or split_over_ranks(model) or get_world_size() == 1:
        return model
    options = {"gradient_as_bucket_view": True, **ddp_options}
    devices = {p.device for p in model.parameters()}
    if "device_ids" not in options and len(devices) == 1 and (device := devices.pop()).type == "cuda":
        options["device_ids"] = [device.index]
        options.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **options)


@contextlib.contextmanager
def no_sync(model: nn.Module):
    """Backward passes inside accumulate gradients locally: no all-reduce (``DistributedDataParallel.no_sync``) or
    reduce-scatter of a model split over the ranks (``set_requires_gradient_sync``)."""
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
    """Whether ``obj`` is split over the ranks: a ``DTensor``, or a module ``fully_shard`` made. False until
    ``torch.distributed.tensor`` is imported (0.6 s: not at every start)."""
    if sys.modules.get("torch.distributed.tensor") is None:
        return False
    if isinstance(obj, nn.Module):
        return callable(getattr(obj, "reshard", None)) and callable(getattr(obj, "set_requires_gradient_sync", None))
    return isinstance(obj, sys.modules["torch.distributed.tensor"].DTensor)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and ``torch.compile`` wrappers, in any nesting."""
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def reduce_tensor(tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """A detached copy of ``tensor`` (any shape, the same on every rank) all-reduced element-wise: ``op`` ``"mean"``
    (floating dtypes), ``"sum"``, ``"max"`` or ``"min"``. Raises ValueError (unknown ``op``), TypeError (no tensor, a
    mean of integers), as :func:`collective`."""
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


T = TypeVar("T")


def from_rank0(compute: Callable[[], T], *errors: type[Exception]) -> T:
    """What ``compute()`` returns on rank 0 (it runs there alone), on every rank (all call this together); where it
    raises one of ``errors``, that error on every rank (a picklable copy on the others); rank 0 raising another error
    leaves the others to :class:`CollectiveTimeout`. Source: ``torch.distributed.broadcast_object_list``."""
    value, error = None, None
    if get_world_size() == 1 or dist.get_rank() == 0:
        try:
            value = compute()
        except errors as err:
            error = err
    box = [(value, error)]
    if get_world_size() > 1:
        with collective("broadcast_object"):
            dist.broadcast_object_list(box, src=0)
    value, copied = box[0]
    if error is not None or copied is not None:
        raise error or copied
    return value


def all_gather_object(obj) -> list:
    """Every rank's ``obj`` (picklable, small), in rank order, on every rank: ``dist.all_gather_object``."""
    if get_world_size() == 1:
        return [obj]
    gathered = [None] * dist.get_world_size()
    with collective("all_gather_object"):
        dist.all_gather_object(gathered, obj)
    return gathered
