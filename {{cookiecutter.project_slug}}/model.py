"""The model contract: what ``train.py``, ``inference.py`` and the scripts need from a model, grouped by who reads it.

Your own model, in three steps (``docs/own_model_example.py`` is a complete file to start from):

1. Write ``models/<name>.py`` (or a folder ``models/<name>/``): a config section (a :class:`utils.config.Section`),
   an ``nn.Module`` whose ``forward`` takes a batch dict, a loss ``criterion(outputs, batch) -> scalar``, and
   ``build_datasets(cfg) -> (train, val)``; end it with ``SPEC = ModelSpec(name="<name>", ...)``.
2. List it in ``models/__init__.py``: ``from models import <name>`` and ``<name>.SPEC`` in the registry.
3. Train it: ``python multiproc.py train.py --model <name> ...``.

A :class:`ModelSpec` holds the model's name, its config section, ``build_model`` and :class:`Training` (all that
training needs); the other groups are optional, each read by one consumer: :class:`Inference` (``inference.py``),
:class:`Export` (``scripts/export.py --format onnx``), :class:`Published` (published weights: ``--init-from``,
``scripts/import_weights.py``), :class:`Benchmark` (``scripts/benchmark.py``, ``scripts/memory.py``). A group left out
is said where it would be used. A batch is a dict of tensors plus an ``"ids"`` list of utterance ids. Shapes of
three kinds fit without touching ``train.py`` (torchtitan's ``ModelSpec`` is the model): one network and one loss;
several networks and optimizers (:class:`Phases`: a GAN); a model bigger than one GPU (``Training.blocks``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
from torch import nn

from utils.config import SHARED_SECTIONS, Config

Batch = dict[str, Any]


def adam(model: nn.Module, model_cfg: Any, device: torch.device) -> torch.optim.Optimizer:
    """The default optimizer: Adam with the section's ``learning_rate`` and ``weight_decay``, fused on CUDA."""
    return torch.optim.Adam(model.parameters(), lr=model_cfg.learning_rate, weight_decay=model_cfg.weight_decay,
                            fused=device.type == "cuda")


@dataclasses.dataclass(frozen=True)
class Phases:
    """Several optimizers (a GAN vocoder: discriminator step, then generator step).

    names: optimizer names in update order, e.g. ``("discriminator", "generator")``; ``Training.build_optimizer``
        then returns ``{name: Optimizer}``, one per phase.
    networks: ``model -> {phase: sub-module}``, the network each phase's optimizer trains (each DDP-wrapped).
    train_step: ``(phase, nets, batch) -> (loss, {name: scalar})``: the phase's loss and named scalars to log;
        ``nets[phase]`` is DDP-wrapped, the other networks are plain with frozen parameters (no all-reduce).
    build_scheduler: ``(phase, optimizer, cfg) -> (LRScheduler, "step" | "epoch")``; default: the
        ``train.lr_schedule`` multiplier, stepped every optimizer step.
    """

    names: tuple[str, ...]
    networks: Callable[[nn.Module], dict[str, nn.Module]]
    train_step: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    build_scheduler: Optional[Callable[..., tuple[Any, str]]] = None


@dataclasses.dataclass(frozen=True)
class Training:
    """What ``train.py`` needs. Required: the first four.

    build_criterion: ``cfg -> criterion(outputs, batch) -> scalar loss`` (also the validation loss).
    build_datasets: ``cfg -> (train_dataset, val_dataset)``.
    collate_fn: list of items -> batch dict (``None``: PyTorch's default collation).
    count_items: batch -> items it holds (audio samples, mel frames), for items/s.
    build_optimizer: ``(model, model_cfg, device) -> Optimizer`` (or ``{phase: Optimizer}``); default :func:`adam`.
    on_device: ``(batch, cfg) -> batch`` on the device, in the step (e.g. mels of the audio crops).
    check_text: ``(text, cfg) -> reason or None``: the start-up corpus check's test of a transcript.
    data_advice: what to do when the GPU waits on this model's input pipeline (one sentence).
    variable_length: items differ in length, its training dataset has ``lengths()``: ``data.batching=buckets``.
    log_validation: rank 0's ``(model, batch, outputs, step, writer, output_dir, cfg=cfg)``: pictures, audio.
    optimize_for_training: ``(model, cfg, **compile_kwargs) -> model``: the fast path (``train.compile``).
    blocks: ``model -> [sub-module, ...]``, its repeated units in forward order (WaveGlow's coupling networks):
        what ``train.parallelism=fsdp`` shards one by one and ``train.activation_checkpointing`` recomputes;
        ``None``: sharded as one unit, nothing to checkpoint.
    phases: several optimizers (:class:`Phases`); ``None``: one network, one loss, one optimizer.
    """

    build_criterion: Callable[[Config], Callable[[Any, Batch], torch.Tensor]]
    build_datasets: Callable[[Config], tuple]
    collate_fn: Optional[Callable[[list], Batch]]
    count_items: Callable[[Batch], int]
    build_optimizer: Callable[..., Any] = adam
    on_device: Optional[Callable[[Batch, Config], Batch]] = None
    check_text: Optional[Callable[[str, Config], Optional[str]]] = None
    data_advice: str = "raise data.num_workers"
    variable_length: bool = False
    log_validation: Optional[Callable[..., None]] = None
    optimize_for_training: Optional[Callable[..., nn.Module]] = None
    blocks: Optional[Callable[[nn.Module], list[nn.Module]]] = None
    phases: Optional[Phases] = None


