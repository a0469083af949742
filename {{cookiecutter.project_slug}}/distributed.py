"""Multi-process (data-parallel) training helpers, backed by ``torch.distributed``.

The names follow the NVIDIA multi-GPU training layout (``init_distributed``, ``apply_gradient_allreduce``,
``reduce_tensor``); the work is done by PyTorch itself: process groups by :func:`torch.distributed.init_process_group`
(``env://``), gradient all-reduce by :class:`torch.nn.parallel.DistributedDataParallel`, collectives by
:func:`torch.distributed.all_reduce`.

Typical use in a training script started by ``multiproc.py`` (torchrun), ``srun`` or ``mpirun``::

    info = init_distributed()                 # reads the launcher's environment
    model = apply_gradient_allreduce(MyNet().to(info.device))
    ...
    loss_for_logging = reduce_tensor(loss.detach())   # mean over all ranks
    if info.is_main:
        torch.save(unwrap_model(model).state_dict(), "checkpoint.pt")
    cleanup()

A model too big for one GPU per replica is sharded instead: ``apply_gradient_allreduce(model, "fsdp", blocks=...)``
applies FSDP2's ``fully_shard`` per block (``train.parallelism=fsdp``), and :func:`no_sync` / :func:`full_value` cover
gradient accumulation and the sharded gradient norm for either kind.

Every helper here is safe to call in a plain single process (no launcher, world size 1): nothing is initialised and the
helpers degrade to identities.

Sources: https://pytorch.org/docs/stable/distributed.html (env:// initialisation, ``device_id``),
https://pytorch.org/docs/stable/notes/ddp.html (gradient buckets, overlap with backward). Which launcher started
the process, and so the rank, world size and rendezvous address: ``utils/launch.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import logging
import os
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from utils.collectives import CollectiveError as CollectiveError  # re-exported: distributed is the one face
from utils.collectives import CollectiveTimeout as CollectiveTimeout
from utils.collectives import collective, remember_timeout
from utils.launch import _int_var, detect_launcher_env, die_with_launcher

logger = logging.getLogger(__name__)


# "mean" is a sum divided by the world size (ReduceOp.AVG is NCCL-only)
_REDUCE_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        local_rank: rank on this node; the index of the GPU this process uses.
        world_size: number of processes in the job (1 for a plain single process).
        device: the device this process computes on (``cuda:<local_rank>`` or ``cpu``).
        backend: the process group's backend (``"nccl"`` / ``"gloo"``), or ``None`` when no process group was created
            (single process).
    """

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
                           f"(CUDA_VISIBLE_DEVICES={visible}); start at most {count} processes "
                           "per node")
    # Before init_process_group: otherwise every rank's NCCL/CUDA context lands on GPU 0.
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


RENDEZVOUS_FLOOR_S = 300.0
"""The shortest rendezvous timeout :func:`init_distributed` uses by default: ranks start seconds to minutes apart
(interpreter, CUDA and NCCL initialisation; image pulls on a cluster), whatever the collectives' timeout is."""


