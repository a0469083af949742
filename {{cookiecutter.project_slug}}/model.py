"""The models this project trains: the contract ``train.py`` relies on, the registry, and where yours goes.

Your own model, in three steps (``docs/own_model_example.py`` is a complete file to start from):

1. Write ``models/<name>.py``: a config dataclass (its ``config.json`` section), an ``nn.Module`` whose ``forward``
   takes a batch dict, a loss ``criterion(outputs, batch) -> scalar``, and ``build_datasets(cfg) -> (train, val)``.
2. End the file with ``register("<name>", ModelSpec(...))``.
3. Train it: ``python multiproc.py train.py --model <name> ...``.

Every module of ``models/`` is imported here: adding a file adds a model. The rest of the project reaches a model
only through its :class:`ModelSpec`. A batch is a dict of tensors plus an ``"ids"`` list of utterance ids."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Optional

import torch
from torch import nn

import models
from utils.config import SHARED_SECTIONS, Config

Batch = dict[str, Any]


def adam(model: nn.Module, model_cfg: Any, device: torch.device) -> torch.optim.Optimizer:
    """The default optimizer: Adam with the section's ``learning_rate`` and ``weight_decay``, fused on CUDA."""
    return torch.optim.Adam(model.parameters(), lr=model_cfg.learning_rate, weight_decay=model_cfg.weight_decay,
                            fused=device.type == "cuda")


