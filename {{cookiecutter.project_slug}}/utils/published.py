"""Weights published by other projects, in their own checkpoint formats, read into this project's models.

``train.py --init-from PATH`` starts a run from them (fresh optimizers, step 0); see :func:`read_weights`. Known:

* NVIDIA/tacotron2 (``tacotron2_statedict.pt`` and its training checkpoints): ``{"state_dict": {...},
  "iteration", "optimizer", "learning_rate"}``. The same network as ``models/tacotron2.py``; NVIDIA wraps every
  convolution and linear layer in a ``ConvNorm``/``LinearNorm`` (``.conv.``, ``.linear_layer.`` in the keys) and
  names the attention ``attention_layer`` with a ``location_layer`` inside.
* NVIDIA/waveglow (``waveglow_256channels_*.pt`` and its training checkpoints): ``{"model": <the pickled
  glow.WaveGlow module>, "iteration", "optimizer", "learning_rate"}``. A pickled module is code, which
  ``torch.load(weights_only=True)`` refuses: here it is unpickled with the pickled classes (NVIDIA's ``glow``
  classes, torch's module and weight-norm classes) replaced by inert records of their attributes, so nothing of the
  file runs; the parameters are then read off those records. Old-style weight norm (``weight_g``, ``weight_v``)
  becomes the parametrization ``models/waveglow.py`` uses; ``WN.<i>`` becomes ``flows.<i>`` (``in_layers`` ->
  ``dilated``, ``res_skip_layers`` -> ``res_skip``, ``cond_layer`` -> ``cond``), and ``convinv.<i>.conv``'s
  ``(c, c, 1)`` weight the ``(c, c)`` matrix ``convs.<i>``.
* jik876/hifi-gan (``g_<step>`` generator files): ``{"generator": {...}}``. The generator of ``models/hifigan.py``;
  its residual blocks ``resblocks.<i * kernels + j>.convs1/convs2`` are ``mrfs.<i>.blocks.<j>.dilated/plain`` here.
  Its discriminators are not in such a file: they start afresh.
* a checkpoint of this project's ``train.py`` (a file or a sharded folder): its model's weights.

Sources: the checkpoint code of each of those repositories (``train.py``'s ``save_checkpoint``), read for their
layouts; none of their code is used here.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from utils.checkpoint import CheckpointError, _load_failure, is_sharded, read_checkpoint


@dataclasses.dataclass
class Weights:
    """Weights read by :func:`read_weights`: ``source`` (what the file is, for the run's log line), ``model_name``
    (the model of ``model.py`` they belong to), ``state`` (this project's key names) and ``partial`` (the key prefixes
    of the model's networks the file does not hold, which keep their fresh initialisation)."""

    source: str
    model_name: str
    state: dict[str, torch.Tensor]
    partial: tuple[str, ...] = ()


def _weight_norm(key: str) -> str:
    """Old-style weight norm's ``weight_g``/``weight_v`` as ``torch.nn.utils.parametrizations.weight_norm`` names them."""
    return re.sub(r"\.weight_g$", ".parametrizations.weight.original0",
                  re.sub(r"\.weight_v$", ".parametrizations.weight.original1", key))


def nvidia_tacotron2(state: dict) -> dict:
    """NVIDIA/tacotron2 key names -> ``models/tacotron2.py``'s."""
    out = {}
    for key, value in state.items():
        key = key.replace("attention_layer.location_layer.", "attention.").replace("attention_layer.", "attention.")
        out[key.replace(".linear_layer.", ".").replace(".conv.", ".")] = value
    return out


def nvidia_waveglow(state: dict) -> dict:
    """NVIDIA/waveglow key names (of the pickled module's parameters) -> ``models/waveglow.py``'s."""
    renames = (("in_layers", "dilated"), ("res_skip_layers", "res_skip"), ("cond_layer", "cond"))
    out = {}
    for key, value in state.items():
        match = re.match(r"^WN\.(\d+)\.(\w+)\.(.*)$", key)
        if match:
            part = dict(renames).get(match.group(2), match.group(2))
            key = f"flows.{match.group(1)}.{part}.{match.group(3)}"
        if re.match(r"^convinv\.\d+\.conv\.weight$", key):  # a 1x1 Conv1d's (c, c, 1) weight: the (c, c) matrix here
            key, value = re.sub(r"^convinv\.(\d+)\.conv\.", r"convs.\1.", key), value.squeeze(-1)
        out[_weight_norm(key)] = value
    return out


def jik876_generator(state: dict, kernels: int) -> dict:
    """jik876/hifi-gan generator key names -> ``models/hifigan.py``'s (``generator.`` prefixed); ``kernels``: the
    residual block kernel sizes per upsampling stage (3 in every published configuration)."""
    out = {}
    for key, value in state.items():
        match = re.match(r"^resblocks\.(\d+)\.convs([12])\.(.*)$", key)
        if match:
            index = int(match.group(1))
            kind = "dilated" if match.group(2) == "1" else "plain"
            key = f"mrfs.{index // kernels}.blocks.{index % kernels}.{kind}.{match.group(3)}"
        out["generator." + _weight_norm(key)] = value
    return out


# --- NVIDIA's pickled WaveGlow module, read without running it ---------------------------------------------

class _Record:
    """What a pickled object becomes: a record of its attributes (``__dict__``), no behaviour."""


def _record_class(name: str) -> type:
    return type(name, (_Record,), {})


_PICKLED_CLASSES = ("glow.WaveGlow", "glow.WN", "glow.Invertible1x1Conv", "torch.nn.modules.conv.Conv1d",
                    "torch.nn.modules.conv.ConvTranspose1d", "torch.nn.modules.container.ModuleList",
                    "torch.nn.utils.weight_norm.WeightNorm", "torch.nn.modules.module.Module")
"""The classes a pickled NVIDIA WaveGlow refers to, each read as a :class:`_Record`."""


def _parameters(record: _Record, prefix: str = "") -> dict:
    """The parameters and buffers of a module record and its sub-modules, by state-dict key."""
    found = {}
    for store in ("_parameters", "_buffers"):
        for name, value in (getattr(record, store, None) or {}).items():
            if isinstance(value, torch.Tensor):
                found[prefix + name] = value.detach()
    for name, child in (getattr(record, "_modules", None) or {}).items():
        if isinstance(child, _Record):
            found.update(_parameters(child, f"{prefix}{name}."))
    return found


def _load_pickled_module(path: Path) -> dict:
    """``torch.load(weights_only=True)`` of a file holding pickled modules, each class read as a record.

    Raises:
        CheckpointError: the file refers to something else than :data:`_PICKLED_CLASSES` (named), or is damaged.
    """
    records = [(_record_class(name.rsplit(".", 1)[1]), name) for name in _PICKLED_CLASSES]
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals([*records, OrderedDict]):
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure is this one line
        raise CheckpointError(f"--init-from {path}: a pickled WaveGlow module that cannot be read without running "
                              f"its code: {_load_failure(err)}") from None


# --- reading a file ----------------------------------------------------------------------------------------------

def _load_plain(path: Path) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - untrusted input: every failure is this one line
        if "GLOBAL glow." in str(err):  # NVIDIA WaveGlow's pickled module: read by _load_pickled_module
            return None
        raise CheckpointError(f"--init-from {path}: cannot load it safely: {_load_failure(err)}") from None


def read_weights(path: str | Path, models: dict[str, Any], hifigan_kernels: int = 3) -> Weights:
    """The weights in ``path``, in this project's key names, and which model of ``models`` (``model.MODELS``)
    they belong to: a checkpoint of ``train.py``, or one of the published formats of the module docstring.
    ``hifigan_kernels``: residual block kernel sizes per upsampling stage of this run's HiFi-GAN config.

    Raises:
        CheckpointError: a missing or unreadable file, a format none of the above, or one whose model this project
            does not have (e.g. a WaveGlow file in a project without WaveGlow).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--init-from {path}: no such file or folder")
    if is_sharded(path) or path.is_file() and _is_ours(path):
        state = read_checkpoint(path)
        name = state.get("model_name")
        if name not in models:
            raise CheckpointError(f"--init-from {path}: it holds a '{name}' model, which model.py does not define")
        if is_sharded(path):
            return Weights(f"a sharded checkpoint of model '{name}'", name, {})  # loaded by the caller, shard-wise
        return Weights(f"a checkpoint of model '{name}' at step {state.get('step')}", name, state["model"])
    loaded = _load_plain(path)
    if loaded is None:
        loaded = _load_pickled_module(path)
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), _Record):
        return _known(path, models, "waveglow", "NVIDIA/waveglow's checkpoint (a pickled glow.WaveGlow)",
                      nvidia_waveglow(_parameters(loaded["model"])))
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict) and \
            "embedding.weight" in loaded["state_dict"]:
        return _known(path, models, "tacotron2", "NVIDIA/tacotron2's checkpoint", nvidia_tacotron2(loaded["state_dict"]))
    if isinstance(loaded, dict) and isinstance(loaded.get("generator"), dict) and \
            "conv_pre.weight_v" in loaded["generator"]:
        weights = _known(path, models, "hifigan", "jik876/hifi-gan's generator file",
                         jik876_generator(loaded["generator"], hifigan_kernels))
        return dataclasses.replace(weights, partial=("discriminator.",))
    raise CheckpointError(f"--init-from {path}: not a checkpoint of this project, nor one of the published formats "
                          "it reads (NVIDIA's Tacotron2 or WaveGlow, jik876's HiFi-GAN generator)")


def _is_ours(path: Path) -> bool:
    """Whether a file is a checkpoint of this project's ``train.py`` (it names its model)."""
    try:
        return "model_name" in read_checkpoint(path)
    except CheckpointError:
        return False


def _known(path: Path, models: dict, name: str, source: str, state: dict) -> Weights:
    if name not in models:
        raise CheckpointError(f"--init-from {path}: {source} holds a {name} model; this project has "
                              f"{', '.join(sorted(models))}")
    return Weights(source, name, state)


def load_into(model: torch.nn.Module, weights: Weights, source: str) -> list[str]:
    """Copy ``weights.state`` into ``model`` (its key names must match, shapes included): every key of the model
    outside ``weights.partial`` must be given, and every given key must be the model's.

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
        def few(items):
            return ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")
        parts = [f"{label}: {few(items)}" for label, items in (("missing", missing), ("unexpected", unexpected),
                                                               ("other shapes", misshapen)) if items]
        raise CheckpointError(f"--init-from {source} does not fit this run's {type(model).__name__} "
                              f"({'; '.join(parts)}); its config must match the weights' (sizes, n_mels, ...)")
    model.load_state_dict({**own, **{key: value.to(own[key].dtype) for key, value in weights.state.items()}})
    return list(weights.partial)
