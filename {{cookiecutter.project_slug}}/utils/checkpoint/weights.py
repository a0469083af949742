"""Weights to start from (``train.py --init-from``): a checkpoint of ``train.py`` or, with the published formats
(``Formats.published``), a file another project published; :func:`load_into` puts them into a fresh model."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from utils.checkpoint.files import CheckpointError, misfit, torch_file_problem
from utils.checkpoint.resume import Formats
from utils.framing import Framing, saved_framing


@dataclasses.dataclass
class Weights:
    """Weights read by :func:`read_weights`: ``source`` (what the file is), ``state`` (in this project's key names),
    ``partial`` (key prefixes the file lacks), ``load_folder`` (a folder's reader of its weights into a model, in place
    of ``state``), ``framing`` (of the mels they were trained on, where a checkpoint records it), ``speakers`` (its
    speaker map entry, where a checkpoint records one)."""

    source: str
    model_name: str
    state: dict[str, torch.Tensor]
    partial: tuple[str, ...] = ()
    load_folder: Optional[Callable[[torch.nn.Module], None]] = None
    framing: Optional[Framing] = None
    speakers: Optional[Any] = None  # a checkpoint's speaker map entry ({name: index}), as read


def read_weights(path: str | Path, models: dict[str, Any], cfg: Any, label: str = "--init-from", *,
                 formats: Formats) -> Weights:
    """The weights in ``path`` and their model: a checkpoint of ``train.py`` (a file, or a folder of ``formats``), or a
    file ``formats.published`` reads (it may set sizes of ``cfg``). A :class:`CheckpointError` for a file missing or
    unreadable, of a model not in ``models``, or of a format no model reads."""
    path, published = Path(path), formats.published
    if not path.exists():
        raise CheckpointError(f"{label} {path}: no such file or folder")
    if path.is_file() and (problem := torch_file_problem(path, formats.legacy)) is not None:
        raise CheckpointError(f"{label} {path} {problem}")
    try:
        state = formats.of(path).read(path)
    except CheckpointError:
        if path.is_dir() or published is None:
            raise
        state = {}  # not a checkpoint of train.py: a published format, perhaps
    if path.is_dir() or "model_name" in state:
        name = state.get("model_name")
        if name not in models:
            raise CheckpointError(f"{label} {path}: it holds a '{name}' model, which models/__init__.py does not "
                                  "register")
        framing = recorded_framing(state, models[name].recipe, f"{label} {path}")
        if path.is_dir():  # a folder of formats.folder (formats.of refused it without one)
            return Weights(f"a {formats.folder.noun} of model '{name}' at step {state.get('step')}", name, {},
                           load_folder=functools.partial(formats.folder.load_weights, path), framing=framing,
                           speakers=state.get("speakers"))
        return Weights(f"a checkpoint of model '{name}' at step {state.get('step')}", name, state["model"],
                       framing=framing, speakers=state.get("speakers"))
    if published is None:
        raise CheckpointError(f"{label} {path}: not a checkpoint of this project (no 'model_name' entry)")
    return published.read(path, cfg, label)


def recorded_framing(saved: dict[str, Any], recipe: dict[str, Any], what: str) -> Optional[Framing]:
    """The framing the checkpoint entries ``saved`` record (``saved_framing``), None where only assumed; a
    :class:`CheckpointError` (naming ``what``) for a value that is no framing."""
    try:
        framing, assumed = saved_framing(saved, recipe)
    except ValueError as err:
        raise CheckpointError(f"{what}: {err}") from None
    return None if assumed else framing


def load_into(model: torch.nn.Module, weights: Weights, source: str) -> list[str]:
    """``weights`` into ``model``: every key outside ``weights.partial``, shapes matching, and no other; returns the
    prefixes that kept their initialisation. A :class:`CheckpointError` names the keys that do not fit."""
    if weights.load_folder is not None:
        weights.load_folder(model)
        return []
    own = model.state_dict()
    if problems := misfit(own, weights.state, "other shapes", weights.partial):
        raise CheckpointError(f"{source} does not fit this run's {type(model).__name__} ({problems}); its config must "
                              "match the weights' (sizes, n_mels, ...)")
    model.load_state_dict({**own, **{key: value.to(own[key].dtype) for key, value in weights.state.items()}})
    return list(weights.partial)