def init_distributed(backend: Optional[str] = None, timeout_s: float = 1800,
                     rendezvous_timeout_s: Optional[float] = None) -> DistInfo:
    """Join the job described by the launcher's environment (:func:`utils.launch.detect_launcher_env`).

    With world size > 1: picks the device (``cuda:<local_rank>`` after ``torch.cuda.set_device(local_rank)``, or
    ``cpu``), exports ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and calls
    ``torch.distributed.init_process_group`` with ``device_id`` for NCCL (the communicator is bound to this GPU, so GPU
    0 holds no other rank's context). With world size 1 no process group is created (``backend`` is ``None``). An
    existing process group (an earlier call's, or the caller's: Ray Train makes one) is used as it is (idempotent).
    Under a torchrun-style launcher the process first arranges to get SIGTERM if the launcher dies.

    Args:
        backend: ``"nccl"``, ``"gloo"``, ...; default NCCL when CUDA is available, else gloo.
        timeout_s: seconds a collective may wait for the other ranks before failing (instead of hanging).
        rendezvous_timeout_s: seconds the rendezvous waits for every rank to start; default ``max(timeout_s,
            RENDEZVOUS_FLOOR_S)``, so that a short collective timeout (to find a hung rank fast) does not fail a job
            whose ranks start slowly. Under SLURM, start the script with ``srun``: ``python train.py`` run directly in
            an ``sbatch --ntasks=N`` script sees ``SLURM_NTASKS=N`` and rank 0 waits for ranks that never start, until
            this timeout.

    Returns:
        :class:`DistInfo` of this process.

    Raises:
        ValueError: inconsistent launcher variables (from :func:`detect_launcher_env`), a non-positive ``timeout_s`` or
            ``rendezvous_timeout_s``, or ``backend="nccl"`` without CUDA.
        RuntimeError: ``LOCAL_RANK`` >= the number of visible GPUs.
        CollectiveTimeout: the rendezvous timed out (a rank never started); :class:`CollectiveError` when it fails
            otherwise.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if rendezvous_timeout_s is None:
        rendezvous_timeout_s = max(timeout_s, RENDEZVOUS_FLOOR_S)
    if rendezvous_timeout_s <= 0:
        raise ValueError(f"rendezvous_timeout_s must be > 0, got {rendezvous_timeout_s}")
    die_with_launcher()
    if dist.is_available() and dist.is_initialized():  # ours from an earlier call, or the caller's (Ray Train)
        device = (torch.device("cuda", torch.cuda.current_device())
                  if torch.cuda.is_available() else torch.device("cpu"))
        local_rank = _int_var(os.environ, "LOCAL_RANK") if os.environ.get("LOCAL_RANK") else 0
        return DistInfo(dist.get_rank(), local_rank, dist.get_world_size(), device, dist.get_backend())
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
        raise RuntimeError("this PyTorch build has no torch.distributed; cannot run "
                           f"{world_size} processes")
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
    logger.debug("rank %d/%d (local %d) on %s, backend %s, rendezvous %s:%s via %s", rank,
                 world_size, local_rank, device, backend, env["master_addr"],
                 env["master_port"], env["launcher"])
    return DistInfo(rank, local_rank, world_size, device, backend)


def _rendezvous_store(addr: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store:
    """The job's rendezvous store, as ``init_method="env://"`` would make it but with its own ``timeout`` (the wait for
    every rank to join, apart from the collectives' timeout): rank 0 hosts a :class:`torch.distributed.TCPStore` at
    ``addr:port`` and waits for the others; under torchrun every rank joins the store its launcher hosts.

    torchrun's static rendezvous (what ``multiproc.py`` uses) keeps one TCPStore for every restart of the group: a
    restarted rank could read the addresses its dead predecessors published there, then fail ("Connection refused") or
    wait for them until the timeout. A prefix per attempt (``TORCHELASTIC_RESTART_COUNT``) keeps each attempt's keys
    apart.
    """
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

    Bounded by the process group's timeout (``init_distributed(timeout_s=...)``): past it, raises
    :class:`CollectiveTimeout` naming this rank.
    """
    if _initialized() and dist.get_world_size() > 1:
        with collective("barrier"):
            dist.barrier()


def cleanup() -> None:
    """Destroy the default process group if one exists (``destroy_process_group``); else no-op.

    Garbage is collected first: objects bound to the group and held in reference cycles (DDP's reducer, FSDP's state)
    are then freed while it still exists. Left to the interpreter's exit, their C++ threads were destroyed after the
    group, and the process aborted ("terminate called without an active exception", SIGABRT) in one exit of three of
    ``scripts/memory.py``'s ranks, after all their work was done."""
    if _initialized():
        gc.collect()
        dist.destroy_process_group()

# --- Model wrapping and reductions ------------------------------------------------------------------------------------


PARALLELISMS = ("ddp", "fsdp")
"""The ways :func:`apply_gradient_allreduce` spreads a model over the ranks (``train.parallelism``)."""


