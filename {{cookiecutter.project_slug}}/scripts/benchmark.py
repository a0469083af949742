"""Train-step throughput of this project's models, comparable with NVIDIA's reference harness.

    python scripts/benchmark.py                                   # every case, tf32/bf16/fp16, fast path
    python scripts/benchmark.py --model tacotron2 --precision bf16 --json ours.json
    python scripts/benchmark.py --eager                           # the plain eager path, for comparison
    python scripts/benchmark.py --tiny --device cpu               # CPU smoke run (under a minute)
    python scripts/benchmark.py --check                           # fast path loss vs eager float32 loss
    python scripts/benchmark.py --loader --dataset-path DIR       # input pipeline items/s

**Train step** (default). For each case and precision: build the model with ``MODELS[name].build_model``
(seed 0), its loss with ``build_criterion``, one synthetic batch with ``synthetic_batch`` (seed 0) on the
device, and time the step ``train.py`` runs: ``zero_grad``; forward and loss under autocast (bf16/fp16);
backward through the GradScaler (fp16); unscale, gradient-norm clipping, Adam step (``fused=True`` on
CUDA), scaler update. The per-step all-reduce and logging of ``train.py`` are left out. Timing as the
reference harness (``shared/bench/reference_train_step.py``): ``--warmup`` untimed steps, then ``--steps``
steps each timed with CUDA events (``time.perf_counter`` on the CPU), and the median (the upper one for
an even count). One JSON row per case and precision: ``case``, ``mode`` (``tf32``, ``amp-bf16``,
``amp-fp16``: the reference's names), ``step_s``, ``items_per_s`` (mel frames/s for Tacotron2, audio
samples/s for WaveGlow, as NVIDIA's tables), ``peak_gib`` (``torch.cuda.max_memory_allocated``, model
and optimizer included; ``null`` on the CPU), plus ``path`` (``fast``/``eager``), ``items_per_step``,
``params_m``, ``loss``. ``--compare REF.json`` adds ``ratio_vs_reference`` (our items/s over the
reference's, same case and mode).

Cases (names and shapes of the reference): ``waveglow256_b12_s16000``, ``waveglow512_b10_s8000``,
``tacotron2_b128``, ``tacotron2_b64``. Their model and audio settings are the config dataclasses'
defaults (NVIDIA's published LJSpeech models, which the reference runs) plus the case's own keys;
``--set`` changes them. ``--tiny`` takes ``config.json`` with its ``tiny`` block instead and shrinks
every batch, for a smoke run on a CPU. A model registered in ``model.MODELS`` with a ``synthetic_batch``
but no case below gets one case, ``<name>_b<batch_size>``, from ``config.json``.

The fast path is ``ModelSpec.optimize_for_training`` (what ``train.compile=true`` selects). It is the
default on CUDA; on the CPU the default is the eager path (compilation there takes minutes for the
whole table) and ``--fast`` asks for it.

**Check** (``--check``): for each case, the fast path's loss and gradients on the same weights (seed 0,
then every parameter moved by ``N(0, 0.01)`` so that WaveGlow's zero-initialised couplings take part)
and batch, in float32 (TF32 off) and in bf16 autocast, against the eager float32 loss. Rows: ``case``,
``mode`` (``check-fp32``, ``check-amp-bf16``), ``loss_rel_diff``, ``limit`` (1e-5, 2e-2), ``ok``,
``grad_rel_diff`` (for information). Inductor's random numbers fall back to eager's here, so dropout
draws the same masks in both paths. The exit status is 1 when a row is not ok.

**Loader** (``--loader --dataset-path DIR``): the training dataset and DataLoader exactly as
``train.py`` builds them (``load_run_config``, ``make_loader``: ``data.num_workers`` workers, pinned
memory on CUDA), iterated for ``--steps`` batches after the first one (worker start-up, reported apart
as ``first_batch_s``). Items are ``ModelSpec.count_items``. Rows ``loader_<model>_wav`` (audio decoded,
mels computed) and, when the dataset reads a mel cache and ``DIR/<data.mel_cache_dir>`` holds mels
(``scripts/preprocess.py``), ``loader_<model>_cached_mels``. Compare ``items_per_s`` with the train
step's: the loader must deliver more per process, or the GPU waits (``train.py`` warns above 10%).

Exit status 0; 1 for a bad argument or config, or a failed check.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

PROJECT_ROOT = Path(__file__).resolve().parent.parent
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

import torch  # noqa: E402

from model import MODELS, ModelSpec  # noqa: E402
from train import load_run_config, make_loader, setup_precision, to_device  # noqa: E402
from utils.config import SHARED_SECTIONS, Config, ConfigError, build_config, load_config  # noqa: E402
from utils.data_utils import DataError  # noqa: E402

PRECISION_MODES = {"fp32": "fp32", "tf32": "tf32", "bf16": "amp-bf16", "fp16": "amp-fp16"}
"""Our ``train.precision`` names -> the reference harness's ``mode`` names."""

