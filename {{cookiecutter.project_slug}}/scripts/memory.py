"""What each rank holds, DDP vs FSDP and with or without activation checkpointing, and what a checkpoint save costs
the training loop, synchronous vs in the background.

    python -m scripts.memory                          # 2 processes, a 24-block model (~50M parameters)
    python -m scripts.memory --nproc 4 --depth 48 --json memory.json
    python -m scripts.memory --tiny                   # a quick look: 6 blocks of width 512 (~20 s on 2 CPU cores)
    python -m scripts.memory --model waveglow         # a registered model, its config.json size (--tiny: its tiny one)

It starts its own ranks (``torch.distributed.run --standalone``: gloo on CPUs, NCCL when every rank has a GPU)
and trains one step of a deep residual MLP (``--depth`` blocks of Linear-GELU-Linear, ``--width`` features,
Adam), or with ``--model NAME`` of a registered model (``models/__init__.py``: its config, ``Training.blocks``, a
batch of its ``Benchmark.synthetic_batch`` in the shape of its first benchmark case, its loss and optimizer), in each
setting: ``ddp``, ``fsdp`` (``distributed.apply_gradient_allreduce``, per block), each with
activation checkpointing ``none``, ``full`` and ``selective`` (``utils.training.activation_checkpoint``), exactly as
``train.py`` applies them. Per rank it reports, in MiB:

* parameters, gradients, optimizer state: the bytes of the tensors this rank holds (a sharded tensor's local
  shard), counted tensor by tensor: exact, on any device;
* activations: on a GPU, the peak of ``torch.cuda.memory_allocated`` during the forward pass above what it was
  before; on a CPU (no allocator statistics), the bytes autograd keeps for the backward pass
  (``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters left out) plus the inputs a
  checkpointed block keeps to run its forward again;
* peak RSS of the process, for context (allocator caches and the Python runtime included).

Then the stall: an FSDP model of the same size saves a sharded checkpoint (model + Adam state, several hundred
MB at the default size) through ``utils.checkpoint.sharded.ShardedCheckpointer``, synchronously and with
``async_save``; the stall is how long ``save()`` blocks the loop, and for the background save also how long it
takes to finish. Each checkpoint is then checked: its folder is complete (``sharded_intact``) and, loaded into a
fresh model and optimizer, it gives back the state as it was when ``save()`` was called, although the script
changed every weight and Adam moment in place right after the call returned (so a background save that had not
staged its own copy would be caught). Ratios at the end: FSDP / DDP parameter + gradient + optimizer memory per
rank, full / none and selective / none activation memory, async / sync stall.

Progress: a tqdm bar on stderr (rank 0) counts the settings and saves; the tables go to stdout. Bad arguments:
one line on stderr and exit status 1; a failed rank: its output, then one line, and exit status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from distributed import all_gather_object, apply_gradient_allreduce, barrier, cleanup, init_distributed
from model import adam
from models import MODELS, config_schemas
from utils.checkpoint.sharded import ShardedCheckpointer, load_sharded, sharded_intact
from utils.checkpoint.state import TrainState
from utils.config import load_config
from utils.training.activation_checkpoint import apply_activation_checkpointing

ROOT = Path(__file__).resolve().parent.parent

MIB = 2 ** 20
TINY = {"depth": 6, "width": 512, "batch": 512}
DEFAULTS = {"depth": 24, "width": 1024, "batch": 512}
SETTINGS = [("ddp", "none"), ("ddp", "full"), ("ddp", "selective"), ("fsdp", "none"), ("fsdp", "full"),
            ("fsdp", "selective")]


class Block(nn.Module):
    """``x + Linear(GELU(Linear(x)))``: ``(B, width) -> (B, width)``, two ``width x width`` weights."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(nn.functional.gelu(self.inner(x)))


