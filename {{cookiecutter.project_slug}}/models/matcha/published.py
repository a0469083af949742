"""shivammehta25/Matcha-TTS's Lightning checkpoints (its published ``matcha_ljspeech.ckpt``, ``matcha_vctk.ckpt``;
its ``train.py`` checkpoints) read into this model (``--init-from``, ``import_weights``), nothing in them run: their
``hyper_parameters`` pickle omegaconf nodes and a ``functools.partial`` of the optimizer, read as inert records of
their state (:data:`PICKLED_CLASSES`, :data:`PICKLED_CALLS`); any other name a file pickles is refused, as every
loader refuses it."""

from __future__ import annotations

from typing import Any

import torch

from models.matcha.network import from_reference
from models.matcha.text import SYMBOLS
from utils.checkpoint.files import CheckpointError
from utils.checkpoint.published import Call, Published, Record, Weights
from utils.config import Config, ConfigError

PICKLED_CLASSES = ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig", "omegaconf.nodes.AnyNode",
                   "omegaconf.base.ContainerMetadata", "omegaconf.base.Metadata", "typing.Any", "builtins.dict",
                   "builtins.list", "builtins.int", "torch.optim.adam.Adam")
"""What the authors' checkpoints pickle besides tensors and containers: omegaconf's nodes and their metadata (whose
types name ``typing.Any``, ``dict``, ``list``, ``int``), and the optimizer class its partial names."""
PICKLED_CALLS = ("functools.partial", "collections.defaultdict")
"""What they pickle as a call: the optimizer (``hparams.optimizer``, Hydra's ``_partial_``) and omegaconf's resolver
cache."""

ENCODER = ("n_channels", "filter_channels", "filter_channels_dp", "n_heads", "n_layers", "kernel_size", "p_dropout")
DECODER = {"channels": "decoder_channels", "dropout": "decoder_dropout", "attention_head_dim": "attention_head_dim",
           "n_blocks": "n_blocks", "num_mid_blocks": "num_mid_blocks", "num_heads": "num_heads"}
"""The authors' ``encoder.encoder_params`` keys (``matcha``'s too), and their ``decoder`` keys -> ``matcha``'s."""
NODES = {"DictConfig": "_content", "ListConfig": "_content", "AnyNode": "_val"}
"""omegaconf's nodes (as records) -> the attribute holding their value."""
FIXED = {"encoder.encoder_type": "RoPE Encoder", "encoder.encoder_params.prenet": True, "decoder.act_fn": "snakebeta",
         "cfm.solver": "euler"}
"""The authors' settings this network has only one value of (``configs/model/*/default.yaml``'s)."""