@dataclasses.dataclass(frozen=True)
class Inference:
    """What ``inference.py`` needs.

    infer: ``(model, cfg, args, device) -> list of written paths``: ``inference.py``'s work.
    add_args: ``parser -> None``, the model's own ``inference.py`` options.
    vocode: ``(model, mel (n_mels, frames), cfg) -> audio (samples,)``: the model can be another's vocoder.
    takes_vocoder: the model makes mels (Tacotron2): ``inference.py`` offers ``--vocoder CHECKPOINT`` (a model with
        ``vocode``) and hands ``infer`` ``args.load_vocoder()``, which loads it and returns its ``mel -> audio``
        (``None`` without ``--vocoder``).
    modules: the sub-modules inference uses (HiFi-GAN: ``("generator",)``; empty: all): what a release checkpoint
        keeps (``scripts/export.py``) and ``train.ema_decay`` averages.
    """

    infer: Callable[..., list]
    add_args: Optional[Callable[[Any], None]] = None
    vocode: Optional[Callable[..., torch.Tensor]] = None
    takes_vocoder: bool = False
    modules: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Export:
    """What ``scripts/export.py --format onnx`` needs: ``parts: (model, cfg) -> [utils.onnx_export.ExportPart]``, the
    inference path as modules with inputs at two sizes, one ONNX file each, checked with ONNX Runtime."""

    parts: Callable[..., list]


@dataclasses.dataclass(frozen=True)
class Published:
    """Weights another project published (``train.py --init-from``, ``scripts/import_weights.py``).

    read: ``(loaded, cfg) -> utils.checkpoint.published.Weights | None``: this model's weights in such a file.
    pickled_classes: ``module.Class`` names such a file pickles, read as inert records (never run).
    """

    read: Callable[[Any, Config], Any]
    pickled_classes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class BenchmarkCase:
    """A train-step shape for ``scripts/benchmark.py``: ``section.key=value`` overrides of the section's defaults,
    the batch size and the keywords of ``Benchmark.synthetic_batch``; ``tiny`` shrinks it for a CPU."""

    name: str
    overrides: tuple[str, ...]
    batch_size: int
    batch_kwargs: dict = dataclasses.field(default_factory=dict)
    tiny: Optional["BenchmarkCase"] = None


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """What ``scripts/benchmark.py`` and ``scripts/memory.py`` need: ``synthetic_batch: (cfg, batch_size, generator,
    **shape) -> batch`` of random CPU tensors, and the ``cases`` to time (NVIDIA's published shapes for the
    examples)."""

    synthetic_batch: Callable[..., Batch]
    cases: tuple[BenchmarkCase, ...] = ()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model: its name (``--model NAME``, also its ``config.json`` section), the section's class, how to build the
    network (``cfg -> nn.Module``, ``forward(batch)`` returns what the criterion reads), and the groups above."""

    name: str
    config_cls: type
    build_model: Callable[[Config], nn.Module]
    training: Training
    inference: Optional[Inference] = None
    export: Optional[Export] = None
    published: Optional[Published] = None
    benchmark: Optional[Benchmark] = None

    @property
    def phase_names(self) -> tuple[str, ...]:
        """The optimizers' names: ``Phases.names``, or ``()`` for one optimizer."""
        return self.training.phases.names if self.training.phases is not None else ()

    @property
    def inference_modules(self) -> tuple[str, ...]:
        """``Inference.modules`` (``()``, the whole model, without an inference group)."""
        return self.inference.modules if self.inference is not None else ()


def registry(*specs: ModelSpec) -> dict[str, ModelSpec]:
    """``{name: spec}`` in the order given (``models/__init__.py``'s list).

    Raises:
        ValueError: a name that is not an identifier, is a shared section (audio, data, train) or "tiny", or is
            given twice.
    """
    found: dict[str, ModelSpec] = {}
    for spec in specs:
        if not spec.name.isidentifier() or spec.name in SHARED_SECTIONS or spec.name == "tiny":
            raise ValueError(f"model name {spec.name!r} must be an identifier other than "
                             f"{', '.join(SHARED_SECTIONS)}, tiny")
        if spec.name in found:
            raise ValueError(f"model name {spec.name!r} is registered twice")
        found[spec.name] = spec
    return found
