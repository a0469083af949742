"""The train-step and ``--check`` parts of ``python -m scripts.benchmark`` (its docstring says what they measure), and
the cases, train step, timing and progress bars that :mod:`scripts.benchmark_data_rows` uses too."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time
from typing import Any, Callable, Optional

import torch
import torch._inductor.config as inductor_config
from tqdm import tqdm

from model import ModelSpec
from models import MODELS
from parts import LEFT_OUT, PARTS, config_schemas
from utils.benchmark import BenchmarkCase
from utils.config import Config, build_config, load_config
from utils.data.loader import on_device_hook, to_device
from utils.run_log import bar_options
from utils.training.optim import build_optimizers, loss_and_grads, setup_precision
from utils.training.recipe import apply_recipe
from utils.training.setup import build_phases
from utils.training.step import forward_backward, one_loss_step

PRECISION_MODES = {"fp32": "fp32", "tf32": "tf32", "bf16": "amp-bf16", "fp16": "amp-fp16"}  # ours -> the reference's
CHECK_LIMITS = {"fp32": 1e-5, "bf16": 2e-2}  # largest relative loss difference, fast path vs eager float32


class BenchmarkError(RuntimeError):
    """A benchmark cannot run as asked (no case for a model, an empty loader, ...)."""


def skip_note(name: str, what: str) -> None:
    """Say on stdout that model ``name`` lacks ``what`` and is skipped (the benchmark never skips silently)."""
    print(f"skipping {name}: {what}", flush=True)


def cases_for(models: list[str]) -> list[tuple[str, BenchmarkCase]]:
    """``(model, case)`` pairs of ``models``: each model's ``Benchmark.cases`` (``parts.PARTS.benchmarks``), or one
    ``<name>_default`` case sized from ``config.json``; a model without a ``Benchmark`` is skipped with a line saying
    so."""
    found = []
    for name in models:
        if (bench := PARTS.benchmarks.get(name)) is None:
            skip_note(name, "parts.py registers no Benchmark of it (its synthetic_batch), which the train-step "
                            "benchmark needs (--loader still times its DataLoader)")
            continue
        found += [(name, case) for case in bench.cases or (BenchmarkCase(f"{name}_default", (), 0),)]
    return found


def case_config(name: str, case: BenchmarkCase, args: argparse.Namespace) -> tuple[Config, BenchmarkCase]:
    """The config and shape a case runs with (see :mod:`scripts.benchmark`), user ``--set`` applied last, its null
    settings the model's recipe's (:func:`utils.training.recipe.apply_recipe`)."""
    shape = (case.tiny or case) if args.tiny else case
    overrides = [*shape.overrides, *args.set]
    if args.tiny or case.name.endswith("_default"):  # the tiny block, or a model without shapes of its own
        cfg = load_config(args.config, config_schemas(), tiny=args.tiny, overrides=overrides, left_out=LEFT_OUT)
    else:  # NVIDIA's published models are the config dataclasses' defaults
        cfg = build_config({}, config_schemas(), overrides=overrides, source="dataclass defaults", left_out=LEFT_OUT)
    if shape.batch_size == 0:
        shape = dataclasses.replace(shape, batch_size=cfg.section(name).batch_size)
    return apply_recipe(MODELS[name], cfg, PARTS.data_framing(cfg.data)), shape


def case_name(name: str, case: BenchmarkCase, shape: BenchmarkCase, tiny: bool) -> str:
    """The row's case name: the case's own name at full size (a default case is ``<name>_b<batch_size>``). With
    ``tiny``, one from the tiny ``shape`` the rows time: ``tiny_<model>_b<batch size>`` plus ``_<first letter of
    key><value>`` for every integer ``batch_kwargs`` entry, in key order (``tiny_waveglow_b2_s2048``: batch 2 of
    2048-sample crops); or ``tiny_<name>`` when ``case.tiny`` has a name of its own."""
    if not tiny:
        return f"{name}_b{shape.batch_size}" if case.name.endswith("_default") else case.name
    if case.tiny is not None and case.tiny.name:
        return case.tiny.name if case.tiny.name.startswith("tiny_") else f"tiny_{case.tiny.name}"
    sizes = "".join(f"_{key[0]}{value}" for key, value in sorted(shape.batch_kwargs.items())
                    if isinstance(value, int) and not isinstance(value, bool))
    return f"tiny_{name}_b{shape.batch_size}{sizes}"


def shape_fields(name: str, case: BenchmarkCase, args: argparse.Namespace) -> dict[str, Any]:
    """``tiny`` for every row, and for a tiny row of a named case ``full_size_case``: the case it stands in for."""
    named = args.tiny and not case.name.endswith("_default")
    return {"tiny": bool(args.tiny), **({"full_size_case": case.name} if named else {})}


def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> tqdm:
    """A tqdm bar on stderr for ``total`` ``unit`` s, drawn at once and removed when closed on a terminal."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, **bar_options(leave=False))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_call(step: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``step``: between two CUDA events on CUDA (the device's own time, queued work
    included), ``time.perf_counter`` on the CPU."""
    if device.type != "cuda":
        begin = time.perf_counter()
        step()
        return time.perf_counter() - begin
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3


def median_step_time(step: Callable[[], Any], warmup: int, steps: int, device: torch.device, desc: str = "steps",
                     progress: bool = True) -> float:
    """Seconds per call of ``step``: ``warmup`` untimed calls, then the median of ``steps`` timed ones (as in the
    reference harness); with ``progress``, a tqdm bar ``desc`` on stderr, drawn between timed calls."""
    times = []
    with progress_bar(warmup + steps, desc, "step", progress) as bar:
        for _ in range(warmup):
            step()
            synchronize(device)
            bar.update()
        for _ in range(steps):
            times.append(timed_call(step, device))
            bar.update()
    return sorted(times)[len(times) // 2]


def make_train_step(model: torch.nn.Module, criterion: Callable, batch: dict, cfg: Config, spec: ModelSpec,
                    precision: str, device: torch.device) -> Callable[..., dict[str, torch.Tensor]]:
    """``train.py``'s optimizer step (one micro-batch, one process; no all-reduce, spike check or LR schedule) as a
    closure returning ``{"loss": the last phase's detached loss}``, plus ``loss_<phase>`` and each phase's metrics for
    a model of several optimizers: per phase :func:`utils.training.step.forward_backward` and its optimizer step. The
    closure steps on ``batch``, or on the batch it is given.

    Raises:
        TrainingError: the model's ``build_optimizer`` or ``networks`` do not match its phases.
    """
    amp = setup_precision(precision, device)
    optimizers = build_optimizers(spec, model, cfg, device)
    no_schedule = {phase: (None, "step") for phase in optimizers}  # the benchmark keeps the learning rate fixed
    phases = build_phases(spec, model, optimizers, no_schedule, cfg.train)
    step_fn = spec.training.phases.train_step if spec.training.phases is not None else one_loss_step(criterion)
    prepare = on_device_hook(spec, cfg)

    def step(other: Optional[dict] = None) -> dict[str, torch.Tensor]:
        micro, losses = [to_device(batch if other is None else other, device, prepare)], {}
        for phase in phases:
            result = forward_backward(phase, phases, step_fn, micro, amp, cfg.train.grad_clip)
            amp.scaler.step(phase.optimizer)
            if len(phases) > 1:
                losses.update({f"loss_{phase.name}": result.loss, **result.metrics})
        amp.scaler.update()
        for phase in phases:
            phase.optimizer.zero_grad(set_to_none=True)
        return {"loss": result.loss, **losses}
    return step


def use_fast_path(args: argparse.Namespace, device: torch.device) -> bool:
    """``--eager`` / ``--fast`` if given, else the fast path on CUDA only."""
    return not args.eager and (args.fast or device.type == "cuda")


def synthetic_batch(spec: ModelSpec, cfg: Config, shape: BenchmarkCase) -> dict:
    """The case's random batch on the CPU: ``Benchmark.synthetic_batch`` at ``shape`` (seed 0)."""
    return PARTS.benchmarks[spec.name].synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0),
                                                       **shape.batch_kwargs)