def plain(value: Any, where: str = "hyper_parameters") -> Any:
    """``value`` with each omegaconf node's record (``DictConfig``, ``ListConfig``, ``AnyNode``: its ``_content`` or
    ``_val``) made plain dicts, lists and values, in dicts and lists too; other values as they are. A
    :class:`CheckpointError` names a value left an interpolation (``${...}``) or missing (``???``), which only
    omegaconf (and the root config) would resolve."""
    if isinstance(value, Record) and not isinstance(value, Call) and type(value).__name__ in NODES:
        value = vars(value).get(NODES[type(value).__name__])
        if isinstance(value, str) and (value.startswith("${") or value == "???"):
            raise CheckpointError(f"its {where} is {value}, which this reader does not resolve")
    if isinstance(value, dict):
        return {key: plain(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return value


def lookup(settings: dict, path: str) -> Any:
    """``settings``'s value at the dotted ``path`` (``encoder.encoder_params.n_channels``); a :class:`CheckpointError`
    naming it where absent."""
    value = settings
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise CheckpointError(f"its hyper_parameters have no {path}")
        value = value[key]
    return value


def matcha_settings(hparams: dict, cfg: Config) -> dict[str, Any]:
    """The ``matcha`` settings of the authors' ``hyper_parameters`` (made :func:`plain`): the encoder's, duration
    predictor's, decoder's and CFM's sizes, the speaker vectors' width and the data statistics.

    Raises:
        CheckpointError: a setting this network cannot honour (another encoder, a duration predictor of other sizes,
            another activation or solver), a vocabulary other than :data:`SYMBOLS`' or ``n_feats`` other than
            ``audio.n_mels``; each named with its value.
    """
    for path, value in FIXED.items():
        if lookup(hparams, path) != value:
            raise CheckpointError(f"its {path} is {lookup(hparams, path)!r}; this network has {value!r} only")
    if lookup(hparams, "n_vocab") != len(SYMBOLS):
        raise CheckpointError(f"its n_vocab is {lookup(hparams, 'n_vocab')}; this model's text front end has "
                              f"{len(SYMBOLS)} symbols (the authors' English symbol table)")
    if lookup(hparams, "n_feats") != cfg.audio.n_mels:
        raise CheckpointError(f"its n_feats is {lookup(hparams, 'n_feats')}, the config's audio.n_mels "
                              f"{cfg.audio.n_mels}: --set audio.n_mels={lookup(hparams, 'n_feats')}")
    encoder = {key: lookup(hparams, f"encoder.encoder_params.{key}") for key in ENCODER}
    for key in ("filter_channels_dp", "kernel_size", "p_dropout"):
        if (theirs := lookup(hparams, f"encoder.duration_predictor_params.{key}")) != encoder[key]:
            raise CheckpointError(f"its encoder.duration_predictor_params.{key} is {theirs!r}, not the encoder's "
                                  f"{encoder[key]!r}, which this network's duration predictor takes")
    statistics = ({"mel_mean": 0.0, "mel_std": 1.0} if lookup(hparams, "data_statistics") is None  # their default
                  else {key: lookup(hparams, f"data_statistics.{key}") for key in ("mel_mean", "mel_std")})
    return {**encoder, **{ours: lookup(hparams, f"decoder.{theirs}") for theirs, ours in DECODER.items()},
            "sigma_min": lookup(hparams, "cfm.sigma_min"), "spk_emb_dim": lookup(hparams, "spk_emb_dim"),
            **statistics}


def read_published(loaded: Any, cfg: Config) -> Weights | None:
    """shivammehta25/Matcha-TTS's Lightning checkpoints (``{"state_dict", "hyper_parameters", "epoch",
    "global_step", "optimizer_states", ...}``; the model ``MatchaTTS``), or ``None`` for another format. Its
    ``hyper_parameters`` set ``cfg.matcha``'s sizes, ``spk_emb_dim`` and ``mel_mean`` / ``mel_std`` (its
    ``data_statistics``: the normalisation its weights expect; :func:`matcha_settings`), which a run from it records
    and keeps on a restart; its ``n_spks`` speakers (more than one) become the speaker map ``"0"`` .. ``"n_spks - 1"``
    (its speaker ids, as its filelists and ``--spk`` give them). Its ``state_dict`` is renamed by
    :func:`models.matcha.network.from_reference`, less its ``mel_mean`` / ``mel_std`` buffers (its statistics again).
    ``out_size`` (the authors' training crop) is said in ``source``, not set: ``matcha.out_size`` is the run's choice.

    Raises:
        CheckpointError: no ``hyper_parameters``, or nested without end; a setting this model cannot honour, a value
            no config takes, a speaker count its table does not have, or names that collide.
    """
    state = loaded.get("state_dict") if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not any(str(key).startswith("encoder.encoder.") for key in state):
        return None
    try:
        hparams = plain(loaded.get("hyper_parameters"))
    except RecursionError:  # a crafted file: containers nested thousands deep, or holding themselves
        raise CheckpointError("its hyper_parameters are nested too deeply to be settings") from None
    if not isinstance(hparams, dict):
        raise CheckpointError("it has the state_dict names of Matcha-TTS's Lightning checkpoints, but no "
                              "hyper_parameters (their sizes and data statistics)")
    try:
        changed = cfg.apply({"matcha": matcha_settings(hparams, cfg)}, "its hyper_parameters")
    except ConfigError as err:
        raise CheckpointError(str(err)) from None
    n_spks, table = lookup(hparams, "n_spks"), state.get("spk_emb.weight")
    rows = table.shape[0] if isinstance(table, torch.Tensor) and table.dim() == 2 else 1
    if not isinstance(n_spks, int) or n_spks != rows:
        raise CheckpointError(f"its n_spks is {n_spks!r}, its speaker table (spk_emb.weight) has {rows} row(s)")
    try:
        renamed = from_reference({key: value for key, value in state.items() if key not in ("mel_mean", "mel_std")
                                  and isinstance(value, torch.Tensor)})
    except KeyError as err:
        raise CheckpointError(f"its state_dict: {err.args[0]}") from None
    said = ", ".join(f"{key}={value}" for key, _, value in changed) or "the config's, unchanged"
    crop = (f"; its out_size {hparams['out_size']} (a training crop) is not set: --set "
            f"matcha.out_size={hparams['out_size']} trains on such segments" if hparams.get("out_size") else "")
    source = (f"shivammehta25/Matcha-TTS's Lightning checkpoint ({n_spks} speaker{'s' if n_spks != 1 else ''}); its "
              f"settings: {said}{crop}")
    speakers = {str(index): index for index in range(n_spks)} if n_spks > 1 else None
    return Weights(source, "matcha", renamed, speakers=speakers)


PUBLISHED = Published(read=read_published, source="shivammehta25's Matcha-TTS Lightning checkpoint",
                      pickled_classes=PICKLED_CLASSES, pickled_calls=PICKLED_CALLS)
"""shivammehta25/Matcha-TTS's Lightning checkpoints, as ``parts.py`` registers Matcha-TTS's reader."""