def deep_model(depth: int, width: int, seed: int = 0) -> nn.Sequential:
    """``depth`` :class:`Block` s of ``width`` features (``(B, width) -> (B, width)``), float32 on the CPU; the same
    weights on every rank for one ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(*(Block(width) for _ in range(depth)))


@dataclasses.dataclass
class Subject:
    """What is measured: ``build(seed) -> model`` (float32, CPU, the same weights for one seed), ``blocks(model)``
    (what FSDP shards and activation checkpointing recomputes, in forward order), ``loss(net, rank)`` (one batch's
    scalar loss through ``net``, the model or its wrapper) and ``optimizer(model)``."""

    build: Callable[[int], nn.Module]
    blocks: Callable[[nn.Module], list]
    loss: Callable[[nn.Module, int], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    name: str


def mlp_subject(args) -> Subject:
    """The deep residual MLP of ``--depth``, ``--width`` and ``--batch``, with Adam."""
    def loss(net: nn.Module, rank: int) -> torch.Tensor:
        device = next(net.parameters()).device
        return net(torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank)).to(device)) \
            .pow(2).mean()
    return Subject(lambda seed: deep_model(args.depth, args.width, seed), list, loss,
                   lambda model: torch.optim.Adam(model.parameters(), lr=1e-4),
                   f"{args.depth} blocks of width {args.width}, batch {args.batch} per rank")


class CannotMeasure(ValueError):
    """A model this script cannot measure (named in one line)."""


def model_subject(name: str, tiny: bool) -> Subject:
    """Registered model ``name`` (``models.MODELS``) with its ``config.json`` settings (``tiny``: its tiny block) and
    its first benchmark case's batch (``Benchmark.synthetic_batch``), loss (``Training.build_criterion``) and
    optimizer (``Training.build_optimizer``).

    Raises:
        CannotMeasure: no such model, or one without blocks, a synthetic batch or a benchmark case, or with several
            optimizers (FSDP shards one-optimizer models).
    """
    if name not in MODELS:
        raise CannotMeasure(f"--model {name}: models/__init__.py registers no such model (it has "
                            f"{', '.join(sorted(MODELS))})")
    spec = MODELS[name]
    lacking = [what for what, missing in (("blocks", spec.training.blocks is None),
                                          ("synthetic_batch", spec.benchmark is None),
                                          ("benchmark_cases", spec.benchmark is None or not spec.benchmark.cases))
               if missing]
    if lacking or spec.phase_names:
        raise CannotMeasure(f"--model {name}: " + (f"its ModelSpec has no {', '.join(lacking)}" if lacking else
                                                  "it trains several optimizers, which FSDP does not shard yet"))
    case = spec.benchmark.cases[0]
    shape = case.tiny if tiny and case.tiny is not None else case
    cfg = load_config(str(ROOT / "config.json"), config_schemas(), tiny=tiny, overrides=list(case.overrides))
    batch = spec.benchmark.synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0),
                                           **shape.batch_kwargs)
    criterion = spec.training.build_criterion(cfg)
    build_optimizer = spec.training.build_optimizer or adam

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return spec.build_model(cfg)

    def loss(net: nn.Module, rank: int) -> torch.Tensor:
        device = next(net.parameters()).device
        on_device = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        return criterion(net(on_device), on_device)
    return Subject(build, lambda model: list(spec.training.blocks(model)), loss,
                   lambda model: build_optimizer(model, cfg.section(name), torch.device("cpu")),
                   f"model '{name}' ({'tiny' if tiny else 'config.json'} size), batch {shape.batch_size} per rank")


def subject(args) -> Subject:
    """:func:`model_subject` with ``--model``, else :func:`mlp_subject`."""
    return model_subject(args.model, args.tiny) if args.model else mlp_subject(args)


def local_bytes(tensors) -> int:
    """Bytes of the tensors this rank holds: ``numel * element_size`` of each, a DTensor's local shard only
    (``to_local()``); ``None`` entries (a parameter without a gradient) count 0."""
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors on this rank (Adam: ``exp_avg``, ``exp_avg_sq``, ``step``), local
    shards only."""
    return local_bytes(value for state in optimizer.state.values() for value in state.values()
                       if torch.is_tensor(value))


class SavedActivations:
    """Counts, on a CPU, the bytes kept for the backward pass during the forward passes inside the block: each
    storage once, parameters and views of them left out (FSDP's gathered weights too), plus the inputs of
    checkpointed blocks (kept to recompute them)."""

    def __init__(self, checkpointed: list[nn.Module]):
        self.kept: dict[int, tuple] = {}  # data pointer -> (storage, bytes when counted)
        self.checkpointed = checkpointed
        self.handles = []
        self.bytes = 0

    def _add(self, tensor: torch.Tensor) -> None:
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter) or \
                not tensor.is_floating_point():
            return  # a weight, or a view of one (Linear keeps weight.t()): parameters are counted apart
        storage = tensor.untyped_storage()
        known = self.kept.get(storage.data_ptr())
        if known is not None and known[0].nbytes() > 0:
            return  # the same memory, still held: counted once (a freed storage's address may be reused)
        self.kept[storage.data_ptr()] = (storage, storage.nbytes())

    def _pack(self, tensor):
        self._add(tensor)
        return tensor

    def _inputs(self, module, args) -> None:
        for arg in args:
            if torch.is_tensor(arg):
                self._add(arg)

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self.hooks.__enter__()
        self.handles = [block.register_forward_pre_hook(self._inputs) for block in self.checkpointed]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.hooks.__exit__(*exc)
        self.bytes = sum(size for storage, size in self.kept.values() if storage.nbytes() > 0)
        self.kept.clear()


