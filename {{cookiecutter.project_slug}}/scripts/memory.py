"""What each rank holds, DDP vs FSDP, with or without activation checkpointing, and what a checkpoint save stalls.

    python -m scripts.memory                          # 2 processes, a 24-block model (~50M parameters)
    python -m scripts.memory --nproc 4 --depth 48 --json memory.json
    python -m scripts.memory --tiny                   # a quick look: 6 blocks of width 512 (~20 s on 2 CPU cores)
    python -m scripts.memory --model NAME             # a registered model, its config.json size (--tiny: its tiny one)

Starts its own ranks, trains one step per wrapping (ddp, fsdp) and activation checkpointing (none, full, selective),
and reports per rank, in MiB: parameters, gradients, optimizer state, activations (GPU: peak allocated; CPU:
:class:`SavedActivations`), peak RSS; then :func:`stall`. Bad arguments or a failed rank: one line, exit status 1."""

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

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from distributed import all_gather_object, apply_gradient_allreduce, barrier, cleanup, init_distributed
from model import adam
from models import MODELS
from parts import LEFT_OUT, PARTS, config_schemas
from utils.checkpoint.sharded import ShardedCheckpointer, load_sharded, sharded_intact
from utils.config import load_config
from utils.run_log import bar_options
from utils.train_state import TrainState
from utils.training.activation_checkpoint import apply_activation_checkpointing
from utils.training.criterion import loss_and_terms
from utils.training.fsdp import shard_model
from utils.training.recipe import apply_recipe

ROOT = Path(__file__).resolve().parent.parent

MIB = 2 ** 20
TINY = {"depth": 6, "width": 512, "batch": 512}
DEFAULTS = {"depth": 24, "width": 1024, "batch": 512}
SETTINGS = [(p, m) for p in ("ddp", "fsdp") for m in ("none", "full", "selective")]


class Block(nn.Module):
    """``x + Linear(GELU(Linear(x)))``: ``(B, width) -> (B, width)``, two ``width x width`` weights."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(nn.functional.gelu(self.inner(x)))


@dataclasses.dataclass
class Subject:
    """What is measured: ``build(seed)`` (float32, CPU), ``blocks(model)`` (what FSDP shards and checkpointing
    recomputes, in forward order), ``loss(net, rank)`` (one batch's scalar loss), ``optimizer(model)``, ``name``."""

    build: Callable[[int], nn.Module]
    blocks: Callable[[nn.Module], list]
    loss: Callable[[nn.Module, int], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    name: str


def mlp_subject(args) -> Subject:
    """``--depth`` :class:`Block` s of ``--width`` features, batches of ``--batch`` rows, with Adam."""
    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(*(Block(args.width) for _ in range(args.depth)))

    def loss(net: nn.Module, rank: int) -> torch.Tensor:
        device = next(net.parameters()).device
        return net(torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank)).to(device)) \
            .pow(2).mean()
    return Subject(build, list, loss, lambda model: torch.optim.Adam(model.parameters(), lr=1e-4),
                   f"{args.depth} blocks of width {args.width}, batch {args.batch} per rank")


class CannotMeasure(ValueError):
    """A model this script cannot measure (named in one line)."""


def model_subject(name: str, tiny: bool) -> Subject:
    """Registered model ``name`` (``tiny``: its tiny block), its first benchmark case's synthetic batch, criterion and
    optimizer. Raises CannotMeasure: no such model, one without blocks or benchmark cases, or of several optimizers."""
    if name not in MODELS:
        raise CannotMeasure(f"--model {name}: models/__init__.py registers no such model (it has "
                            f"{', '.join(sorted(MODELS))})")
    spec, bench = MODELS[name], PARTS.benchmarks.get(name)
    lacking = [what for what, missing in (("Training.blocks", spec.training.blocks is None),
                                          ("synthetic_batch (a Benchmark in parts.py)", bench is None),
                                          ("benchmark cases", bench is None or not bench.cases)) if missing]
    if lacking or spec.phase_names:
        raise CannotMeasure(f"--model {name}: " + (f"it has no {', '.join(lacking)}" if lacking else
                                                  "it trains several optimizers, which FSDP does not shard yet"))
    case = bench.cases[0]
    shape = case.tiny if tiny and case.tiny is not None else case
    cfg = apply_recipe(spec, load_config(str(ROOT / "config.json"), config_schemas(), tiny=tiny,
                                         overrides=list(case.overrides), left_out=LEFT_OUT))
    batch = bench.synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0), **shape.batch_kwargs)
    criterion = spec.training.build_criterion(cfg)
    build_optimizer = spec.training.build_optimizer or adam

    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return spec.build_model(cfg)

    def loss(net: nn.Module, rank: int) -> torch.Tensor:
        device = next(net.parameters()).device
        on_device = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        return loss_and_terms(criterion(net(on_device), on_device))[0]
    return Subject(build, lambda model: list(spec.training.blocks(model)), loss,
                   lambda model: build_optimizer(model, cfg, torch.device("cpu")),
                   f"model '{name}' ({'tiny' if tiny else 'config.json'} size), batch {shape.batch_size} per rank")


