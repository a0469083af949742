"""The train-step and ``--check`` parts of ``python -m scripts.benchmark`` (its docstring says what they measure), and
the timing both it and :mod:`scripts.benchmark_data` use: the cases, the step ``train.py`` runs, the median of timed
steps, the progress bars."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from typing import Any, Callable

import torch
import torch._inductor.config as inductor_config
from tqdm import tqdm

from model import BenchmarkCase, ModelSpec
from models import MODELS, config_schemas
from utils.config import Config, build_config, load_config
from utils.data.loader import on_device_hook, to_device
from utils.training.optim import build_optimizers, setup_precision
from utils.training.setup import build_phases
from utils.training.step import forward_backward, one_loss_step

PRECISION_MODES = {"fp32": "fp32", "tf32": "tf32", "bf16": "amp-bf16", "fp16": "amp-fp16"}
"""Our ``train.precision`` names -> the reference harness's ``mode`` names."""

CHECK_LIMITS = {"fp32": 1e-5, "bf16": 2e-2}
"""Largest relative loss difference, fast path vs eager float32, per precision (no unit: a ratio)."""


class BenchmarkError(RuntimeError):
    """A benchmark cannot run as asked (no case for a model, an empty loader, ...)."""


def skip_note(name: str, what: str) -> None:
    """Say on stdout that model ``name`` lacks ``what`` and is skipped (the benchmark never skips silently)."""
    print(f"skipping {name}: {what}", flush=True)


def cases_for(models: list[str]) -> list[tuple[str, BenchmarkCase]]:
    """``(model, case)`` pairs of ``models``: each model's ``Benchmark.cases``, or one case sized from
    ``config.json`` (``<name>_b<batch_size>``) for a model that has random batches but no cases of its own.
    A model without a ``Benchmark`` group (its ``synthetic_batch``) cannot be timed on random batches: it is skipped
    with a line saying so.
    """
    found = []
    for name in models:
        spec = MODELS[name]
        if spec.benchmark is None:
            skip_note(name, "its ModelSpec has no synthetic_batch, which the train-step benchmark needs "
                            "(--loader still times its DataLoader)")
            continue
        found += [(name, case) for case in spec.benchmark.cases or (BenchmarkCase(f"{name}_default", (), 0),)]
    return found


def case_config(name: str, case: BenchmarkCase, args: argparse.Namespace) -> tuple[Config, BenchmarkCase]:
    """The config and shape a case runs with (see :mod:`scripts.benchmark`), user ``--set`` applied last."""
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


def _timed_calls(step: Callable[[], Any], steps: int, device: torch.device, bar: tqdm) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step``: between two CUDA events on CUDA, ``time.perf_counter`` on the
    CPU; ``bar`` advances after each."""
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
    return times


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
        times = _timed_calls(step, steps, device, bar)
    times.sort()
    return times[len(times) // 2]


def make_train_step(model: torch.nn.Module, criterion: Callable, batch: dict, cfg: Config, spec: ModelSpec,
                    precision: str, device: torch.device) -> Callable[[], dict[str, torch.Tensor]]:
    """The optimizer step of ``train.py`` (one micro-batch, one process) as a closure returning ``{"loss": the
    detached loss of its last phase}``, with ``loss_<phase>`` and the named metrics of each phase for a model
    with several optimizers (as ``train.py`` logs them).

    The model's optimizers as ``train.py`` builds them (:func:`utils.training.optim.build_optimizers`: Adam by
    default, fused on CUDA; one per ``Phases.names`` name for a model with several) and its phases
    (:func:`utils.training.setup.build_phases`). Each step moves the same batch through the model's ``on_device``
    hook, then for each phase in order runs :func:`utils.training.step.forward_backward` (forward and loss under
    autocast from ``setup_precision``, backward through the GradScaler, unscale, clipping to ``train.grad_clip``)
    and that phase's optimizer step; the scaler updates once per step and the gradients are cleared. The per-step
    all-reduce, spike checks and LR schedule of ``train.py`` are left out.

    Raises:
        TrainingError: the model's ``build_optimizer`` or ``networks`` do not match its phases.
    """
    autocast, scaler = setup_precision(precision, device)
    optimizers = build_optimizers(spec, model, cfg.section(spec.name), device)
    no_schedule = {phase: (None, "step") for phase in optimizers}  # the benchmark keeps the learning rate fixed
    phases = build_phases(spec, model, optimizers, no_schedule, cfg)
    step_fn = spec.training.phases.train_step if spec.training.phases is not None else one_loss_step(criterion)
    prepare = on_device_hook(spec, cfg)

    def step() -> dict[str, torch.Tensor]:
        micro, losses = [to_device(batch, device, prepare)], {}
        for phase in phases:
            result = forward_backward(phase, phases, step_fn, micro, scaler, autocast, cfg.train.grad_clip)
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


def synthetic_batch(spec: ModelSpec, cfg: Config, shape: BenchmarkCase) -> dict:
    """The case's random batch on the CPU: ``Benchmark.synthetic_batch`` at ``shape`` (seed 0)."""
    return spec.benchmark.synthetic_batch(cfg, shape.batch_size, torch.Generator().manual_seed(0),
                                          **shape.batch_kwargs)


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
    criterion = spec.training.build_criterion(cfg)
    return model, criterion, to_device(synthetic_batch(spec, cfg, shape), device)


def optimize(spec: ModelSpec, model: torch.nn.Module, cfg: Config, args: argparse.Namespace) -> torch.nn.Module:
    """``Training.optimize_for_training(model, cfg, **compile_kwargs)``, or a clear error when there is none."""
    if spec.training.optimize_for_training is None:
        raise BenchmarkError("this model has no fast path (ModelSpec.optimize_for_training); use --eager")
    return spec.training.optimize_for_training(model, cfg, **compile_kwargs(args))


def release(device: torch.device) -> None:
    """Free cached blocks and restart the peak-memory count (between cases)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def timed_fields(model: torch.nn.Module, items: int, seconds: float, last: dict, args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    """What a timed row says beyond its name: seconds and items per step, peak memory, size, the last step's loss
    (and each phase's losses for a model with several optimizers)."""
    losses = last["loss"]
    return dict(step_s=round(seconds, 4), items_per_s=round(items / seconds),
                peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
                items_per_step=items, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
                loss=round(float(losses["loss"]), 5), steps=args.steps, warmup=args.warmup,
                **({"losses": {k: round(float(v), 5) for k, v in losses.items() if k != "loss"}}
                   if len(losses) > 1 else {}))


def bench_case(name: str, case: BenchmarkCase, precision: str, args: argparse.Namespace,
               device: torch.device) -> dict:
    """Time one case at one precision; returns its JSON row (an ``error`` row if the GPU ran out of memory
    or the compiler failed)."""
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

        def timed_step() -> None:
            last["loss"] = step()
        seconds = median_step_time(timed_step, args.warmup, args.steps, device,
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
