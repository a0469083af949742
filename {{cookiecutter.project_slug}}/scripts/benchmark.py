"""Train-step throughput of this project's models, comparable with NVIDIA's reference harness.

    python scripts/benchmark.py                                   # every case, tf32/bf16/fp16, fast path
    python scripts/benchmark.py --model NAME --precision bf16 --json ours.json
    python scripts/benchmark.py --eager                           # the plain eager path, for comparison
    python scripts/benchmark.py --tiny --device cpu               # CPU smoke run (under a minute)
    python scripts/benchmark.py --device cpu --full-size          # full-size models on a CPU (minutes a step)
    python scripts/benchmark.py --check                           # fast path loss vs eager float32 loss
    python scripts/benchmark.py --loader --dataset-path DIR       # input pipeline items/s
    python scripts/benchmark.py --padding --dataset-path DIR      # padded share of batches: random vs buckets

Everything about a model comes from its ``ModelSpec`` (``model.py``); a model that lacks what a mode
needs is skipped with a line saying so.

**Train step** (default). For each case and precision: build the model with ``build_model`` (seed 0), its
loss with ``build_criterion``, one batch from ``synthetic_batch`` (seed 0) on the device, and time the
step ``train.py`` runs: for each of the model's optimizers (one, or one per ``ModelSpec.phases``, e.g. a
GAN's discriminator then generator) ``train.forward_backward`` (forward and loss under autocast, backward
through the GradScaler, unscale, gradient-norm clipping) and that optimizer's step; then the scaler update.
The per-step all-reduce, checks and logging of ``train.py`` are left out. Timing as NVIDIA's reference
harness times its models (the harness is not part of this project): ``--warmup`` untimed steps, then
``--steps`` steps each timed with CUDA events (``time.perf_counter`` on the CPU), and the median (the upper
one for an even count). One JSON row per case and precision: ``case``, ``mode`` (``tf32``, ``amp-bf16``, ``amp-fp16``: the
reference's names), ``step_s``, ``items_per_s`` (``count_items`` per second: audio samples or mel frames
for the examples, as NVIDIA's tables), ``peak_gib`` (``torch.cuda.max_memory_allocated``, model and
optimizer included; ``null`` on the CPU), plus ``path`` (``fast``/``eager``), ``tiny`` (true for the
small shapes below), ``items_per_step``, ``params_m``, ``loss``. ``--compare REF.json`` adds
``ratio_vs_reference`` (our items/s over the reference's, same case and mode).

Cases are each model's ``benchmark_cases`` (the example models carry the names and shapes of the
reference); their settings are the config dataclasses' defaults (NVIDIA's published LJSpeech models,
which the reference runs) plus the case's own keys, and ``--set`` changes them. ``--tiny`` takes
``config.json`` with its ``tiny`` block instead and each case's smaller ``tiny`` shape, for a smoke run on a
CPU. A model with a ``synthetic_batch`` but no cases gets one, ``<name>_b<batch_size>``, from
``config.json``.

**Tiny rows are named after their tiny shape**, never after the full-size case they stand in for:
``tiny_<model>_b<batch size>`` plus ``_<first letter of the key><value>`` for each integer keyword of
``synthetic_batch`` (``tiny_waveglow_b2_s2048``: batch 2 of 2048-sample crops), or ``tiny_<name>`` when
the case's ``tiny`` shape has a name of its own. Such rows carry ``"tiny": true`` and ``full_size_case``, the
name of the full-size case. ``--cases`` takes either name.

**On a CPU, tiny is the default.** A full-size train step takes minutes on a CPU, so without ``--tiny`` and
without ``--full-size`` a CPU run uses the tiny shapes and says so in one line; ``--full-size`` times the
full-size models anyway, after one line saying what that costs. On CUDA, full size is the default.

**Progress.** Every timed case and every loader measurement shows a tqdm bar on stderr (steps or batches
done, seconds each); JSON rows and tables go to stdout. ``--no-progress`` hides the bars.

The fast path is ``ModelSpec.optimize_for_training`` (what ``train.compile=true`` selects). It is the
default on CUDA; on the CPU the default is the eager path (compilation there takes minutes for the
whole table) and ``--fast`` asks for it.

**Check** (``--check``): for each case, the fast path's loss and gradients on the same weights (seed 0,
then every parameter moved by ``N(0, 0.01)`` so that zero-initialised layers take part) and batch, in
float32 (TF32 off) and in bf16 autocast, against the eager float32 loss. Rows: ``case``, ``mode``
(``check-fp32``, ``check-amp-bf16``), ``loss_rel_diff``, ``limit`` (1e-5, 2e-2), ``ok``,
``grad_rel_diff`` (for information). Inductor's random numbers fall back to eager's here, so dropout
draws the same masks in both paths. The exit status is 1 when a row is not ok.

**Loader** (``--loader --dataset-path DIR``): first the train step on the corpus's first real batch
(row ``train_<model>``: items/s the loader must keep up with on this device), then the training dataset and
DataLoader exactly as ``train.py`` builds them (``load_run_config``, ``make_loader``, pinned memory on
CUDA) with each ``--workers`` count (1, 2, 4, 8), iterated for ``--steps`` batches after the first one
(worker start-up, reported apart as ``first_batch_s``). Items are ``ModelSpec.count_items``. Rows
``loader_<model>_wav`` (audio decoded, mels computed) and, when the dataset reads a mel cache (a
``cache_dir`` attribute) that holds mels, ``loader_<model>_cached_mels``. A table ends the run: loader
items/s per worker count beside the train step's, and the fewest workers that keep up (per process: with
N GPUs on a node, each rank runs its own workers).

**Padding** (``--padding --dataset-path DIR``): for each model whose items differ in length
(``ModelSpec.variable_length``), the share of a padded batch that is padding over one epoch of the training
dataset (``lengths()``, e.g. Tacotron2's mel frames), with ``data.batching=random`` and ``buckets``
(:class:`utils.data_utils.LengthBucketSampler`): rows ``padding_<model>`` with ``batching``, ``batch_size``,
``utterances``, ``batches`` and ``padding_fraction``. Nothing is loaded but the wav headers, and the batch
size is the config's full-size one unless ``--tiny`` is given.

Exit status 0; 1 for a bad argument or config, or a failed check.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

PROJECT_ROOT = Path(__file__).resolve().parent.parent
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from models import MODELS, config_schemas  # noqa: E402
from model import BenchmarkCase, ModelSpec  # noqa: E402
from utils.training.guards import TrainingError
from utils.data.loader import batch_stream, make_loader, on_device_hook, to_device
from utils.training.optim import build_optimizers, setup_precision
from utils.training.step import build_phases, forward_backward, one_loss_step
from train import load_run_config
from utils.checkpoint.state import TrainState  # noqa: E402
from utils.config import Config, ConfigError, build_config, load_config  # noqa: E402
from utils.data.corpus import DataError
from utils.data.samplers import LengthBucketSampler, padding_fraction, random_batches

PRECISION_MODES = {"fp32": "fp32", "tf32": "tf32", "bf16": "amp-bf16", "fp16": "amp-fp16"}
"""Our ``train.precision`` names -> the reference harness's ``mode`` names."""

