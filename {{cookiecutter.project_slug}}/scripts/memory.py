"""What each rank holds, DDP vs FSDP and with or without activation checkpointing, and what a checkpoint save costs
the training loop, synchronous vs in the background.

    python scripts/memory.py                          # 2 processes, a 24-block model (~50M parameters)
    python scripts/memory.py --nproc 4 --depth 48 --json memory.json
    python scripts/memory.py --depth 8 --width 512 --batch 512 --no-stall      # a quick look

It starts its own ranks (``torch.distributed.run --standalone``: gloo on CPUs, NCCL when every rank has a GPU)
and trains one step of a deep residual MLP (``--depth`` blocks of Linear-GELU-Linear, ``--width`` features,
Adam) in each setting: ``ddp``, ``fsdp`` (``distributed.apply_gradient_allreduce``, per block), each with
activation checkpointing ``none``, ``full`` and ``selective`` (``utils.activation_checkpoint``), exactly as
``train.py`` applies them. Per rank it reports, in MiB:

* parameters, gradients, optimizer state: the bytes of the tensors this rank holds (a sharded tensor's local
  shard), counted tensor by tensor: exact, on any device;
* activations: on a GPU, the peak of ``torch.cuda.memory_allocated`` during the forward pass above what it was
  before; on a CPU (no allocator statistics), the bytes autograd keeps for the backward pass
  (``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters left out) plus the inputs a
  checkpointed block keeps to run its forward again;
* peak RSS of the process, for context (allocator caches and the Python runtime included).

Then the stall: an FSDP model of the same size saves a sharded checkpoint (model + Adam state, several hundred
MB at the default size) through ``utils.checkpoint.ShardedCheckpointer``, synchronously and with
``async_save``; the stall is how long ``save()`` blocks the loop, and for the background save also how long it
takes to finish. Ratios at the end: FSDP / DDP parameter + gradient + optimizer memory per rank, full / none and
selective / none activation memory, async / sync stall.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

MIB = 2 ** 20
SETTINGS = [("ddp", "none"), ("ddp", "full"), ("ddp", "selective"), ("fsdp", "none"), ("fsdp", "full"),
            ("fsdp", "selective")]


class Block(nn.Module):
    """``x + Linear(GELU(Linear(x)))``: ``(B, width) -> (B, width)``, two ``width x width`` weights."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.outer = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.outer(nn.functional.gelu(self.inner(x)))


def deep_model(depth: int, width: int) -> nn.Sequential:
    """``depth`` :class:`Block` s, the same weights on every rank (seeded)."""
    torch.manual_seed(0)
    return nn.Sequential(*(Block(width) for _ in range(depth)))


def local_bytes(tensors) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
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
    """One training step of the deep model in one setting; this rank's row."""
    from distributed import apply_gradient_allreduce
    from utils.activation_checkpoint import apply_activation_checkpointing

    model = deep_model(args.depth, args.width).to(device)
    blocks = list(model)
    wrapped = apply_activation_checkpointing(blocks, mode, every=2)
    net = apply_gradient_allreduce(model, parallelism, blocks=blocks if parallelism == "fsdp" else ())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank)).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = net(x).pow(2).mean()
        activations = torch.cuda.max_memory_allocated() - before
    else:
        with SavedActivations(wrapped) as saved:
            loss = net(x).pow(2).mean()
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


def stall(async_save: bool, args, rank: int, device: torch.device, folder: Path) -> dict:
    """Seconds a sharded checkpoint save of an FSDP model (with its Adam state) blocks the loop; for a background
    save also the seconds until it is complete."""
    from distributed import apply_gradient_allreduce, barrier
    from utils.checkpoint import ShardedCheckpointer, TrainState

    model = deep_model(args.depth, args.width).to(device)
    apply_gradient_allreduce(model, "fsdp", blocks=list(model))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(8, args.width, device=device)).pow(2).mean().backward()
    optimizer.step()  # Adam's two moments exist now: the checkpoint holds them
    folder.mkdir(parents=True, exist_ok=True)
    saver = ShardedCheckpointer(folder, rank, async_save=async_save)
    barrier()
    start = time.perf_counter()
    saver.save(1, model, [optimizer], {"step": 1, **TrainState(step=1).__dict__} if rank == 0 else None)
    blocked = time.perf_counter() - start
    saver.wait()
    barrier()
    finished = time.perf_counter() - start
    size = sum(f.stat().st_size for f in (folder / "checkpoint_1").iterdir())
    return {"rank": rank, "save": "async" if async_save else "sync", "checkpoint_mb": size / 1e6,
            "stall_s": blocked, "complete_s": finished}