def apply_gradient_allreduce(model: nn.Module, parallelism: str = "ddp", blocks: Sequence[nn.Module] = (),
                             param_dtype: Optional[torch.dtype] = None, reshard_after_forward: bool = True,
                             **ddp_options) -> nn.Module:
    """Make ``model``'s gradients the average over all ranks, the data-parallel way ``parallelism`` names.

    * ``"ddp"``: wrap it in :class:`~torch.nn.parallel.DistributedDataParallel`. Every rank holds the whole model, its
      gradients and optimizer state. DDP broadcasts rank 0's parameters and buffers at construction, then, during every
      ``backward()``, all-reduces (averages) the gradients in buckets of about ``bucket_cap_mb`` MiB as soon as a
      bucket's gradients are ready, overlapping communication with the rest of the backward pass.
    * ``"fsdp"``: shard it with FSDP2's ``fully_shard``, each of ``blocks`` on its own, then the root (which keeps the
      parameters outside the blocks). Each rank keeps ``1 / world_size`` of every parameter, of its gradient and so of
      the optimizer state (Adam's two moments); a block's full parameters exist only while it runs (all-gathered before
      its forward and again before its backward), and its gradients are reduce-scattered (averaged) right after its
      backward. ``reshard_after_forward=False`` keeps the gathered parameters from forward to backward (one all-gather
      fewer per block, more memory). ``param_dtype`` (e.g. ``torch.bfloat16``) computes in that dtype with fp32 master
      weights and fp32 gradient reduction (``MixedPrecisionPolicy``; the model's outputs come back in fp32). The model
      is changed in place (its class becomes an ``FSDPModule``) and returned. Rank 0's initial weights are broadcast
      first, and its buffers (BatchNorm's running statistics) before every forward, as DDP does.

    After ``backward()`` each rank holds the gradient of the mean loss over all ranks' batches (for equal per-rank batch
    sizes and a per-rank mean loss): the whole gradient with DDP, its shard with FSDP. Move the model to
    ``DistInfo.device`` first. For DDP, when all parameters are on one CUDA device, ``device_ids``/``output_device`` are
    set to it; on CPU they are left out.

    Args:
        model: the module to train (already on its device).
        parallelism: ``"ddp"`` or ``"fsdp"`` (:data:`PARALLELISMS`).
        blocks: sub-modules of ``model`` to shard one by one (FSDP only), in forward order: the units whose parameters
            are gathered together (``ModelSpec.blocks``); empty: the model is one unit.
        param_dtype: FSDP's compute dtype; ``None`` keeps the parameters' dtype.
        reshard_after_forward: FSDP: free a block's gathered parameters after its forward.
        **ddp_options: passed to DDP, e.g. ``bucket_cap_mb`` (MiB), ``find_unused_parameters``,
            ``gradient_as_bucket_view`` (default here ``True``: gradients are views into the buckets, saving one copy of
            the gradients), ``static_graph``, ``broadcast_buffers``.

    Returns:
        The wrapped model, or ``model`` itself without a process group / with world size 1 / when it is already wrapped.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (DDP raises its own TypeError for an unknown option).
        ValueError: an unknown ``parallelism``, a block that is not part of ``model``, or DDP options with FSDP.

    Sources: https://pytorch.org/docs/stable/notes/ddp.html,
    https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html (FSDP2), and pytorch/torchtitan's per-block
    ``fully_shard`` with a ``MixedPrecisionPolicy``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_gradient_allreduce needs an nn.Module, got {type(model).__name__}")
    if parallelism not in PARALLELISMS:
        raise ValueError(f"apply_gradient_allreduce: unknown parallelism {parallelism!r}; use one of {PARALLELISMS}")
    if isinstance(model, (DistributedDataParallel, FSDPModule)) or get_world_size() == 1:
        return model
    if parallelism == "fsdp":
        if ddp_options:
            raise ValueError(f"apply_gradient_allreduce: DDP options {sorted(ddp_options)} with parallelism='fsdp'")
        return _fully_shard(model, blocks, param_dtype, reshard_after_forward)
    return _wrap_ddp(model, ddp_options)


def _wrap_ddp(model: nn.Module, ddp_options: dict) -> DistributedDataParallel:
    """DDP with gradients as views into its buckets (one copy fewer), on the model's one GPU when it has one."""
    options = {"gradient_as_bucket_view": True, **ddp_options}
    devices = {p.device for p in model.parameters()}
    if "device_ids" not in options and len(devices) == 1:
        (device,) = devices
        if device.type == "cuda":
            options["device_ids"] = [device.index]
            options.setdefault("output_device", device.index)
    return DistributedDataParallel(model, **options)


def _fully_shard(model: nn.Module, blocks: Sequence[nn.Module], param_dtype: Optional[torch.dtype],
                 reshard_after_forward: bool) -> nn.Module:
    inside = {id(module) for module in model.modules()}
    stray = [type(block).__name__ for block in blocks if id(block) not in inside]
    if stray:
        raise ValueError(f"apply_gradient_allreduce: blocks not inside the model: {', '.join(stray)}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        for param in model.parameters():
            if not param.is_contiguous():  # e.g. a transposed QR factor; FSDP shards along dim 0 of a dense layout
                param.data = param.data.contiguous()
    with collective("broadcast of rank 0's initial weights"), torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)  # what DDP does at construction: one starting point for every rank
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                  output_dtype=torch.float32 if param_dtype is not None else None)
    if param_dtype is not None:
        # BatchNorm keeps fp32 weights beside its fp32 running statistics (bf16 weights with fp32 statistics do not
        # run); under autocast it takes the bf16 activations as it does without FSDP.
        full = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                fully_shard(module, mesh=mesh, mp_policy=full, reshard_after_forward=reshard_after_forward)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root: the parameters outside every block; it gathers them before its forward. Its own resharding
    # after forward would only be undone at once by the backward, so it keeps them (torchtitan does the same).
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward and not blocks)
    if any(True for _ in model.buffers()):  # BatchNorm's running statistics: rank 0's, as DDP's broadcast_buffers
        model.register_forward_pre_hook(lambda module, args: broadcast_buffers(module))
    return model