CHECK_LIMITS = {"fp32": 1e-5, "bf16": 2e-2}
"""Largest relative loss difference, fast path vs eager float32, per precision (no unit: a ratio)."""

CPU_TINY_NOTE = ("on a CPU a full-size train step takes minutes: using the tiny shapes (config.json's tiny "
                 "block, each case's tiny shape; rows named tiny_...); add --full-size to time full size anyway")
"""The line a CPU run without ``--tiny`` or ``--full-size`` prints before it starts."""

CPU_FULL_SIZE_NOTE = ("--full-size on a CPU: a full-size train step of the example models takes minutes (over "
                      "100 s on 2 cores), and each case runs --warmup + --steps of them; --tiny is the CPU smoke run")
"""The line a CPU run with ``--full-size`` prints before it starts: what it will cost."""


class BenchmarkError(RuntimeError):
    """A benchmark cannot run as asked (no case for a model, an empty loader, ...)."""


def skip_note(name: str, what: str) -> None:
    """Say on stdout that model ``name`` lacks ``what`` and is skipped (the benchmark never skips silently)."""
    print(f"skipping {name}: {what}", flush=True)


def cases_for(models: list[str]) -> list[tuple[str, BenchmarkCase]]:
    """``(model, case)`` pairs of ``models``: each model's ``benchmark_cases``, or one case sized from
    ``config.json`` (``<name>_b<batch_size>``) for a model that has random batches but no cases of its own.
    A model without ``synthetic_batch`` cannot be timed on random batches: it is skipped with a line saying so.
    """
    found = []
    for name in models:
        spec = MODELS[name]
        if spec.synthetic_batch is None:
            skip_note(name, "its ModelSpec has no synthetic_batch, which the train-step benchmark needs "
                            "(--loader still times its DataLoader)")
            continue
        found += [(name, case) for case in spec.benchmark_cases or (BenchmarkCase(f"{name}_default", (), 0),)]
    return found