def subject(args) -> Subject:
    """:func:`model_subject` with ``--model``, else :func:`mlp_subject`."""
    return model_subject(args.model, args.tiny) if args.model else mlp_subject(args)


def local_bytes(tensors) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard only); ``None`` (no gradient) counts 0."""
    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors if t is not None)
    return sum(t.numel() * t.element_size() for t in local)


class SavedActivations:
    """On a CPU, the bytes autograd keeps for backward in the ``with`` block (``saved_tensors_hooks``): each storage
    once, parameters and their views left out (FSDP's gathered weights too), plus checkpointed blocks' inputs."""

    def __init__(self, checkpointed: list[nn.Module]):
        self.kept: dict[int, tuple] = {}  # data pointer -> (storage, bytes when counted)
        self.checkpointed, self.handles, self.bytes = checkpointed, [], 0

    def _add(self, tensor: torch.Tensor) -> torch.Tensor:
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter) or not tensor.is_floating_point():
            return tensor  # a weight, or a view of one (Linear keeps weight.t()): parameters are counted apart
        storage = tensor.untyped_storage()
        known = self.kept.get(storage.data_ptr())
        if known is None or known[0].nbytes() == 0:  # memory still held counts once; a freed address may be reused
            self.kept[storage.data_ptr()] = (storage, storage.nbytes())
        return tensor

    def _inputs(self, module, args) -> None:
        for arg in filter(torch.is_tensor, args):
            self._add(arg)

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._add, lambda tensor: tensor)
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
    """One training step of the subject with ``parallelism`` (``ddp`` / ``fsdp``) and activation checkpointing
    ``mode``: this rank's row (MiB, ``method`` of the activations). Every rank calls it (wrapping is collective)."""
    what = subject(args)
    model = what.build(0).to(device)
    blocks = what.blocks(model)
    wrapped = apply_activation_checkpointing(blocks, mode, every=2)
    net = shard_model(model, blocks) if parallelism == "fsdp" else apply_gradient_allreduce(model)
    optimizer = what.optimizer(model)
    cuda = device.type == "cuda"
    if cuda:
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
    state = (v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))  # Adam: moments, step
    return {"rank": rank, "parallelism": parallelism, "activation_checkpointing": mode,
            "params_mib": local_bytes(model.parameters()) / MIB,
            "grads_mib": local_bytes(p.grad for p in model.parameters()) / MIB,
            "optimizer_mib": local_bytes(state) / MIB, "activations_mib": activations / MIB,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "method": "torch.cuda.max_memory_allocated" if cuda else "saved-tensor accounting"}


