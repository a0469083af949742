"""Weights from elsewhere (``train.py --init-from``, ``scripts/import_weights.py``): a checkpoint of ``train.py``, or
one another project published, which a model's ``Published.read`` renames (NVIDIA's Tacotron2 and WaveGlow, jik876's
HiFi-GAN). Nothing in a file runs: a pickled module (NVIDIA's WaveGlow) is read as a :class:`Record` of attributes."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from utils.checkpoint.files import CheckpointError, _load_failure, few
from utils.checkpoint.resume import read_checkpoint
from utils.checkpoint.sharded import is_sharded


@dataclasses.dataclass
class Weights:
    """Weights read by :func:`read_weights`: ``source`` (what the file is, for the log), ``model_name``, ``state`` (this
    project's key names) and ``partial`` (key prefixes the file lacks, which keep their fresh initialisation)."""

    source: str
    model_name: str
    state: dict[str, torch.Tensor]
    partial: tuple[str, ...] = ()


class Record:
    """What a pickled module of a published file becomes: its attributes (``__dict__``), no behaviour."""


def record_parameters(record: Record, prefix: str = "") -> dict[str, torch.Tensor]:
    """The parameters and buffers of a pickled module's :class:`Record` and of its sub-modules, by the keys its
    ``state_dict`` would have."""
    found = {prefix + name: value.detach() for store in ("_parameters", "_buffers")
             for name, value in (getattr(record, store, None) or {}).items() if isinstance(value, torch.Tensor)}
    for name, child in (getattr(record, "_modules", None) or {}).items():
        if isinstance(child, Record):
            found.update(record_parameters(child, f"{prefix}{name}."))
    return found


def weight_norm_key(key: str) -> str:
    """Old-style weight norm's ``<layer>.weight_g``/``_v`` as ``torch.nn.utils.parametrizations.weight_norm`` names them
    (``...parametrizations.weight.original0``/``1``)."""
    return re.sub(r"\.weight_g$", ".parametrizations.weight.original0",
                  re.sub(r"\.weight_v$", ".parametrizations.weight.original1", key))


def _load(path: Path, pickled_classes: tuple[str, ...]) -> Any:
    """``torch.load(weights_only=True)``, with ``pickled_classes`` (``module.Class``) read as :class:`Record` s; a
    :class:`CheckpointError` for anything else that is not plain data (named), or a damaged file."""
    records = [(type(name.rsplit(".", 1)[1], (Record,), {}), name) for name in pickled_classes]
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([*records, OrderedDict]):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure is this one line
        raise CheckpointError(f"--init-from {path}: cannot load it safely: {_load_failure(err)}") from None


def read_weights(path: str | Path, models: dict[str, Any], cfg: Any) -> Weights:
    """The weights in ``path`` in this project's key names, and the model of ``models`` they belong to: a checkpoint of
    ``train.py`` (a sharded folder's ``state`` is left empty, for ``load_sharded_model``), or a published format some
    model's ``Published.read`` takes. ``cfg``: this run's config (a format may need its sizes).

    Raises:
        CheckpointError: a missing or unreadable file, a model this project does not have, or a format no model reads.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--init-from {path}: no such file or folder")
    try:
        state = read_checkpoint(path)
    except CheckpointError:
        if is_sharded(path):
            raise
        state = {}  # not a checkpoint of train.py: a published format, perhaps
    if is_sharded(path) or "model_name" in state:
        name = state.get("model_name")
        if name not in models:
            raise CheckpointError(f"--init-from {path}: it holds a '{name}' model, which models/__init__.py does not "
                                  "register")
        if is_sharded(path):
            return Weights(f"a sharded checkpoint of model '{name}'", name, {})
        return Weights(f"a checkpoint of model '{name}' at step {state.get('step')}", name, state["model"])
    readers = {name: spec.published for name, spec in models.items() if spec.published is not None}
    loaded = _load(path, tuple(name for published in readers.values() for name in published.pickled_classes))
    for published in readers.values():
        if (weights := published.read(loaded, cfg)) is not None:
            return weights
    raise CheckpointError(f"--init-from {path}: not a checkpoint of this project, nor a published checkpoint a model "
                          f"of models/ reads ({', '.join(sorted(readers)) or 'none reads any'}: Published.read)")


def load_into(model: torch.nn.Module, weights: Weights, source: str) -> list[str]:
    """Copy ``weights.state`` into ``model``: every key of the model outside ``weights.partial`` must be given, shapes
    matching, and every given key must be the model's. Returns the key prefixes that kept their initialisation.

    Raises:
        CheckpointError: missing, unexpected or misshapen keys (named, at most 5 of each).
    """
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