def case_config(name: str, case: BenchmarkCase, args: argparse.Namespace) -> tuple[Config, BenchmarkCase]:
    """The config and shape a case runs with (see the module docstring), user ``--set`` applied last."""
    shape = (case.tiny or case) if args.tiny else case
    overrides = [*shape.overrides, *args.set]
    if args.tiny or case.name.endswith("_default"):  # the tiny block, or a model without shapes of its own
        cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides)
    else:  # NVIDIA's published models are the config dataclasses' defaults
        cfg = build_config({}, config_schemas(), overrides=overrides, source="dataclass defaults")
    if shape.batch_size == 0:
        shape = dataclasses.replace(shape, batch_size=cfg.section(name).batch_size)
    return cfg, shape


def case_name(name: str, case: BenchmarkCase, shape: BenchmarkCase, tiny: bool) -> str:
    """The row's case name: the case's own name at full size (a default case is ``<name>_b<batch_size>``).

    With ``tiny``, a name built from the tiny ``shape`` that the rows actually time:
    ``tiny_<model>_b<batch size>`` plus ``_<first letter of key><value>`` for every integer
    ``batch_kwargs`` entry, in key order (``tiny_waveglow_b2_s2048``: batch 2, 2048-sample crops); or
    ``tiny_<name>`` when ``case.tiny`` has a name of its own.
    """
    if not tiny:
        return f"{name}_b{shape.batch_size}" if case.name.endswith("_default") else case.name
    if case.tiny is not None and case.tiny.name:
        return case.tiny.name if case.tiny.name.startswith("tiny_") else f"tiny_{case.tiny.name}"
    sizes = "".join(f"_{key[0]}{value}" for key, value in sorted(shape.batch_kwargs.items())
                    if isinstance(value, int) and not isinstance(value, bool))
    return f"tiny_{name}_b{shape.batch_size}{sizes}"


def shape_fields(name: str, case: BenchmarkCase, args: argparse.Namespace) -> dict[str, Any]:
    """``tiny`` for every row, and for a tiny row of a named case ``full_size_case``: the case it stands in for."""
    fields: dict[str, Any] = {"tiny": bool(args.tiny)}
    if args.tiny and not case.name.endswith("_default"):
        fields["full_size_case"] = case.name
    return fields


