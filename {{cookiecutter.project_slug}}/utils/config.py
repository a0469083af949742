"""Configuration: read ``config.json``, apply the ``tiny`` block and ``--set`` overrides, check every key.

``config.json`` is a JSON object of sections. The shared sections are ``audio``, ``data`` and ``train``
(the dataclasses below); each example model adds a section of its own, named after the model and
described by the model's dataclass in ``model.py``. An optional ``tiny`` object holds overrides with the
same shape (``{"train": {...}, "waveglow": {...}}``) that ``--tiny`` applies, for smoke runs on a CPU.

Every key is checked against its dataclass: an unknown section or key, or a value of the wrong type, is a
:class:`ConfigError` whose message names it. Keys left out take the dataclass default.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Mapping


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type."""


@dataclasses.dataclass
class AudioConfig:
    """Signal settings shared by every model (NVIDIA's LJSpeech defaults).

    ``sampling_rate`` in Hz; ``n_fft``, ``hop_length`` and ``win_length`` in samples;
    ``fmin``/``fmax`` in Hz; ``max_wav_value`` is the full-scale value of 16-bit PCM.
    """

    sampling_rate: int = 22050
    n_fft: int = 1024
    hop_length: int = 256
    win_length: int = 1024
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    max_wav_value: float = 32768.0


@dataclasses.dataclass
class DataConfig:
    """Where the corpus is and how it is loaded.

    ``dataset_path``: an LJSpeech-layout folder (``metadata.csv`` + ``wavs/``). ``training_files`` and
    ``validation_files``: optional NVIDIA-style filelists (``path|text``, paths relative to the dataset
    folder); when empty, ``metadata.csv`` is split and the last ``val_size`` utterances validate.
    ``mel_cache_dir``: where ``scripts/preprocess.py`` stored mels (relative to the dataset folder);
    used when it exists.
    """

    dataset_path: str = "data/LJSpeech-1.1"
    training_files: str = ""
    validation_files: str = ""
    val_size: int = 100
    num_workers: int = 4
    prefetch_factor: int = 2
    mel_cache_dir: str = "mels"


@dataclasses.dataclass
class TrainConfig:
    """The loop's settings. Intervals are in optimizer steps.

    ``precision``: ``fp32`` | ``tf32`` | ``bf16`` | ``fp16`` (fp16 uses a GradScaler).
    ``grad_accumulation``: micro-batches per optimizer step (the effective batch is
    ``batch_size * grad_accumulation * world_size``). ``grad_clip``: max gradient norm, 0 disables.
    ``lr_schedule``: ``constant`` or ``cosine`` (to 1% at ``max_steps``), after ``warmup_steps`` of linear
    warm-up. ``on_nonfinite``: what a NaN/inf loss or gradient norm does: ``skip`` the step (counted) or
    ``stop`` the run. ``spike_factor``: a step loss above ``mean + (factor - 1) * |mean|`` of its running
    mean is logged with the batch's utterance ids (0 disables). ``dist_timeout_s``: seconds a collective
    may wait for a hung rank before the run fails.
    """

    seed: int = 1234
    precision: str = "tf32"
    max_steps: int = 500000
    grad_accumulation: int = 1
    grad_clip: float = 0.0
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    log_interval: int = 10
    val_interval: int = 1000
    checkpoint_interval: int = 1000
    keep_last: int = 5
    on_nonfinite: str = "skip"
    spike_factor: float = 3.0
    dist_timeout_s: float = 600.0
    cudnn_benchmark: bool = True


SHARED_SECTIONS: dict[str, type] = {"audio": AudioConfig, "data": DataConfig, "train": TrainConfig}
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


class Config:
    """Checked configuration: one dataclass instance per section, reachable as attributes.

    ``cfg.audio``, ``cfg.data``, ``cfg.train`` and ``cfg.<model name>`` (e.g. ``cfg.waveglow``).
    """

    def __init__(self, sections: Mapping[str, Any]):
        self._sections = dict(sections)
        for name, value in self._sections.items():
            setattr(self, name, value)

    def section(self, name: str) -> Any:
        """The dataclass of section ``name``; raises :class:`ConfigError` if there is none."""
        if name not in self._sections:
            raise ConfigError(f"config has no section '{name}' (sections: {', '.join(self._sections)})")
        return self._sections[name]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain JSON-able dict (what checkpoints store; loads back with :func:`config_from_dict`)."""
        return {name: dataclasses.asdict(value) for name, value in self._sections.items()}


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _check_value(where: str, value: Any, expected: Any) -> Any:
    """Return ``value`` as ``expected`` (an int is accepted for a float) or raise ConfigError."""
    origin = typing.get_origin(expected) or expected
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        ok = False
    elif origin is list:
        (item_type,) = typing.get_args(expected) or (Any,)
        ok = isinstance(value, list)
        if ok and item_type is not Any:
            return [_check_value(f"{where}[{i}]", v, item_type) for i, v in enumerate(value)]
    else:
        ok = isinstance(value, origin)
    if not ok:
        name = getattr(expected, "__name__", str(expected))
        raise ConfigError(f"config key '{where}' must be {name}, got {type(value).__name__} {value!r}")
    return value


def _apply(where: str, raw: Mapping[str, Any], schemas: Mapping[str, type], into: dict) -> None:
    """Check the ``{section: {key: value}}`` mapping ``raw`` and write it over ``into``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a JSON object of sections, got {type(raw).__name__}")
    for section, values in raw.items():
        if section not in schemas:
            raise ConfigError(f"{where}: unknown section '{section}' (known: {', '.join(schemas)})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: section '{section}' must be an object, got {type(values).__name__}")
        types = _field_types(schemas[section])
        for key, value in values.items():
            if key not in types:
                raise ConfigError(
                    f"{where}: unknown key '{section}.{key}' (keys of '{section}': {', '.join(types)})")
            into.setdefault(section, {})[key] = _check_value(f"{section}.{key}", value, types[key])