def broadcast_buffers(model: nn.Module) -> None:
    """Rank 0's values of ``model``'s buffers (BatchNorm's running statistics) on every rank, one broadcast per dtype;
    nothing alone. DDP does it before every forward; under FSDP it runs before every forward of a sharded model and
    before a sharded checkpoint is written (each rank writes its own copy of what is not sharded).

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
    """Inside the block, backward passes accumulate gradients locally without the all-reduce (DDP) or reduce-scatter (FSDP)
    over the ranks: the micro-batches of gradient accumulation before the last one. A plain module (world size 1) needs
    nothing. Sources: ``DistributedDataParallel.no_sync``, ``FSDPModule.set_requires_gradient_sync``."""
    if isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``tensor``'s whole value: a sharded/replicated ``DTensor`` (FSDP's parameters, gradients,
    ``clip_grad_norm_``'s total norm) is gathered (a collective: every rank must call it), a plain tensor is returned as
    is."""
    if isinstance(tensor, DTensor):
        with collective("gather of a sharded tensor"):
            return tensor.full_tensor()
    return tensor


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP and/or ``torch.compile`` wrappers (for saving, exporting).

    Peels ``DistributedDataParallel.module`` and ``torch.compile``'s ``_orig_mod`` in any order and nesting; a plain
    module is returned as is.
    """
    while True:
        if isinstance(model, DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def reduce_tensor(tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
    """All-reduce a detached copy of ``tensor`` over all ranks; ``tensor`` is left unchanged.

    Typical use: the loss or a metric for logging, so that rank 0 reports the job-wide value. Every rank must call it
    (it is a collective) with the same shape and dtype.

    Args:
        tensor: any shape; for ``"mean"`` a floating-point dtype. CPU tensors work with NCCL too (copied to the current
            GPU and back).
        op: ``"mean"`` (sum / world size), ``"sum"``, ``"max"`` or ``"min"``, element-wise.

    Returns:
        A new tensor of the same shape, dtype and device. Without a process group: a detached
        clone (the reduction over one process).

    Raises:
        ValueError: unknown ``op``.
        TypeError: ``tensor`` is not a tensor, or ``op="mean"`` on a non-floating dtype (use ``"sum"`` for counts).
        CollectiveTimeout: another rank did not join within the process group's timeout (the message names this rank,
            the collective and the timeout); :class:`CollectiveError` when the all-reduce fails otherwise (e.g. a peer
            died).

    Source: https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"reduce_tensor: unknown op {op!r}; use one of {sorted(_REDUCE_OPS)}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"reduce_tensor needs a torch.Tensor, got {type(tensor).__name__}")
    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"reduce_tensor: op='mean' needs a floating-point tensor, got "
                        f"{tensor.dtype}; use op='sum' for counts")
    result = tensor.detach().clone()
    if not _initialized() or dist.get_world_size() == 1:
        return result
    work = result
    if dist.get_backend() == "nccl" and result.device.type != "cuda":
        work = result.to(torch.device("cuda", torch.cuda.current_device()))
    with collective(f"all_reduce ({op})"):
        dist.all_reduce(work, op=_REDUCE_OPS[op])
    if op == "mean":
        work /= dist.get_world_size()
    return work.to(tensor.device) if work is not result else result


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` (any picklable value) on every rank; ``obj`` itself alone.

    For decisions one rank makes for all (which checkpoint to resume from, which clips to leave out). Every rank must
    call it; past the process group's timeout it raises :class:`CollectiveTimeout`.

    Source: https://pytorch.org/docs/stable/distributed.html#torch.distributed.broadcast_object_list
    """
    if not _initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    with collective("broadcast_object"):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's ``obj`` (any picklable value), in rank order, on every rank; ``[obj]`` alone.

    For small, rare exchanges (utterance ids of a bad batch, RNG states for a checkpoint), not for tensors in the hot
    path. Every rank must call it (it is a collective); past the process group's timeout it raises
    :class:`CollectiveTimeout`, like :func:`reduce_tensor`.

    Source: https://pytorch.org/docs/stable/distributed.html#torch.distributed.all_gather_object
    """
    if not _initialized() or dist.get_world_size() == 1:
        return [obj]
    gathered = [None] * dist.get_world_size()
    with collective("all_gather_object"):
        dist.all_gather_object(gathered, obj)
    return gathered