def measure(parallelism: str, mode: str, args, rank: int, device: torch.device) -> dict:
    """One training step (forward, backward, Adam) of the deep model with ``parallelism`` (``ddp`` / ``fsdp``) and
    activation checkpointing ``mode``; this rank's row: ``params_mib``, ``grads_mib``, ``optimizer_mib``,
    ``activations_mib`` (MiB, this rank), ``peak_rss_mib`` (the process's peak so far) and ``method``. Every rank
    calls it (FSDP and DDP construction are collectives)."""
    what = subject(args)
    model = what.build(0).to(device)
    blocks = what.blocks(model)
    wrapped = apply_activation_checkpointing(blocks, mode, every=2)
    net = apply_gradient_allreduce(model, parallelism, blocks=blocks if parallelism == "fsdp" else ())
    optimizer = what.optimizer(model)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = what.loss(net, rank)
        activations = torch.cuda.max_memory_allocated() - before
    else:
        with SavedActivations(wrapped) as saved:
            loss = what.loss(net, rank)
        activations = saved.bytes
    loss.backward()
    optimizer.step()
    row = {"rank": rank, "parallelism": parallelism, "activation_checkpointing": mode,
           "params_mib": local_bytes(model.parameters()) / MIB,
           "grads_mib": local_bytes(p.grad for p in model.parameters()) / MIB,
           "optimizer_mib": optimizer_bytes(optimizer) / MIB, "activations_mib": activations / MIB,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "method": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "saved-tensor accounting"}
    del net, model, optimizer, loss
    return row