def parse_override(text: str, schemas: Mapping[str, type]) -> tuple[str, str, Any]:
    """Parse one ``section.key=value`` override (values are JSON literals; strings may be bare).

    Raises:
        ConfigError: malformed text, unknown section or key, or a value of the wrong type.
    """
    name, sep, value_text = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set expects section.key=value, got '{text}'")
    if section not in schemas:
        raise ConfigError(f"--set {text}: unknown section '{section}' (known: {', '.join(schemas)})")
    types = _field_types(schemas[section])
    if key not in types:
        raise ConfigError(f"--set {text}: unknown key '{section}.{key}' (keys of '{section}': {', '.join(types)})")
    try:
        value = json.loads(value_text)
    except json.JSONDecodeError:
        value = value_text
    if types[key] is str and not isinstance(value, str):
        value = value_text
    return section, key, _check_value(f"{section}.{key}", value, types[key])


def build_config(raw: Mapping[str, Any], schemas: Mapping[str, type], *, tiny: bool = False,
                 overrides: typing.Sequence[str] = (), source: str = "config") -> Config:
    """Check ``raw`` against ``schemas``, apply the ``tiny`` block (if asked) then ``overrides``.

    Args:
        raw: the parsed config, ``{section: {key: value}, "tiny": {...}}``.
        schemas: section name -> dataclass (shared sections plus one per model).
        tiny: apply ``raw["tiny"]``.
        overrides: ``section.key=value`` strings, applied last.
        source: name used in error messages (the file path).

    Raises:
        ConfigError: unknown sections or keys, wrong types, bad precision, ``--tiny`` without a tiny block.
    """
    raw = dict(raw)
    tiny_block = raw.pop("tiny", None)
    values: dict[str, dict[str, Any]] = {}
    _apply(source, raw, schemas, values)
    if tiny_block is not None:
        checked: dict[str, dict[str, Any]] = {}
        _apply(f"{source} (tiny block)", tiny_block, schemas, checked)
        if tiny:
            for section, kv in checked.items():
                values.setdefault(section, {}).update(kv)
    elif tiny:
        raise ConfigError(f"{source}: --tiny given but the config has no 'tiny' block")
    for text in overrides:
        section, key, value = parse_override(text, schemas)
        values.setdefault(section, {})[key] = value
    sections = {name: cls(**values.get(name, {})) for name, cls in schemas.items()}
    train = sections["train"]
    for key, allowed in (("precision", PRECISIONS), ("lr_schedule", ("constant", "cosine")),
                         ("on_nonfinite", ("skip", "stop"))):
        if getattr(train, key) not in allowed:
            raise ConfigError(f"config key 'train.{key}' must be one of {', '.join(allowed)}, "
                              f"got '{getattr(train, key)}'")
    for key in ("max_steps", "grad_accumulation", "log_interval", "val_interval", "checkpoint_interval"):
        if getattr(train, key) < 1:
            raise ConfigError(f"config key 'train.{key}' must be >= 1, got {getattr(train, key)}")
    return Config(sections)


def load_config(path: str | Path, schemas: Mapping[str, type], *, tiny: bool = False,
                overrides: typing.Sequence[str] = ()) -> Config:
    """Read and check a JSON config file (see :func:`build_config`).

    Raises:
        ConfigError: the file is missing, not JSON, or fails the checks of :func:`build_config`.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    return build_config(raw, schemas, tiny=tiny, overrides=overrides, source=str(path))


def config_from_dict(data: Mapping[str, Any], schemas: Mapping[str, type]) -> Config:
    """Rebuild a :class:`Config` from :meth:`Config.to_dict` output (e.g. from a checkpoint)."""
    return build_config({k: v for k, v in data.items() if k in schemas}, schemas, source="checkpoint config")
