"""Weights to start from (``train.py --init-from``): a checkpoint of ``train.py`` (a file or a sharded folder), or, where
the project has :mod:`utils.checkpoint.published`, a file another project published, which a model's ``Published.read``
renames. :func:`load_into` puts them into a fresh model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import torch

from utils.checkpoint.files import CheckpointError, few, torch_file_problem
from utils.checkpoint.resume import folder_reader, read_checkpoint
from utils.parts import optional_part


@dataclasses.dataclass
class Weights:
    """Weights read by :func:`read_weights`: ``source`` (what the file is, for the log), ``model_name``, ``state`` (this
    project's key names), ``partial`` (key prefixes the file lacks, which keep their fresh initialisation) and
    ``folder``: a sharded checkpoint folder, whose weights :func:`load_into` reads itself (``state`` is then empty)."""

    source: str
    model_name: str
    state: dict[str, torch.Tensor]
    partial: tuple[str, ...] = ()
    folder: Optional[Path] = None


def read_weights(path: str | Path, models: dict[str, Any], cfg: Any, label: str = "--init-from") -> Weights:
    """The weights in ``path`` in this project's key names, and the model of ``models`` they belong to: a checkpoint of
    ``train.py`` (a sharded folder's ``state`` is left empty, for ``load_sharded_model``), or a published format some
    model's ``Published.read`` takes (:func:`utils.checkpoint.published.read_published`, where the project has it).
    ``cfg``: this run's config (a format may need its sizes; ``Published.read`` may set what the weights expect, e.g.
    Tacotron2's text cleaners); ``label``: what named the file, for errors.

    Raises:
        CheckpointError: a missing or unreadable file, a model this project does not have, or a format no model reads.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{label} {path}: no such file or folder")
    if path.is_file() and (problem := torch_file_problem(path)) is not None:
        raise CheckpointError(f"{label} {path} {problem}")
    published = optional_part("utils.checkpoint.published")
    try:
        state = read_checkpoint(path)
    except CheckpointError:
        if path.is_dir() or published is None:
            raise
        state = {}  # not a checkpoint of train.py: a published format, perhaps
    if path.is_dir() or "model_name" in state:
        name = state.get("model_name")
        if name not in models:
            raise CheckpointError(f"{label} {path}: it holds a '{name}' model, which models/__init__.py does not "
                                  "register")
        if path.is_dir():  # a sharded folder (read_checkpoint refused it without the part)
            return Weights(f"a sharded checkpoint of model '{name}' at step {state.get('step')}", name, {},
                           folder=path)
        return Weights(f"a checkpoint of model '{name}' at step {state.get('step')}", name, state["model"])
    if published is None:
        raise CheckpointError(f"{label} {path}: not a checkpoint of this project (no 'model_name' entry)")
    return published.read_published(path, models, cfg, label)


def load_into(model: torch.nn.Module, weights: Weights, source: str) -> list[str]:
    """Copy ``weights.state`` (or the weights of the sharded ``weights.folder``) into ``model``: every key of the model
    outside ``weights.partial`` must be given, shapes matching, and every given key must be the model's. Returns the
    key prefixes that kept their initialisation.

    Raises:
        CheckpointError: missing, unexpected or misshapen keys (named, at most 5 of each).
    """
    if weights.folder is not None:
        folder_reader(weights.folder).load_sharded_model(weights.folder, model)
        return []
    own = model.state_dict()
    given = weights.state
    problems = {"missing": sorted(key for key in own if key not in given and not key.startswith(weights.partial)),
                "unexpected": sorted(set(given) - set(own)),
                "other shapes": [f"{key} {tuple(given[key].shape)} vs {tuple(own[key].shape)}"
                                 for key in sorted(set(own) & set(given)) if given[key].shape != own[key].shape]}
    if any(problems.values()):
        parts = "; ".join(f"{label}: {few(items)}" for label, items in problems.items() if items)
        raise CheckpointError(f"{source} does not fit this run's {type(model).__name__} ({parts}); its config must "
                              "match the weights' (sizes, n_mels, ...)")
    model.load_state_dict({**own, **{key: value.to(own[key].dtype) for key, value in weights.state.items()}})
    return list(weights.partial)