@dataclasses.dataclass(frozen=True)
class BenchmarkCase:
    """A train-step shape for ``scripts/benchmark.py``: ``section.key=value`` overrides of the dataclass
    defaults, the batch size and the keywords of ``ModelSpec.synthetic_batch``; ``tiny`` shrinks it for a CPU."""

    name: str
    overrides: tuple[str, ...]
    batch_size: int
    batch_kwargs: dict = dataclasses.field(default_factory=dict)
    tiny: Optional["BenchmarkCase"] = None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything the loop, inference, the benchmark and the tests need from one model.

    Required:
        config_cls: the dataclass of its ``config.json`` section (``batch_size`` per process, ``learning_rate``).
        build_model: ``cfg -> nn.Module``; ``forward(batch)`` returns what the criterion reads.
        build_criterion: ``cfg -> criterion(outputs, batch) -> scalar loss``.
        build_datasets: ``cfg -> (train_dataset, val_dataset)``.
        collate_fn: list of items -> batch dict (``None``: PyTorch's default collation).
        count_items: batch -> items it holds (audio samples, mel frames) for items/s.

    Optional (``None`` means "not provided": the benchmark and the tests skip it and say so):
        build_optimizer: ``(model, model_cfg, device) -> Optimizer``; default :func:`adam`.
        add_inference_args: ``parser -> None``, the model's own ``inference.py`` options.
        infer: ``(model, cfg, args, device) -> list of written paths``: ``inference.py``'s work.
        vocode: ``(model, mel (n_mels, frames), cfg) -> audio (samples,)``: the model can be another's vocoder.
        log_validation: rank 0's ``(model, batch, outputs, step, writer, output_dir, cfg=cfg)``: pictures, audio.
        synthetic_batch: ``(cfg, batch_size, generator, **shape) -> batch`` of random CPU tensors.
        optimize_for_training: ``(model, cfg, **compile_kwargs) -> model``: the fast path (``train.compile``).
        benchmark_cases: :class:`BenchmarkCase` shapes (NVIDIA's published ones for the examples).
        check_text: ``(text, cfg) -> reason or None``: the start-up corpus check's test of a transcript.
        on_device: ``(batch, cfg) -> batch`` on the device, in the step (e.g. mels of the audio crops).
        data_advice: what to do when the GPU waits on this model's input pipeline (one sentence).
        read_published: ``(loaded, cfg) -> utils.published.Weights | None``: a published checkpoint of this model
            (``--init-from``); pickled_classes: what such a file pickles, read as records.
        variable_length: items differ in length, its training dataset has ``lengths()``: ``data.batching=buckets``.
        inference_modules: the sub-modules inference uses (HiFi-GAN: ``("generator",)``; empty: all): what a release
            checkpoint keeps (``scripts/export.py``) and ``train.ema_decay`` averages.
        export_parts: ``(model, cfg) -> [utils.onnx_export.ExportPart]``: the inference path as modules with inputs at
            two sizes, one ONNX file each, checked with ONNX Runtime (``scripts/export.py --format onnx``).

    Several optimizers (a GAN vocoder: discriminator step, then generator step), all three together:
        phases: optimizer names in update order, e.g. ``("discriminator", "generator")``; ``build_optimizer``
            then returns ``{name: Optimizer}``, one per phase.
        networks: ``model -> {phase: sub-module}``, the network each phase's optimizer trains (each DDP-wrapped).
        train_step: ``(phase, nets, batch) -> (loss, {name: scalar})``: the phase's loss and named scalars to log;
            ``nets[phase]`` is DDP-wrapped, the other networks are plain with frozen parameters (no all-reduce).
        build_scheduler: ``(phase, optimizer, cfg) -> (LRScheduler, "step" | "epoch")``; default: the
            ``train.lr_schedule`` multiplier, stepped every optimizer step.

    A model bigger than one GPU:
        blocks: ``model -> [sub-module, ...]``, its repeated units in forward order (WaveGlow's coupling networks):
            what ``train.parallelism=fsdp`` shards one by one and ``train.activation_checkpointing`` recomputes;
            ``None``: sharded as one unit, nothing to checkpoint.
    """

    config_cls: type
    build_model: Callable[[Config], nn.Module]
    build_criterion: Callable[[Config], Callable[[Any, Batch], torch.Tensor]]
    build_datasets: Callable[[Config], tuple]
    collate_fn: Optional[Callable[[list], Batch]]
    count_items: Callable[[Batch], int]
    build_optimizer: Callable[[nn.Module, Any, torch.device], torch.optim.Optimizer] = adam
    add_inference_args: Optional[Callable[[Any], None]] = None
    infer: Optional[Callable[..., list]] = None
    vocode: Optional[Callable[..., torch.Tensor]] = None
    log_validation: Optional[Callable[..., None]] = None
    synthetic_batch: Optional[Callable[..., Batch]] = None
    optimize_for_training: Optional[Callable[..., nn.Module]] = None
    benchmark_cases: tuple[BenchmarkCase, ...] = ()
    check_text: Optional[Callable[[str, Config], Optional[str]]] = None
    on_device: Optional[Callable[[Batch, Config], Batch]] = None
    data_advice: str = "raise data.num_workers"
    phases: tuple[str, ...] = ()
    networks: Optional[Callable[[nn.Module], dict[str, nn.Module]]] = None
    train_step: Optional[Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = None
    build_scheduler: Optional[Callable[..., tuple[Any, str]]] = None
    blocks: Optional[Callable[[nn.Module], list[nn.Module]]] = None
    read_published: Optional[Callable[[Any, Config], Any]] = None
    pickled_classes: tuple[str, ...] = ()
    variable_length: bool = False
    inference_modules: tuple[str, ...] = ()
    export_parts: Optional[Callable[..., list]] = None


MODELS: dict[str, ModelSpec] = {}
"""Registered models by name (the ``--model`` choices), in the order their modules were imported."""


def register(name: str, spec: ModelSpec) -> ModelSpec:
    """Add ``spec`` to :data:`MODELS` as ``name`` (also the name of its ``config.json`` section).

    Raises:
        ValueError: ``name`` is not an identifier, is a shared section (audio, data, train) or "tiny", or is
            taken by another model.
    """
    if not name.isidentifier() or name in SHARED_SECTIONS or name == "tiny":
        raise ValueError(f"model name {name!r} must be an identifier other than {', '.join(SHARED_SECTIONS)}, tiny")
    if name in MODELS and MODELS[name] is not spec:
        raise ValueError(f"model name {name!r} is registered twice")
    MODELS[name] = spec
    return spec


def config_schemas() -> dict[str, type]:
    """Section name -> dataclass: the shared sections, then one per registered model."""
    return {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}


for _module in sorted(pkgutil.iter_modules(models.__path__), key=lambda info: info.name):
    if not _module.name.startswith("_"):
        importlib.import_module(f"models.{_module.name}")