def worker(args) -> None:
    from distributed import all_gather_object, cleanup, init_distributed

    info = init_distributed()
    rows, stalls = [], []
    for parallelism, mode in SETTINGS:
        rows += all_gather_object(measure(parallelism, mode, args, info.rank, info.device))
        if info.is_main:
            print(f"measured {parallelism} / activation checkpointing {mode}", file=sys.stderr, flush=True)
    if not args.no_stall:
        for async_save in (False, True):
            folder = Path(args.scratch) / ("async" if async_save else "sync")
            stalls += all_gather_object(stall(async_save, args, info.rank, info.device, folder))
            if info.is_main:
                print(f"measured a {'background' if async_save else 'synchronous'} save", file=sys.stderr, flush=True)
    if info.is_main:
        Path(args.result).write_text(json.dumps({"rows": rows, "stalls": stalls}))
    cleanup()


def ratios(rows: list[dict], stalls: list[dict]) -> dict:
    """The summary: means over ranks of each setting, then the ratios the docs quote."""
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
    lines = [f"{'parallelism':<12}{'act. ckpt':<11}{'rank':>4}{'params':>9}{'grads':>9}{'optim.':>9}"
             f"{'activ.':>9}{'peak RSS':>10}   (MiB; activations by {rows[0]['method']})"]
    for r in rows:
        lines.append(f"{r['parallelism']:<12}{r['activation_checkpointing']:<11}{r['rank']:>4}{r['params_mib']:>9.1f}"
                     f"{r['grads_mib']:>9.1f}{r['optimizer_mib']:>9.1f}{r['activations_mib']:>9.1f}"
                     f"{r['peak_rss_mib']:>10.0f}")
    if stalls:
        lines.append(f"\n{'save':<7}{'rank':>4}{'checkpoint MB':>15}{'stall s':>9}{'complete s':>12}")
        for s in stalls:
            lines.append(f"{s['save']:<7}{s['rank']:>4}{s['checkpoint_mb']:>15.1f}{s['stall_s']:>9.3f}"
                         f"{s['complete_s']:>12.3f}")
    summary = ratios(rows, stalls)
    lines.append("\n" + "; ".join(f"{key} {value:.3f}" for key, value in summary.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-rank memory (DDP vs FSDP, activation checkpointing) and the "
                                                 "stall of a checkpoint save (sync vs async).")
    parser.add_argument("--nproc", type=int, default=2, help="processes (ranks); default 2")
    parser.add_argument("--depth", type=int, default=24, help="blocks of the model (default 24)")
    parser.add_argument("--width", type=int, default=1024, help="features (default 1024: 2M weights a block)")
    parser.add_argument("--batch", type=int, default=512, help="rows per rank (default 512)")
    parser.add_argument("--no-stall", action="store_true", help="leave out the checkpoint-save measurement")
    parser.add_argument("--json", type=Path, help="also write the rows and ratios here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    for name in ("nproc", "depth", "width", "batch"):
        if getattr(args, name) < 1:
            print(f"ERROR: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 1
    scratch = Path(tempfile.mkdtemp(prefix="memory-"))
    try:
        result = scratch / "result.json"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        if not torch.cuda.is_available() or torch.cuda.device_count() < args.nproc:
            env["CUDA_VISIBLE_DEVICES"] = ""  # one GPU per rank or none: NCCL cannot share a GPU between ranks
        print(f"memory: {args.nproc} processes, {args.depth} blocks of width {args.width}, batch {args.batch} per rank",
              file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               str(args.nproc), __file__, "--worker", "--result", str(result), "--scratch",
                               str(scratch), "--depth", str(args.depth), "--width", str(args.width), "--batch",
                               str(args.batch), *(["--no-stall"] if args.no_stall else [])], env=env)
        if done.returncode != 0 or not result.is_file():
            print(f"ERROR: the measuring job failed (exit code {done.returncode}); its output is above",
                  file=sys.stderr)
            return 1
        data = json.loads(result.read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(report(data["rows"], data["stalls"]))
    if args.json:
        args.json.write_text(json.dumps({**data, "ratios": ratios(data["rows"], data["stalls"]),
                                         "settings": vars(args) | {"json": str(args.json)}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