def fsdp_model(args, device: torch.device, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The measured model (:func:`subject`) sharded by FSDP per block, with an optimizer whose state exists (one step
    taken): the state a checkpoint of a training run holds. ``seed`` picks the weights and the batch."""
    what = subject(args)
    model = what.build(seed).to(device)
    apply_gradient_allreduce(model, "fsdp", blocks=what.blocks(model))
    optimizer = what.optimizer(model)
    what.loss(model, seed).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's local parts of the weights and of the optimizer state, in a fixed order (parameter order,
    state keys sorted)."""
    tensors = []
    for param in model.parameters():
        tensors.append(param)
        state = optimizer.state.get(param, {})
        tensors += [state[key] for key in sorted(state) if torch.is_tensor(state[key])]
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def fingerprint(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One float64 sum per local state tensor (:func:`state_tensors`): equal for equal states, cheap to keep."""
    with torch.no_grad():
        return torch.stack([t.detach().double().sum().cpu() for t in state_tensors(model, optimizer)])


def stall(async_save: bool, args, rank: int, device: torch.device, folder: Path) -> dict:
    """Seconds ``ShardedCheckpointer.save`` of an FSDP model with its Adam state blocks the loop (``stall_s``); for a
    background save also the seconds until it is written and renamed into place (``complete_s``; equal to the stall
    for a synchronous save). Then checks the checkpoint: the folder is complete (rank 0, ``sharded_intact``) and,
    loaded into a fresh model and optimizer, equals the state at the ``save()`` call although every weight and
    moment was changed in place right after it returned. Every rank calls it.

    Raises:
        RuntimeError: the checkpoint is damaged or does not give back the saved state.
    """
    model, optimizer = fsdp_model(args, device, seed=0)
    saved = fingerprint(model, optimizer)
    folder.mkdir(parents=True, exist_ok=True)
    saver = ShardedCheckpointer(folder, rank, async_save=async_save)  # the async one creates its gloo group here
    barrier()
    start = time.perf_counter()
    saver.save(1, model, [optimizer], {"step": 1, **TrainState(step=1).__dict__} if rank == 0 else None)
    blocked = time.perf_counter() - start
    with torch.no_grad():  # the next training step, as far as the checkpoint can tell: every value changes
        for tensor in state_tensors(model, optimizer):
            tensor.add_(1.0)
    saver.wait()
    barrier()
    finished = time.perf_counter() - start
    final = folder / "checkpoint_1"
    problem = sharded_intact(final) if rank == 0 else None
    if problem is not None:
        raise RuntimeError(f"the {'async' if async_save else 'sync'} checkpoint {final} is {problem}")
    size = sum(f.stat().st_size for f in final.iterdir())
    del model, optimizer
    fresh, fresh_optimizer = fsdp_model(args, device, seed=1)
    load_sharded(final, fresh, [fresh_optimizer])
    loaded = fingerprint(fresh, fresh_optimizer)
    if loaded.shape != saved.shape or not torch.allclose(loaded, saved, rtol=1e-9, atol=0.0):
        raise RuntimeError(f"rank {rank}: the {'async' if async_save else 'sync'} checkpoint {final} does not give "
                           f"back the state saved (it holds values changed after save() returned, or lacks some)")
    return {"rank": rank, "save": "async" if async_save else "sync", "checkpoint_mb": size / 1e6,
            "stall_s": blocked, "complete_s": finished, "verified": True}


def worker(args) -> None:
    """The body of each rank (``--worker``, started by ``torch.distributed.run``): every setting, then the saves;
    rank 0 writes all ranks' rows to ``--result`` as JSON ``{"rows": [...], "stalls": [...]}``."""
    info = init_distributed()
    rows, stalls = [], []
    jobs = [("memory", p, m) for p, m in SETTINGS] + ([] if args.no_stall else [("save", "sync", None),
                                                                                ("save", "async", None)])
    bar = tqdm(total=len(jobs), desc="memory.py", unit="setting", file=sys.stderr, disable=not info.is_main,
               dynamic_ncols=True)
    for kind, first, second in jobs:
        if kind == "memory":
            rows += all_gather_object(measure(first, second, args, info.rank, info.device))
            note = f"measured {first} / activation checkpointing {second}"
        else:
            async_save = first == "async"
            stalls += all_gather_object(stall(async_save, args, info.rank, info.device, Path(args.scratch) / first))
            note = f"measured a {'background' if async_save else 'synchronous'} save (checkpoint verified)"
        bar.update()
        if info.is_main:
            bar.write(note, file=sys.stderr)
    bar.close()
    if info.is_main:
        Path(args.result).write_text(json.dumps({"rows": rows, "stalls": stalls}))
    cleanup()


def ratios(rows: list[dict], stalls: list[dict]) -> dict:
    """The summary, from means over ranks of each setting: ``fsdp_over_ddp_state`` (parameters + gradients +
    optimizer state per rank, without activation checkpointing), ``{ddp,fsdp}_{full,selective}_over_none_activations``
    and, with saves, ``async_over_sync_stall`` (the slowest rank's stall of each)."""
    def mean(key, **match):
        chosen = [r[key] for r in rows if all(r[k] == v for k, v in match.items())]
        return sum(chosen) / len(chosen)
    state = {p: sum(mean(k, parallelism=p, activation_checkpointing="none")
                    for k in ("params_mib", "grads_mib", "optimizer_mib")) for p in ("ddp", "fsdp")}
    result = {"fsdp_over_ddp_state": state["fsdp"] / state["ddp"]}
    for p in ("ddp", "fsdp"):
        none = mean("activations_mib", parallelism=p, activation_checkpointing="none")
        for mode in ("full", "selective"):
            result[f"{p}_{mode}_over_none_activations"] = mean("activations_mib", parallelism=p,
                                                               activation_checkpointing=mode) / none
    if stalls:
        sync = max(s["stall_s"] for s in stalls if s["save"] == "sync")
        result["async_over_sync_stall"] = max(s["stall_s"] for s in stalls if s["save"] == "async") / sync
    return result


def report(rows: list[dict], stalls: list[dict]) -> str:
    """The rows as two plain-text tables (memory per rank and setting, MiB; saves, seconds) and the ratios."""
    lines = [f"{'parallelism':<12}{'act. ckpt':<11}{'rank':>4}{'params':>9}{'grads':>9}{'optim.':>9}"
             f"{'activ.':>9}{'peak RSS':>10}   (MiB per rank; activations by {rows[0]['method']})"]
    for r in rows:
        lines.append(f"{r['parallelism']:<12}{r['activation_checkpointing']:<11}{r['rank']:>4}{r['params_mib']:>9.1f}"
                     f"{r['grads_mib']:>9.1f}{r['optimizer_mib']:>9.1f}{r['activations_mib']:>9.1f}"
                     f"{r['peak_rss_mib']:>10.0f}")
    if stalls:
        lines.append(f"\n{'save':<7}{'rank':>4}{'checkpoint MB':>15}{'stall s':>9}{'complete s':>12}{'verified':>10}")
        for s in stalls:
            lines.append(f"{s['save']:<7}{s['rank']:>4}{s['checkpoint_mb']:>15.1f}{s['stall_s']:>9.3f}"
                         f"{s['complete_s']:>12.3f}{'yes' if s['verified'] else 'NO':>10}")
    summary = ratios(rows, stalls)
    lines.append("\n" + "; ".join(f"{key} {value:.3f}" for key, value in summary.items()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line's options (``--worker``, ``--result`` and ``--scratch``: what each rank is started with)."""
    parser = argparse.ArgumentParser(description="Per-rank memory (DDP vs FSDP, activation checkpointing) and the "
                                                 "stall of a checkpoint save (sync vs async).")
    parser.add_argument("--nproc", type=int, default=2, help="processes (ranks), at least 2; default 2")
    parser.add_argument("--depth", type=int, help=f"blocks of the model (default {DEFAULTS['depth']})")
    parser.add_argument("--width", type=int,
                        help=f"features (default {DEFAULTS['width']}: 2 x 1024 x 1024 weights a block)")
    parser.add_argument("--batch", type=int, help=f"rows per rank (default {DEFAULTS['batch']})")
    parser.add_argument("--tiny", action="store_true",
                        help="a quick look: {depth} blocks of width {width}, batch {batch} (--depth/--width/--batch "
                             "still override)".format(**TINY))
    parser.add_argument("--model", help="measure this registered model (models/__init__.py) instead of the MLP "
                                        "(--depth/--width/--batch then do not apply)")
    parser.add_argument("--no-stall", action="store_true", help="leave out the checkpoint-save measurement")
    parser.add_argument("--json", type=Path, help="also write the rows and ratios here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    return parser


def checked_subject(args) -> str:
    """The description of what will be measured (:func:`subject`), once the arguments are known to be usable: said
    here, before any rank starts.

    Raises:
        CannotMeasure: a count below its least value, a ``--json`` whose folder does not exist, or a model that cannot
            be measured (one line).
    """
    problem = next((f"--{name} must be >= {least}, got {getattr(args, name)}"
                    for name, least in (("nproc", 2), ("depth", 1), ("width", 1), ("batch", 1))
                    if getattr(args, name) < least), None)
    if problem is None and args.json is not None and not args.json.parent.is_dir():
        problem = f"--json {args.json}: its folder {args.json.parent} does not exist"
    if problem is not None:
        raise CannotMeasure(problem)
    return subject(args).name


def run_job(args, measured: str) -> dict | None:
    """Run the measuring job: ``--nproc`` ranks of this module under ``torch.distributed.run`` (one GPU per rank, or
    all on the CPU), checkpoints in a temporary folder removed afterwards. Returns the rank 0's result, or ``None``
    after one line on stderr when the job failed (its output is above it)."""
    scratch = Path(tempfile.mkdtemp(prefix="memory-"))
    try:
        result = scratch / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc:
            env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU per rank or none: NCCL cannot share a GPU between ranks
        print(f"memory: {args.nproc} processes, {measured}", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(args.nproc), "-m", "scripts.memory", "--worker", "--result", str(result), "--scratch",
                               str(scratch), "--depth", str(args.depth), "--width", str(args.width), "--batch",
                               str(args.batch), *(["--no-stall"] if args.no_stall else []),
                               *(["--model", args.model] if args.model else []), *(["--tiny"] if args.tiny else [])],
                              env=env)
        if done.returncode != 0 or not result.is_file():
            print(f"ERROR: the measuring job failed (exit code {done.returncode}); its output is above",
                  file=sys.stderr)
            return None
        return json.loads(result.read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the measuring job (:func:`run_job`), print the tables, write ``--json``. Returns the
    exit status: 0, or 1 after one line on stderr (bad arguments, a failed rank)."""
    args = build_parser().parse_args(argv)
    for name, value in (TINY if args.tiny else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.worker:
        worker(args)
        return 0
    try:
        measured = checked_subject(args)
    except CannotMeasure as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    data = run_job(args, measured)
    if data is None:
        return 1
    print(report(data["rows"], data["stalls"]))
    if args.json:
        args.json.write_text(json.dumps({**data, "ratios": ratios(data["rows"], data["stalls"]),
                                         "settings": vars(args) | {"json": str(args.json)}}, indent=2))
    return 0

if __name__ == "__main__":
    sys.exit(main())