def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> tqdm:
    """A tqdm bar on stderr for ``total`` ``unit`` s (it is drawn at once, so a slow first step still shows
    that work started); removed when closed, so that stdout's rows and tables stay readable."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, disable=not enabled,
                dynamic_ncols=True)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_step_time(step: Callable[[], Any], warmup: int, steps: int, device: torch.device, desc: str = "steps",
                     progress: bool = True) -> float:
    """Seconds per call of ``step``: ``warmup`` untimed calls, then the median of ``steps`` timed ones.

    CUDA: each step between two CUDA events (the device's own time, queued work included); CPU:
    ``time.perf_counter``. The median is ``sorted(times)[steps // 2]``, as in the reference harness.
    With ``progress``, a tqdm bar ``desc`` on stderr counts the ``warmup + steps`` calls (the bar's own
    drawing happens between timed calls, never inside one).
    """
    with progress_bar(warmup + steps, desc, "step", progress) as bar:
        for _ in range(warmup):
            step()
            synchronize(device)
            bar.update()
        times = []
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(steps):
                start.record()
                step()
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end) / 1e3)
                bar.update()
        else:
            for _ in range(steps):
                begin = time.perf_counter()
                step()
                times.append(time.perf_counter() - begin)
                bar.update()
    times.sort()
    return times[len(times) // 2]


def make_train_step(model: torch.nn.Module, criterion: Callable, batch: dict, cfg: Config, spec: ModelSpec,
                    name: str, precision: str, device: torch.device) -> Callable[[], torch.Tensor]:
    """The optimizer step of ``train.py`` (one micro-batch, one process) as a closure returning ``{"loss": the
    detached loss of its last phase}``, with ``loss_<phase>`` and the named metrics of each phase for a model
    with several optimizers (as ``train.py`` logs them).

    The model's optimizers as ``train.py`` builds them (``train.build_optimizers``: Adam by default, fused on
    CUDA; one per ``ModelSpec.phases`` name for a model with several) and its phases
    (``train.build_phases``). Each step moves the same batch through the model's ``on_device`` hook, then for
    each phase in order runs ``train.forward_backward`` (forward and loss under autocast from
    ``setup_precision``, backward through the GradScaler, unscale, clipping to ``train.grad_clip``) and that
    phase's optimizer step; the scaler updates once per step and the gradients are cleared. The per-step
    all-reduce, spike checks and LR schedule of ``train.py`` are left out.

    Raises:
        TrainingError: the model's ``build_optimizer`` or ``networks`` do not match its phases.
    """
    autocast, scaler = setup_precision(precision, device)
    optimizers = build_optimizers(spec, name, model, cfg.section(name), device)
    no_schedule = {phase: (None, "step") for phase in optimizers}  # the benchmark keeps the learning rate fixed
    phases = build_phases(spec, name, model, optimizers, no_schedule, cfg)
    step_fn = spec.train_step or one_loss_step(criterion)
    prepare = on_device_hook(spec, cfg)

    def step() -> dict[str, torch.Tensor]:
        micro, losses = [to_device(batch, device, prepare)], {}
        for phase in phases:
            result = forward_backward(phase, phases, step_fn, micro, scaler, autocast, 1, cfg.train.grad_clip)
            scaler.step(phase.optimizer)
            if len(phases) > 1:
                losses.update({f"loss_{phase.name}": result.loss, **result.metrics})
        scaler.update()
        for phase in phases:
            phase.optimizer.zero_grad(set_to_none=True)
        return {"loss": result.loss, **losses}
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


def build(spec: ModelSpec, cfg: Config, shape: BenchmarkCase, device: torch.device, fast: bool,
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


def bench_case(name: str, case: BenchmarkCase, precision: str, args: argparse.Namespace,
               device: torch.device) -> dict:
    """Time one case at one precision; returns its JSON row (an ``error`` row if the GPU ran out of memory
    or the compiler failed)."""
    cfg, shape = case_config(name, case, args)
    spec = MODELS[name]
    fast = use_fast_path(args, device) and spec.optimize_for_training is not None
    row: dict[str, Any] = {"case": case_name(name, case, shape, args.tiny), "mode": PRECISION_MODES[precision],
                           "path": "fast" if fast else "eager", **shape_fields(name, case, args)}
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    release(device)
    model = None
    try:
        model, criterion, batch = build(spec, cfg, shape, device, fast, args)
        step = make_train_step(model, criterion, batch, cfg, spec, name, precision, device)
        last = {}

        def timed_step() -> None:
            last["loss"] = step()
        seconds = median_step_time(timed_step, args.warmup, args.steps, device,
                                   f"{row['case']} {row['mode']} ({row['path']})", args.progress)
        items = spec.count_items(batch)
        row.update(step_s=round(seconds, 4), items_per_s=round(items / seconds),
                   peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda"
                   else None,
                   items_per_step=items, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                   loss=round(float(last["loss"]["loss"]), 5), steps=args.steps, warmup=args.warmup,
                   **({"losses": {k: round(float(v), 5) for k, v in last["loss"].items() if k != "loss"}}
                      if len(last["loss"]) > 1 else {}))
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


def check_case(name: str, case: BenchmarkCase, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Rows ``check-fp32`` and ``check-amp-bf16`` of one case (see the module docstring)."""
    import torch._inductor.config as inductor_config

    cfg, shape = case_config(name, case, args)
    spec = MODELS[name]
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
        rows.append({"case": case_name(name, case, shape, args.tiny), "mode": f"check-{PRECISION_MODES[precision]}",
                     "path": "fast", **shape_fields(name, case, args), "loss_eager_fp32": ref_loss, "loss": loss,
                     "loss_rel_diff": rel, "limit": limit, "ok": bool(rel < limit), "grad_rel_diff": grad_rel})
    return rows


def loader_rows(args: argparse.Namespace, device: torch.device, models: list[str],
                emit: Callable[[dict], None]) -> list[dict]:
    """Loader throughput rows for ``models`` (see the module docstring), each passed to ``emit`` as it is
    measured: first the train step on a real batch (``train_<model>``), then every ``--workers`` count.

    A dataset with a ``cache_dir`` attribute (a mel cache) that holds ``.pt`` files is timed twice: with the
    cache switched off (``cache_dir = None``: audio decoded, mels computed) and with it.

    Raises:
        BenchmarkError: a dataset too small for one batch of the configured batch size.
    """
    rows = []
    for name in models:
        spec = MODELS[name]

        def config(workers: int) -> Config:
            return load_run_config(argparse.Namespace(
                config=args.config, tiny=args.tiny, set=[*args.set, f"data.num_workers={workers}"],
                dataset_path=args.dataset_path, max_steps=None))
        train_set, _ = spec.build_datasets(config(0))
        rows.append(step_on_real_batch(spec, config(0), train_set, name, args, device))
        emit(rows[-1])
        cache = getattr(train_set, "cache_dir", None)
        variants = [("wav", None)]
        if cache is not None and Path(cache).is_dir() and any(Path(cache).glob("*.pt")):
            variants.append(("cached_mels", cache))
        for label, cache_dir in variants:
            if cache is not None:
                train_set.cache_dir = cache_dir
            for workers in args.workers:
                rows.append(time_loader(spec, config(workers), train_set, name, f"loader_{name}_{label}",
                                        args.steps, device, args.progress))
                rows[-1]["tiny"] = bool(args.tiny)
                emit(rows[-1])
    return rows


def padding_rows(args: argparse.Namespace, models: list[str], emit: Callable[[dict], None]) -> list[dict]:
    """``padding_<model>`` rows (see the module docstring) for every model of ``models`` with
    ``ModelSpec.variable_length``, each passed to ``emit``; the others are skipped with a line saying so.

    Raises:
        BenchmarkError: no model of ``models`` has items of different lengths, or the corpus holds fewer
            training utterances than one batch.
    """
    rows = []
    for name in models:
        if not MODELS[name].variable_length:
            skip_note(name, "its items all have one length (ModelSpec.variable_length is not set): no padding")
            continue
        cfg = load_run_config(argparse.Namespace(config=args.config, tiny=args.explicit_tiny, set=args.set,
                                                 dataset_path=args.dataset_path, max_steps=None))
        train_set, _ = MODELS[name].build_datasets(cfg)
        lengths = train_set.lengths()
        batch_size = cfg.section(name).batch_size
        if len(lengths) < batch_size:
            raise BenchmarkError(f"{len(lengths)} training utterances are too few for one batch of {batch_size}; "
                                 f"use --set {name}.batch_size=N")
        for batching, batches in (
                ("random", random_batches(len(lengths), batch_size, cfg.train.seed)),
                ("buckets", LengthBucketSampler(lengths, batch_size, seed=cfg.train.seed,
                                                pool=cfg.data.bucket_pool).epoch_batches())):
            rows.append({"case": f"padding_{name}", "mode": "padding", "batching": batching, "batch_size": batch_size,
                         "utterances": len(lengths), "batches": len(batches),
                         "padding_fraction": round(padding_fraction(batches, lengths), 4)})
            emit(rows[-1])
    if not rows:
        raise BenchmarkError(f"--padding: none of {', '.join(models)} has items of different lengths")
    return rows


def training_loader(spec: ModelSpec, cfg: Config, train_set, name: str, device: torch.device):
    """``train.py``'s training DataLoader over ``train_set`` for one process.

    Raises:
        BenchmarkError: the dataset is too small for one batch.
    """
    batch_size = cfg.section(name).batch_size
    loader = make_loader(train_set, spec, cfg, batch_size, 0, 1, True, device)
    if len(loader) == 0:
        raise BenchmarkError(f"{len(train_set)} training utterances are too few for one batch of {batch_size}; "
                             f"use --tiny or --set {name}.batch_size=N")
    return loader


def step_on_real_batch(spec: ModelSpec, cfg: Config, train_set, name: str, args: argparse.Namespace,
                       device: torch.device) -> dict:
    """Items/s of ``train.py``'s step (forward, loss, backward, optimizer; eager, ``train.precision``) on the
    first real batch of ``train_set``: what the loader has to keep up with on this device.

    Raises:
        BenchmarkError: the dataset is too small for one batch.
    """
    batch_size = cfg.section(name).batch_size
    loader = training_loader(spec, cfg, train_set, name, device)
    batch = next(iter(loader))
    items = spec.count_items(batch)
    torch.manual_seed(0)
    model = spec.build_model(cfg).to(device)
    step = make_train_step(model, spec.build_criterion(cfg), to_device(batch, device), cfg, spec, name,
                           cfg.train.precision, device)
    seconds = median_step_time(step, args.warmup, min(args.steps, 5 if device.type == "cpu" else 20), device,
                               f"train_{name} ({cfg.train.precision}, batch {batch_size})", args.progress)
    release(device)
    return {"case": f"train_{name}", "mode": "train", "precision": cfg.train.precision, "batch_size": batch_size,
            "step_s": round(seconds, 4), "items_per_s": round(items / seconds), "tiny": bool(args.tiny)}


def print_loader_table(rows: list[dict]) -> None:
    """Loader items/s per worker count beside the train step's, and how many workers keep up."""
    step = {r["case"][len("train_"):]: r["items_per_s"] for r in rows if r["mode"] == "train"}
    loaders: dict[str, dict[int, int]] = {}
    for r in rows:
        if r["mode"] == "loader":
            loaders.setdefault(r["case"], {})[r["workers"]] = r["items_per_s"]
    counts = sorted({w for by_workers in loaders.values() for w in by_workers})
    print("\n| loader | " + " | ".join(f"{w} workers" for w in counts) + " | train step | workers needed |")
    print("|---" * (len(counts) + 3) + "|")
    for case, by_workers in loaders.items():
        model = next(name for name in step if case.startswith(f"loader_{name}_"))
        enough = [w for w in counts if by_workers.get(w, 0) >= step[model]]
        needed = str(enough[0]) if enough else f"more than {counts[-1]}"
        print(f"| {case} | " + " | ".join(f"{by_workers.get(w, 0):,}" for w in counts)
              + f" | {step[model]:,} | {needed} |")


def time_loader(spec: ModelSpec, cfg: Config, train_set, name: str, label: str, batches: int,
                device: torch.device, progress: bool = True) -> dict:
    """Items/s of ``train.py``'s training DataLoader over ``train_set``, ``batches`` batches after the first one.

    The batches come from ``train.batch_stream`` (epochs restart as in training) and are moved to
    ``device`` as ``train.py`` moves them (non-blocking from pinned memory). With ``progress``, a tqdm bar
    on stderr counts the ``batches + 1`` batches.

    Raises:
        BenchmarkError: the dataset is too small for one batch.
    """
    batch_size = cfg.section(name).batch_size
    loader = training_loader(spec, cfg, train_set, name, device)
    stream = batch_stream(loader, TrainState())
    with progress_bar(batches + 1, f"{label} ({cfg.data.num_workers} workers)", "batch", progress) as bar:
        begin = time.perf_counter()
        to_device(next(stream), device)
        first = time.perf_counter() - begin
        bar.update()
        items = 0
        begin = time.perf_counter()
        for _ in range(batches):
            batch = next(stream)
            items += spec.count_items(batch)
            to_device(batch, device)
            bar.update()
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
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true",
                      help="config.json's tiny block and small batches (CPU smoke; the default on a CPU)")
    size.add_argument("--full-size", action="store_true",
                      help="full-size models and batches on a CPU too (minutes a step; the default on CUDA)")
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
    parser.add_argument("--padding", action="store_true",
                        help="the padded share of batches over one epoch, random vs length-bucketed (no model runs)")
    parser.add_argument("--dataset-path", help="corpus for --loader and --padding (overrides data.dataset_path)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8],
                        help="--loader: DataLoader worker counts to time (default 1 2 4 8)")
    parser.add_argument("--config", default=str(PROJECT_ROOT / "config.json"),
                        help="config for --tiny, --loader and models without a reference case")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars on stderr")
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
    args.explicit_tiny = args.tiny
    cpu = args.device == "cpu"
    args.size_note = ""
    if cpu and not args.tiny and not args.full_size:
        args.tiny, args.size_note = True, CPU_TINY_NOTE
    elif cpu and args.full_size:
        args.size_note = CPU_FULL_SIZE_NOTE
    if args.steps is None:
        args.steps = 50 if args.loader else (3 if cpu else 20)
    if args.warmup is None:
        args.warmup = 1 if cpu else 5
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    for mode in ("loader", "padding"):
        if getattr(args, mode) and not args.dataset_path:
            parser.error(f"--{mode} needs --dataset-path")
    if args.loader and args.padding:
        parser.error("--loader and --padding are separate runs: give one")
    if any(w < 0 for w in args.workers):
        parser.error("--workers counts must be >= 0")
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
    if args.size_note and not args.padding:
        print(args.size_note, flush=True)
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
        if args.padding:
            padding_rows(args, args.models, emit)
            return 0
        if args.loader:
            print_loader_table(loader_rows(args, device, args.models, emit))
            return 0
        cases = cases_for(args.models)
        if args.cases != "all":
            wanted = args.cases.split(",")
            cases = [(name, case) for name, case in cases
                     if case.name in wanted or case_name(name, case, case_config(name, case, args)[1], args.tiny)
                     in wanted]
            if not cases:
                raise BenchmarkError(f"--cases {args.cases}: none of them belongs to {', '.join(args.models)}")
        if args.check:
            for name, case in cases:
                if MODELS[name].optimize_for_training is None:
                    skip_note(name, "its ModelSpec has no optimize_for_training (fast path) to check")
                    continue
                for row in check_case(name, case, args, device):
                    emit(row)
            failed = [r for r in rows if not r["ok"]]
            print(f"check: {len(rows) - len(failed)} of {len(rows)} rows within their limits", flush=True)
            return 1 if failed else 0
        for name, case in cases:
            if use_fast_path(args, device) and MODELS[name].optimize_for_training is None:
                skip_note(f"{name}'s fast path", "its ModelSpec has no optimize_for_training; timing the eager path")
            for precision in args.precisions:
                emit(bench_case(name, case, precision, args, device))
        print_table(rows)
    except (ConfigError, DataError, BenchmarkError, TrainingError) as err:
        print(f"ERROR: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