def fsdp_model(args, device: torch.device, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The subject sharded by FSDP per block after one step (``seed``: weights and batch): a run's checkpoint state."""
    what = subject(args)
    model = what.build(seed).to(device)
    shard_model(model, blocks=what.blocks(model))
    optimizer = what.optimizer(model)
    what.loss(model, seed).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def state_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's local parts of the weights and the optimizer state, in a fixed order."""
    tensors = []
    for param in model.parameters():
        state = optimizer.state.get(param, {})
        tensors += [param, *(state[key] for key in sorted(state) if torch.is_tensor(state[key]))]
    return [t.to_local() if isinstance(t, DTensor) else t for t in tensors]


def stall(async_save: bool, args, rank: int, device: torch.device, folder: Path) -> dict:
    """Seconds ``ShardedCheckpointer.save`` of the FSDP subject blocks the loop (``stall_s``) and until it is in place
    (``complete_s``); then the folder must be ``sharded_intact`` and give back the state at ``save()`` although every
    value changed right after it returned (a background save without its own copy is caught). Every rank calls it.
    Raises RuntimeError: the checkpoint is damaged or does not give back the saved state."""
    def fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor:  # one float64 sum per tensor: cheap to keep
        return torch.stack([t.detach().double().sum().cpu() for t in tensors])
    model, optimizer = fsdp_model(args, device, seed=0)
    saved = fingerprint(state_tensors(model, optimizer))
    kind = "async" if async_save else "sync"
    folder.mkdir(parents=True, exist_ok=True)
    saver = ShardedCheckpointer(folder, rank, async_save=async_save)  # the async one creates its gloo group here
    barrier()
    start = time.perf_counter()
    saver.save(1, {"model": model, "optimizer": optimizer, "position": TrainState(step=1)}, {})
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
        raise RuntimeError(f"the {kind} checkpoint {final} is {problem}")
    size = sum(f.stat().st_size for f in final.iterdir())
    del model, optimizer
    fresh, fresh_optimizer = fsdp_model(args, device, seed=1)
    load_sharded(final, fresh, [fresh_optimizer])
    loaded = fingerprint(state_tensors(fresh, fresh_optimizer))
    if loaded.shape != saved.shape or not torch.allclose(loaded, saved, rtol=1e-9, atol=0.0):
        raise RuntimeError(f"rank {rank}: the {kind} checkpoint {final} does not give back the state saved (it "
                           "holds values changed after save() returned, or lacks some)")
    return {"rank": rank, "save": kind, "checkpoint_mb": size / 1e6, "stall_s": blocked, "complete_s": finished,
            "verified": True}


def worker(args) -> None:
    """Each rank's body (``--worker``): every setting, then the saves; rank 0 writes them to ``--result``."""
    info = init_distributed(check_environ=PARTS.check_environ)
    rows, stalls = [], []
    jobs = [*SETTINGS, *([] if args.no_stall else [("save", "sync"), ("save", "async")])]
    bar = tqdm(total=len(jobs), desc="memory.py", unit="setting", disable=not info.is_main, dynamic_ncols=True,
               **bar_options())
    for first, second in jobs:
        if first != "save":
            rows += all_gather_object(measure(first, second, args, info.rank, info.device))
            note = f"measured {first} / activation checkpointing {second}"
        else:
            async_save = second == "async"
            stalls += all_gather_object(stall(async_save, args, info.rank, info.device, Path(args.scratch) / second))
            note = f"measured a {'background' if async_save else 'synchronous'} save (checkpoint verified)"
        bar.update()
        if info.is_main:
            bar.write(note, file=sys.stderr)
    bar.close()
    if info.is_main:
        Path(args.result).write_text(json.dumps({"rows": rows, "stalls": stalls}))
    cleanup()


def ratios(rows: list[dict], stalls: list[dict]) -> dict:
    """The summary, from the ranks' means: ``fsdp_over_ddp_state`` (parameters + gradients + optimizer state, without
    checkpointing), ``{ddp,fsdp}_{full,selective}_over_none_activations``, ``async_over_sync_stall`` (slowest ranks)."""
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
        slowest = {kind: max(s["stall_s"] for s in stalls if s["save"] == kind) for kind in ("sync", "async")}
        result["async_over_sync_stall"] = slowest["async"] / slowest["sync"]
    return result


def report(rows: list[dict], stalls: list[dict]) -> str:
    """The rows as two plain-text tables (memory per rank and setting, MiB; saves, seconds) and the ratios."""
    lines = [f"{'parallelism':<12}{'act. ckpt':<11}{'rank':>4}{'params':>9}{'grads':>9}{'optim.':>9}"
             f"{'activ.':>9}{'peak RSS':>10}   (MiB per rank; activations by {rows[0]['method']})"]
    lines += [f"{r['parallelism']:<12}{r['activation_checkpointing']:<11}{r['rank']:>4}{r['params_mib']:>9.1f}"
              f"{r['grads_mib']:>9.1f}{r['optimizer_mib']:>9.1f}{r['activations_mib']:>9.1f}{r['peak_rss_mib']:>10.0f}"
              for r in rows]
    if stalls:
        lines.append(f"\n{'save':<7}{'rank':>4}{'checkpoint MB':>15}{'stall s':>9}{'complete s':>12}{'verified':>10}")
        lines += [f"{s['save']:<7}{s['rank']:>4}{s['checkpoint_mb']:>15.1f}{s['stall_s']:>9.3f}{s['complete_s']:>12.3f}"
                  f"{'yes' if s['verified'] else 'NO':>10}" for s in stalls]
    lines.append("\n" + "; ".join(f"{key} {value:.3f}" for key, value in ratios(rows, stalls).items()))
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
    """What will be measured (:func:`subject`), said before any rank starts. Raises CannotMeasure: a count below its
    least value, a ``--json`` in no folder, or a model it cannot measure."""
    problem = next((f"--{name} must be >= {least}, got {getattr(args, name)}"
                    for name, least in (("nproc", 2), ("depth", 1), ("width", 1), ("batch", 1))
                    if getattr(args, name) < least), None)
    if problem is None and args.json is not None and not args.json.parent.is_dir():
        problem = f"--json {args.json}: its folder {args.json.parent} does not exist"
    if problem is not None:
        raise CannotMeasure(problem)
    return subject(args).name


def run_job(args, measured: str) -> dict | None:
    """Run ``--nproc`` ranks of this module (one GPU each, or all on the CPU): rank 0's result, or ``None`` after one
    line on stderr when the job failed."""
    scratch = Path(tempfile.mkdtemp(prefix="memory-"))
    try:
        result = scratch / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc:
            env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU per rank or none: NCCL cannot share a GPU between ranks
        print(f"memory: {args.nproc} processes, {measured}", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc), "-m",
               "scripts.memory", "--worker", "--result", str(result), "--scratch", str(scratch), "--depth",
               str(args.depth), "--width", str(args.width), "--batch", str(args.batch),
               *(["--no-stall"] if args.no_stall else []), *(["--model", args.model] if args.model else []),
               *(["--tiny"] if args.tiny else [])]
        done = subprocess.run(cmd, env=env)
        if done.returncode != 0 or not result.is_file():
            print(f"ERROR: the measuring job failed (exit code {done.returncode}); its output is above",
                  file=sys.stderr)
            return None
        return json.loads(result.read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run the measuring job, print the tables, write ``--json``. Returns the exit status."""
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