def build(spec: ModelSpec, cfg: Config, shape: BenchmarkCase, device: torch.device, fast: bool,
          args: argparse.Namespace) -> tuple[torch.nn.Module, Callable, dict]:
    """Model (seed 0, on ``device``, fast path applied if asked), criterion and synthetic batch (seed 0)."""
    torch.manual_seed(0)
    model = spec.build_model(cfg).to(device).train()
    if fast:
        model = optimize(spec, model, cfg, args)
    return model, spec.training.build_criterion(cfg), to_device(synthetic_batch(spec, cfg, shape), device)


def optimize(spec: ModelSpec, model: torch.nn.Module, cfg: Config, args: argparse.Namespace) -> torch.nn.Module:
    """``Training.optimize_for_training`` with ``--backend`` and ``--compile-mode``.

    Raises:
        BenchmarkError: the model has no fast path.
    """
    if spec.training.optimize_for_training is None:
        raise BenchmarkError("this model has no fast path (ModelSpec.optimize_for_training); use --eager")
    mode = {"mode": args.compile_mode} if args.compile_mode else {}
    return spec.training.optimize_for_training(model, cfg, backend=args.backend, **mode)


def release(device: torch.device) -> None:
    """Free cached blocks and restart the peak-memory count (between cases)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def timed_fields(model: torch.nn.Module, items: int, seconds: float, last: dict, args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    """A timed row's numbers: seconds and items per step, peak memory, size, the last step's loss(es)."""
    losses = last["loss"]
    return dict(step_s=round(seconds, 4), items_per_s=round(items / seconds),
                peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
                items_per_step=items, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                loss=round(float(losses["loss"]), 5), steps=args.steps, warmup=args.warmup,
                **({"losses": {k: round(float(v), 5) for k, v in losses.items() if k != "loss"}}
                   if len(losses) > 1 else {}))


def bench_case(name: str, case: BenchmarkCase, precision: str, args: argparse.Namespace,
               device: torch.device) -> dict:
    """Time one case at one precision; returns its JSON row (an ``error`` row if the GPU ran out of memory or the
    compiler failed)."""
    cfg, shape = case_config(name, case, args)
    spec = MODELS[name]
    fast = use_fast_path(args, device) and spec.training.optimize_for_training is not None
    row: dict[str, Any] = {"case": case_name(name, case, shape, args.tiny), "mode": PRECISION_MODES[precision],
                           "path": "fast" if fast else "eager", **shape_fields(name, case, args)}
    torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    release(device)
    model = None
    try:
        model, criterion, batch = build(spec, cfg, shape, device, fast, args)
        step = make_train_step(model, criterion, batch, cfg, spec, precision, device)
        last = {}
        seconds = median_step_time(lambda: last.update(loss=step()), args.warmup, args.steps, device,
                                   f"{row['case']} {row['mode']} ({row['path']})", args.progress)
        row.update(timed_fields(model, spec.training.count_items(batch), seconds, last, args, device))
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


def check_case(name: str, case: BenchmarkCase, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Rows ``check-fp32`` and ``check-amp-bf16`` of one case (see :mod:`scripts.benchmark`)."""
    cfg, shape = case_config(name, case, args)
    spec = MODELS[name]
    inductor_config.fallback_random = True  # dropout: eager's random numbers inside compiled code too
    torch.manual_seed(0)
    eager = spec.build_model(cfg).to(device).train()
    perturb(eager)
    fast = optimize(spec, copy.deepcopy(eager), cfg, args)
    criterion = spec.training.build_criterion(cfg)
    batch = to_device(synthetic_batch(spec, cfg, shape), device)
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
