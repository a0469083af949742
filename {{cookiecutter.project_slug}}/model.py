"""The model contract: what ``train.py``, ``inference.py`` and the scripts need from a model, grouped by who reads it.

Your own model (``docs/own_model_example.py`` is a complete file to start from): write ``models/<name>.py`` with a
config section (a :class:`utils.config.ModelSection`), an ``nn.Module`` whose ``forward`` takes a batch dict, a loss
``criterion(outputs, batch) -> scalar`` (or ``(scalar, {term: scalar})``, each term logged) and
``build_datasets(cfg) -> (train, val)``, ending in ``SPEC = ModelSpec(name="<name>", ...)``; list it in
``models/__init__.py``; train it with ``python multiproc.py train.py --model <name>``. A batch is a dict of tensors
plus an ``"ids"`` list of utterance ids. The groups besides :class:`Training` are optional, each read by one consumer
that says where one is missing; what a tool of an optional part needs of a model is declared by that part and
registered in ``parts.py``. Several optimizers (:class:`Phases`: a GAN) and a model bigger than one GPU
(``Training.blocks``) fit without touching ``train.py`` (torchtitan's ``ModelSpec`` is the model).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Union

import torch
from torch import nn

if TYPE_CHECKING:  # the contract depends on torch alone; a section's class is the model's own
    from utils.config import Config

Batch = dict[str, Any]
Loss = Union[torch.Tensor, tuple[torch.Tensor, dict[str, torch.Tensor]]]  # a criterion's: the loss, or with its terms


def adam(model: nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """The default optimizer: Adam with ``optimizer.lr`` and ``optimizer.weight_decay``, fused on CUDA."""
    return torch.optim.Adam(model.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay,
                            fused=device.type == "cuda")


@dataclasses.dataclass(frozen=True)
class Phases:
    """Several optimizers, updated in order in every step (a GAN: the discriminator's, then the generator's)."""

    names: tuple[str, ...]  # optimizer names in update order; Training.build_optimizer returns {name: Optimizer}
    networks: Callable[[nn.Module], dict[str, nn.Module]]  # model -> {phase: the network its optimizer trains}
    # (phase, nets, batch) -> (loss, {name: scalar to log}); nets[phase] is DDP-wrapped, the others plain and frozen
    train_step: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    # (phase, optimizer, cfg) -> (LRScheduler, "step" | "epoch"); None: optimizer.schedule, stepped every step
    build_scheduler: Optional[Callable[..., tuple[Any, str]]] = None


@dataclasses.dataclass(frozen=True)
class Training:
    """What ``train.py`` needs; the first four are required."""

    # cfg -> (outputs, batch) -> the scalar loss, or (loss, {term: scalar}): each term logged as the loss is (under
    # "losses" of metrics.jsonl and val_metrics.jsonl, train/<term> and val/<term>), never back-propagated
    build_criterion: Callable[[Config], Callable[[Any, Batch], Loss]]
    build_datasets: Callable[[Config], tuple]  # cfg -> (train_dataset, val_dataset)
    collate_fn: Optional[Callable[[list], Batch]]  # items -> batch dict (None: PyTorch's default collation)
    count_items: Callable[[Batch], int]  # batch -> the items it holds (audio samples, mel frames), for items/s
    build_optimizer: Callable[..., Any] = adam  # (model, cfg, device) -> Optimizer, or {phase: Optimizer}
    on_device: Optional[Callable[[Batch, Config], Batch]] = None  # (batch, cfg) -> batch, on the device in the step
    check_text: Optional[Callable[[str, Config], Optional[str]]] = None  # the corpus check's (text, cfg) -> reason
    data_advice: str = "raise data.num_workers"  # what to do when the GPU waits for this model's data
    variable_length: bool = False  # items differ in length; its train dataset has lengths(): batching by length
    log_validation: Optional[Callable[..., None]] = None  # rank 0: (model, batch, outputs, step, writer, dir, cfg=)
    # the key of its section that names a vocoder checkpoint for log_validation's audio (null: none, its own way): the
    # run loads it once at its start, on rank 0, and passes log_validation vocoder= that Vocoder
    val_vocoder: Optional[str] = None
    optimize_for_training: Optional[Callable[..., nn.Module]] = None  # (model, cfg, **compile_kwargs): train.compile
    # model -> its repeated units in forward order: what a model split over the ranks splits and recomputes one by one
    blocks: Optional[Callable[[nn.Module], list[nn.Module]]] = None
    # state-dict keys of tables with a row per speaker of data.speakers: from --init-from, new speakers' rows are added
    speaker_rows: tuple[str, ...] = ()
    phases: Optional[Phases] = None  # several optimizers; None: one network, one loss, one optimizer
    # (cfg, (train, val) corpora) -> (train_dataset, val_dataset) whose item(index, audio) makes item index of its
    # utterance's sound (float32 (T,) at audio.sampling_rate): what a corpus a part reads (not a file each) trains
    datasets_of: Optional[Callable[[Config, tuple], tuple]] = None


@dataclasses.dataclass(frozen=True)
class Inference:
    """What ``inference.py`` needs."""

    infer: Callable[..., list]  # (model, cfg, args, device) -> the paths it wrote
    add_args: Optional[Callable[[Any], None]] = None  # parser -> None: the model's own options
    vocode: Optional[Callable[..., torch.Tensor]] = None  # (model, mel (n_mels, frames), cfg) -> audio (samples,)
    takes_vocoder: bool = False  # the model makes mels (its options offer --vocoder); the tests run it last
    modules: tuple[str, ...] = ()  # sub-modules inference uses (empty: all): kept by releases, averaged by EMA


class Vocoder(NamedTuple):
    """A vocoder checkpoint loaded to vocode another model's mels (``inference.load_vocoder``, in eval mode): its
    model's name, its ``log-mel (n_mels, frames) -> audio (frames * hop_length,)`` (float32 on the CPU, in [-1, 1], no
    gradient) and its config."""

    name: str
    vocode: Callable[[torch.Tensor], torch.Tensor]
    cfg: Any


@dataclasses.dataclass(frozen=True)
class BatchFrames:
    """A recipe's ``data.max_frames``: the padded mel frames of the model's fixed batch, its section's ``batch_size``
    times ``frames`` (the longest clip's: 870 for LJSpeech's 10.1 s at hop 256), so ``--tiny``'s batch sizes it too."""

    frames: int

    def __str__(self) -> str:
        return f"batch_size x {self.frames}"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model: its name (``--model NAME``, its ``config.json`` section), the section's class, ``build_model`` (``cfg
    -> nn.Module``; ``forward(batch)`` returns what the criterion reads), and the groups above."""

    name: str
    config_cls: type  # its config.json section: a utils.config.ModelSection subclass
    build_model: Callable[[Config], nn.Module]
    training: Training
    inference: Optional[Inference] = None
    # its reference's values of shared settings a config leaves null ({"train.grad_clip": 1.0}, a BatchFrames for
    # data.max_frames); else the project's
    recipe: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def phase_names(self) -> tuple[str, ...]:
        """The optimizers' names: ``Phases.names``, or ``()`` for one optimizer."""
        return self.training.phases.names if self.training.phases is not None else ()

    @property
    def inference_modules(self) -> tuple[str, ...]:
        """``Inference.modules`` (``()``, the whole model, without an inference group)."""
        return self.inference.modules if self.inference is not None else ()