CHECK_LIMITS = {"fp32": 1e-5, "bf16": 2e-2}
"""Largest relative loss difference, fast path vs eager float32, per precision (the issue's targets)."""


@dataclasses.dataclass(frozen=True)
class Shape:
    """One case at one size: config overrides (``section.key=value``), batch size, ``synthetic_batch`` keywords."""

    overrides: tuple[str, ...]
    batch_size: int
    batch_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Case:
    """A benchmark case: its name, model, and its full (reference) and ``--tiny`` shapes."""

    name: str
    model: str
    full: Shape
    tiny: Shape


CASES: list[Case] = []
# >>> waveglow
_WAVEGLOW_TINY = ("waveglow.n_flows=4", "waveglow.n_early_every=2", "waveglow.wn_layers=2")
CASES += [
    Case("waveglow256_b12_s16000", "waveglow",
         Shape(("waveglow.wn_channels=256", "waveglow.segment_length=16000", "waveglow.batch_size=12"), 12,
               {"segment_length": 16000}),
         Shape(_WAVEGLOW_TINY + ("waveglow.wn_channels=16", "waveglow.segment_length=2048"), 2,
               {"segment_length": 2048})),
    Case("waveglow512_b10_s8000", "waveglow",
         Shape(("waveglow.wn_channels=512", "waveglow.segment_length=8000", "waveglow.batch_size=10"), 10,
               {"segment_length": 8000}),
         Shape(_WAVEGLOW_TINY + ("waveglow.wn_channels=32", "waveglow.segment_length=1024"), 2,
               {"segment_length": 1024})),
]
# <<< waveglow
# >>> tacotron2
_TACOTRON2_FULL = {"text_lengths": (60, 160), "mel_lengths": (300, 800), "longest_mel": 800}
_TACOTRON2_TINY = {"text_lengths": (6, 16), "mel_lengths": (20, 40), "longest_mel": 40}
CASES += [
    Case("tacotron2_b128", "tacotron2", Shape(("tacotron2.batch_size=128",), 128, _TACOTRON2_FULL),
         Shape(("tacotron2.batch_size=4",), 4, _TACOTRON2_TINY)),
    Case("tacotron2_b64", "tacotron2", Shape(("tacotron2.batch_size=64",), 64, _TACOTRON2_FULL),
         Shape(("tacotron2.batch_size=2",), 2, _TACOTRON2_TINY)),
]
# <<< tacotron2


class BenchmarkError(RuntimeError):
    """A benchmark cannot run as asked (no case for a model, an empty loader, ...)."""


