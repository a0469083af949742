"""Weights from elsewhere, read into this project's models: ``train.py --init-from`` and ``scripts/import_weights.py``.

:func:`read_weights` takes a checkpoint of this project's ``train.py`` (its model's weights), or a checkpoint another
project published, in that project's own format: each model of ``model.py`` reads the formats of its reference project
(``Published.read`` of its spec; the example models: NVIDIA's checkpoints for its Tacotron2 and WaveGlow, jik876's
generator files for HiFi-GAN) and renames their keys to its own. :func:`load_into` puts the result into a model, naming
whatever does not fit.

Nothing in a file runs. ``torch.load(weights_only=True)`` reads what is plain data; a file that pickles whole modules
(NVIDIA's WaveGlow does) is read with each pickled class a model names (``Published.pickled_classes``) replaced by a
:class:`Record` of its attributes, whose parameters :func:`record_parameters` collects.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from utils.checkpoint.files import CheckpointError, _load_failure
from utils.checkpoint.resume import read_checkpoint
from utils.checkpoint.sharded import is_sharded


@dataclasses.dataclass
class Weights:
    """Weights read by :func:`read_weights`: ``source`` (what the file is, for the run's log line), ``model_name`` (the
    model of ``model.py`` they belong to), ``state`` (this project's key names) and ``partial`` (key prefixes of the
    model's networks the file does not hold, which keep their fresh initialisation)."""

    source: str
    model_name: str
    state: dict[str, torch.Tensor]
    partial: tuple[str, ...] = ()


class Record:
    """What a pickled module of a published file becomes: its attributes (``__dict__``), no behaviour."""


def record_parameters(record: Record, prefix: str = "") -> dict[str, torch.Tensor]:
    """The parameters and buffers of a pickled module's :class:`Record` and of its sub-modules, by the keys its
    ``state_dict`` would have."""
    found = {}
    for store in ("_parameters", "_buffers"):
        for name, value in (getattr(record, store, None) or {}).items():
            if isinstance(value, torch.Tensor):
                found[prefix + name] = value.detach()
    for name, child in (getattr(record, "_modules", None) or {}).items():
        if isinstance(child, Record):
            found.update(record_parameters(child, f"{prefix}{name}."))
    return found


def weight_norm_key(key: str) -> str:
    """Old-style weight norm's ``<layer>.weight_g``/``<layer>.weight_v`` as ``torch.nn.utils.parametrizations.weight_norm``
    names them (``...parametrizations.weight.original0``/``1``)."""
    return re.sub(r"\.weight_g$", ".parametrizations.weight.original0",
                  re.sub(r"\.weight_v$", ".parametrizations.weight.original1", key))


def _load(path: Path, pickled_classes: tuple[str, ...]) -> Any:
    """``torch.load(weights_only=True)``, with ``pickled_classes`` (``module.Class``) read as :class:`Record` s.

    Raises:
        CheckpointError: anything else that is not plain data (named), or a damaged file.
    """
    records = [(type(name.rsplit(".", 1)[1], (Record,), {}), name) for name in pickled_classes]
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([*records, OrderedDict]):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure is this one line
        raise CheckpointError(f"--init-from {path}: cannot load it safely: {_load_failure(err)}") from None


def read_weights(path: str | Path, models: dict[str, Any], cfg: Any) -> Weights:
    """The weights in ``path`` in this project's key names, and the model of ``models`` (``model.MODELS``) they belong to:
    a checkpoint of ``train.py`` (a sharded folder: ``state`` is left empty, for
    ``utils.checkpoint.load_sharded_model``), or a published format some model's ``Published.read`` takes. ``cfg``: this
    run's config (a format may need its sizes).

    Raises:
        CheckpointError: a missing or unreadable file, a model this project does not have, or a format no model reads.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--init-from {path}: no such file or folder")
    if is_sharded(path) or _is_ours(path):
        state = read_checkpoint(path)
        name = state.get("model_name")
        if name not in models:
            raise CheckpointError(f"--init-from {path}: it holds a '{name}' model, which models/__init__.py does not register")
        if is_sharded(path):
            return Weights(f"a sharded checkpoint of model '{name}'", name, {})
        return Weights(f"a checkpoint of model '{name}' at step {state.get('step')}", name, state["model"])
    readers = {name: spec.published for name, spec in models.items() if spec.published is not None}
    loaded = _load(path, tuple(name for published in readers.values() for name in published.pickled_classes))
    for published in readers.values():
        weights = published.read(loaded, cfg)
        if weights is not None:
            return weights
    raise CheckpointError(f"--init-from {path}: not a checkpoint of this project, nor a published checkpoint a model "
                          f"of models/ reads ({', '.join(sorted(readers)) or 'none reads any'}: Published.read)")


def _is_ours(path: Path) -> bool:
    """Whether a file is a checkpoint of this project's ``train.py`` (it names its model)."""
    try:
        return "model_name" in read_checkpoint(path)
    except CheckpointError:
        return False


def load_into(model: torch.nn.Module, weights: Weights, source: str) -> list[str]:
    """Copy ``weights.state`` into ``model`` (its key names must match, shapes included): every key of the model outside
    ``weights.partial`` must be given, and every given key must be the model's.

    Returns:
        the key prefixes that kept their initialisation (``weights.partial``).

    Raises:
        CheckpointError: missing, unexpected or misshapen keys (named, at most 5 of each).
    """
    own = model.state_dict()
    expected = {key for key in own if not key.startswith(weights.partial)} if weights.partial else set(own)
    missing = sorted(expected - set(weights.state))
    unexpected = sorted(set(weights.state) - set(own))
    misshapen = [f"{key} {tuple(weights.state[key].shape)} vs {tuple(own[key].shape)}"
                 for key in sorted(set(own) & set(weights.state)) if weights.state[key].shape != own[key].shape]
    if missing or unexpected or misshapen:
        def few(items: list[str]) -> str:
            return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")
        parts = [f"{label}: {few(items)}" for label, items in (("missing", missing), ("unexpected", unexpected),
                                                               ("other shapes", misshapen)) if items]
        raise CheckpointError(f"{source} does not fit this run's {type(model).__name__} ({'; '.join(parts)}); its "
                              "config must match the weights' (sizes, n_mels, ...)")
    model.load_state_dict({**own, **{key: value.to(own[key].dtype) for key, value in weights.state.items()}})
    return list(weights.partial)