def schemas() -> dict[str, type]:
    """Config sections: the shared ones plus one per registered model."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}


def cases_for(models: list[str]) -> list[Case]:
    """The cases of ``models``: the table's, or one default case for a model the table does not know.

    Raises:
        BenchmarkError: a model without ``synthetic_batch`` (it cannot be benchmarked).
    """
    found = []
    for name in models:
        spec = MODELS[name]
        if spec.synthetic_batch is None:
            raise BenchmarkError(f"model '{name}' has no synthetic_batch in its ModelSpec (model.py); "
                                 "the benchmark needs one")
        own = [case for case in CASES if case.model == name]
        if not own:
            own = [Case(f"{name}_default", name, Shape((), 0), Shape((), 0))]  # sized from config.json
        found += own
    return found


def case_config(case: Case, args: argparse.Namespace) -> tuple[Config, Shape]:
    """The config and shape a case runs with (see the module docstring), user ``--set`` applied last."""
    shape = case.tiny if args.tiny else case.full
    overrides = [*shape.overrides, *args.set]
    if args.tiny or not case.full.overrides:  # the tiny block, or a model without a reference case
        cfg = load_config(args.config, schemas(), tiny=args.tiny, overrides=overrides)
    else:
        cfg = build_config({}, schemas(), overrides=overrides, source="dataclass defaults")
    if shape.batch_size == 0:
        batch_size = cfg.section(case.model).batch_size
        shape = Shape(shape.overrides, batch_size, shape.batch_kwargs)
    return cfg, shape


def case_name(case: Case, shape: Shape) -> str:
    """The row's case name (a default case is named after its batch size)."""
    return f"{case.model}_b{shape.batch_size}" if case.name.endswith("_default") else case.name


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_step_time(step: Callable[[], Any], warmup: int, steps: int, device: torch.device) -> float:
    """Seconds per call of ``step``: ``warmup`` untimed calls, then the median of ``steps`` timed ones.

    CUDA: each step between two CUDA events (the device's own time, queued work included); CPU:
    ``time.perf_counter``. The median is ``sorted(times)[steps // 2]``, as in the reference harness.
    """
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(steps):
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(steps):
            begin = time.perf_counter()
            step()
            times.append(time.perf_counter() - begin)
    times.sort()
    return times[len(times) // 2]


def make_train_step(model: torch.nn.Module, criterion: Callable, batch: dict, cfg: Config, model_cfg: Any,
                    precision: str, device: torch.device) -> Callable[[], torch.Tensor]:
    """The optimizer step of ``train.py`` (one micro-batch) as a closure returning the detached loss.

    ``setup_precision`` sets TF32 (on for every precision but fp32), autocast (bf16/fp16) and the
    GradScaler (fp16); Adam has the model section's learning rate and weight decay, ``fused`` on CUDA;
    gradients are clipped to ``train.grad_clip`` (0: the norm is computed, nothing is clipped).
    """
    autocast, scaler = setup_precision(precision, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=model_cfg.learning_rate,
                                 weight_decay=model_cfg.weight_decay, fused=device.type == "cuda")
    clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = criterion(model(batch), batch)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()
    return step


def use_fast_path(args: argparse.Namespace, device: torch.device) -> bool:
    """``--eager`` / ``--fast`` if given, else the fast path on CUDA only."""
    if args.eager:
        return False
    return args.fast or device.type == "cuda"


def compile_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``torch.compile`` keywords from ``--backend`` and ``--compile-mode``."""
    kwargs: dict[str, Any] = {"backend": args.backend}
    if args.compile_mode:
        kwargs["mode"] = args.compile_mode
    return kwargs


def build(spec: ModelSpec, cfg: Config, shape: Shape, device: torch.device, fast: bool,
          args: argparse.Namespace) -> tuple[torch.nn.Module, Callable, dict]:
    """Model (seed 0, on ``device``, fast path applied if asked), criterion and synthetic batch (seed 0).

    Raises:
        BenchmarkError: the fast path is asked for a model whose ModelSpec has none.
    """
    torch.manual_seed(0)
    model = spec.build_model(cfg).to(device).train()
    if fast:
        model = optimize(spec, model, cfg, args)
    criterion = spec.build_criterion(cfg)
    batch = spec.synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0), **shape.batch_kwargs)
    return model, criterion, to_device(batch, device)


def optimize(spec: ModelSpec, model: torch.nn.Module, cfg: Config, args: argparse.Namespace) -> torch.nn.Module:
    """``spec.optimize_for_training(model, cfg, **compile_kwargs)``, or a clear error when there is none."""
    if spec.optimize_for_training is None:
        raise BenchmarkError("this model has no fast path (ModelSpec.optimize_for_training); use --eager")
    return spec.optimize_for_training(model, cfg, **compile_kwargs(args))


def release(device: torch.device) -> None:
    """Free cached blocks and restart the peak-memory count (between cases)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def bench_case(case: Case, precision: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Time one case at one precision; returns its JSON row (an ``error`` row if the GPU ran out of memory
    or the compiler failed)."""
    cfg, shape = case_config(case, args)
    spec = MODELS[case.model]
    fast = use_fast_path(args, device)
    row: dict[str, Any] = {"case": case_name(case, shape), "mode": PRECISION_MODES[precision],
                           "path": "fast" if fast else "eager"}
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    release(device)
    model = None
    try:
        model, criterion, batch = build(spec, cfg, shape, device, fast, args)
        step = make_train_step(model, criterion, batch, cfg, cfg.section(case.model), precision, device)
        last = {}

        def timed_step() -> None:
            last["loss"] = step()
        seconds = median_step_time(timed_step, args.warmup, args.steps, device)
        items = spec.count_items(batch)
        row.update(step_s=round(seconds, 4), items_per_s=round(items / seconds),
                   peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda"
                   else None,
                   items_per_step=items, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                   loss=round(float(last["loss"]), 5), steps=args.steps, warmup=args.warmup)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:  # compiler failures are RuntimeErrors too
        row["error"] = repr(err)[:300]
    finally:
        del model
        release(device)
    return row


def perturb(model: torch.nn.Module, std: float = 0.01) -> None:
    """Add ``N(0, std)`` noise (seed 1) to every floating-point parameter, in place."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.add_(torch.randn(param.shape, generator=generator).to(param.device) * std)


def loss_and_grads(model: torch.nn.Module, criterion: Callable, batch: dict, precision: str,
                   device: torch.device) -> tuple[float, torch.Tensor]:
    """Loss (float) and the flattened float32 gradients of one forward/backward; global seed 0 first."""
    autocast, _ = setup_precision(precision, device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    with autocast():
        loss = criterion(model(batch), batch)
    loss.backward()
    grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                       for p in model.parameters()])
    return float(loss.detach()), grads


def check_case(case: Case, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Rows ``check-fp32`` and ``check-amp-bf16`` of one case (see the module docstring)."""
    import torch._inductor.config as inductor_config

    cfg, shape = case_config(case, args)
    spec = MODELS[case.model]
    inductor_config.fallback_random = True  # dropout: eager's random numbers inside compiled code too
    torch.manual_seed(0)
    eager = spec.build_model(cfg).to(device).train()
    perturb(eager)
    fast = optimize(spec, copy.deepcopy(eager), cfg, args)
    criterion = spec.build_criterion(cfg)
    batch = to_device(spec.synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0),
                                           **shape.batch_kwargs), device)
    ref_loss, ref_grads = loss_and_grads(eager, criterion, batch, "fp32", device)
    rows = []
    for precision, limit in CHECK_LIMITS.items():
        loss, grads = loss_and_grads(fast, criterion, batch, precision, device)
        rel = abs(loss - ref_loss) / max(abs(ref_loss), 1e-12)
        grad_rel = float((grads - ref_grads).norm() / ref_grads.norm().clamp(min=1e-12))
        rows.append({"case": case_name(case, shape), "mode": f"check-{PRECISION_MODES[precision]}",
                     "path": "fast", "loss_eager_fp32": ref_loss, "loss": loss, "loss_rel_diff": rel,
                     "limit": limit, "ok": bool(rel < limit), "grad_rel_diff": grad_rel})
    return rows


def loader_rows(args: argparse.Namespace, device: torch.device, models: list[str]) -> list[dict]:
    """Loader throughput rows for ``models`` (see the module docstring).

    Raises:
        BenchmarkError: a dataset too small for one batch of the configured batch size.
    """
    rows = []
    for name in models:
        spec = MODELS[name]
        run_args = argparse.Namespace(config=args.config, tiny=args.tiny, set=list(args.set),
                                      dataset_path=args.dataset_path, max_steps=None)
        cfg = load_run_config(run_args)
        variants = [("wav", ["data.mel_cache_dir="])]
        train_set, _ = spec.build_datasets(cfg)
        cache = getattr(train_set, "cache_dir", None)
        if cache is not None and Path(cache).is_dir() and any(Path(cache).glob("*.pt")):
            variants.append(("cached_mels", []))
        for label, extra in variants:
            variant_args = argparse.Namespace(**{**vars(run_args), "set": run_args.set + extra})
            rows.append(time_loader(spec, load_run_config(variant_args), name, f"loader_{name}_{label}",
                                    args.steps, device))
    return rows


def time_loader(spec: ModelSpec, cfg: Config, name: str, label: str, batches: int, device: torch.device) -> dict:
    """Items/s of ``train.py``'s training DataLoader over ``batches`` batches after the first one.

    Batches are moved to ``device`` as ``train.py`` moves them (non-blocking from pinned memory); epochs
    restart (``set_epoch``) when the dataset runs out.

    Raises:
        BenchmarkError: the dataset is too small for one batch.
    """
    train_set, _ = spec.build_datasets(cfg)
    batch_size = cfg.section(name).batch_size
    loader = make_loader(train_set, spec, cfg, batch_size, 0, 1, True, device)
    if len(loader) == 0:
        raise BenchmarkError(f"{len(train_set)} training utterances are too few for one batch of {batch_size}; "
                             f"use --tiny or --set {name}.batch_size=N")

    def stream():
        epoch = 0
        while True:
            loader.sampler.set_epoch(epoch)
            if hasattr(train_set, "set_epoch"):
                train_set.set_epoch(epoch)
            yield from loader
            epoch += 1

    batches_iter = stream()
    begin = time.perf_counter()
    to_device(next(batches_iter), device)
    first = time.perf_counter() - begin
    items = 0
    begin = time.perf_counter()
    for _ in range(batches):
        batch = to_device(next(batches_iter), device)
        items += spec.count_items(batch)
    synchronize(device)
    seconds = time.perf_counter() - begin
    return {"case": label, "mode": "loader", "workers": cfg.data.num_workers, "batch_size": batch_size,
            "batches": batches, "items_per_s": round(items / seconds), "batches_per_s": round(batches / seconds, 2),
            "first_batch_s": round(first, 3), "utterances": len(train_set)}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="all",
                        help=f"comma-separated models to run ({', '.join(MODELS)}; default: all registered)")
    parser.add_argument("--cases", default="all", help="comma-separated case names (default: all of the models')")
    parser.add_argument("--precision", default="tf32,bf16,fp16",
                        help="comma-separated precisions among fp32, tf32, bf16, fp16 (default: tf32,bf16,fp16)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available, else cpu")
    parser.add_argument("--tiny", action="store_true", help="config.json's tiny block and small batches (CPU smoke)")
    parser.add_argument("--json", dest="json_out", help="write the rows to this JSON file (after every row)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 20 on CUDA, 3 on the CPU; loader: batches, default 50)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 5 on CUDA, 1 on the CPU)")
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--eager", action="store_true", help="force the plain eager path")
    path.add_argument("--fast", action="store_true", help="force the fast path (train.compile) on the CPU too")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the fast path (default inductor)")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode of the fast path (e.g. reduce-overhead, max-autotune)")
    parser.add_argument("--check", action="store_true",
                        help="compare the fast path's loss with the eager float32 loss instead of timing")
    parser.add_argument("--compare", metavar="REF_JSON", help="reference harness rows: add ratio_vs_reference")
    parser.add_argument("--loader", action="store_true", help="time the training DataLoader instead")
    parser.add_argument("--dataset-path", help="corpus for --loader (overrides data.dataset_path)")
    parser.add_argument("--config", default=str(PROJECT_ROOT / "config.json"),
                        help="config for --tiny, --loader and models without a reference case")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    args = parser.parse_args(argv)
    args.models = list(MODELS) if args.model == "all" else args.model.split(",")
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"--model {', '.join(unknown)}: not in model.MODELS ({', '.join(MODELS)})")
    args.precisions = args.precision.split(",")
    bad = [p for p in args.precisions if p not in PRECISION_MODES]
    if bad:
        parser.error(f"--precision {', '.join(bad)}: choose among {', '.join(PRECISION_MODES)}")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (use --device cpu)")
    cpu = args.device == "cpu"
    if args.steps is None:
        args.steps = 50 if args.loader else (3 if cpu else 20)
    if args.warmup is None:
        args.warmup = 1 if cpu else 5
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    if args.loader and not args.dataset_path:
        parser.error("--loader needs --dataset-path")
    return args


def print_table(rows: list[dict]) -> None:
    """The timed rows as a Markdown table, like NVIDIA's."""
    print("\n| case | mode | path | step s | items/s | peak GiB | vs reference |\n|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            print(f"| {row['case']} | {row['mode']} | {row['path']} | error: {row['error'][:60]} | | | |")
            continue
        peak = "n/a" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}"
        ratio = f"{row['ratio_vs_reference']:.2f}x" if row.get("ratio_vs_reference") else ""
        print(f"| {row['case']} | {row['mode']} | {row['path']} | {row['step_s']:.4f} | {row['items_per_s']:,} "
              f"| {peak} | {ratio} |")


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name} torch {torch.__version__}; threads {torch.get_num_threads()}", flush=True)
    reference = {}
    if args.compare:
        reference = {(r["case"], r["mode"]): r for r in json.loads(Path(args.compare).read_text())
                     if "items_per_s" in r}
    rows: list[dict] = []

    def emit(row: dict) -> None:
        ref = reference.get((row["case"], row["mode"]))
        if ref and "items_per_s" in row:
            row["ratio_vs_reference"] = round(row["items_per_s"] / ref["items_per_s"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(rows, indent=1))

    try:
        if args.loader:
            for row in loader_rows(args, device, args.models):
                emit(row)
            return 0
        cases = cases_for(args.models)
        if args.cases != "all":
            wanted = args.cases.split(",")
            cases = [c for c in cases if c.name in wanted]
            if not cases:
                raise BenchmarkError(f"--cases {args.cases}: none of them belongs to {', '.join(args.models)}")
        if args.check:
            for case in cases:
                for row in check_case(case, args, device):
                    emit(row)
            failed = [r for r in rows if not r["ok"]]
            print(f"check: {len(rows) - len(failed)} of {len(rows)} rows within their limits", flush=True)
            return 1 if failed else 0
        for case in cases:
            for precision in args.precisions:
                emit(bench_case(case, precision, args, device))
        print_table(rows)
    except (ConfigError, DataError, BenchmarkError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
