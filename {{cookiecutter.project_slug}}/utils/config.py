"""Configuration: read ``config.json``, apply the ``tiny`` block and ``--set`` overrides, check every key.

``config.json`` is a JSON object of sections. The shared sections are ``audio``, ``data`` and ``train``
(the dataclasses below); each example model adds a section of its own, named after the model and
described by the model's dataclass in ``model.py``. An optional ``tiny`` object holds overrides with the
same shape (``{"train": {...}, "waveglow": {...}}``) that ``--tiny`` applies, for smoke runs on a CPU.

Every key is checked against its dataclass: an unknown section or key, a value of the wrong type, or one
outside its bounds or choices (e.g. ``train.keep_last >= 0``, ``train.precision`` in fp32/tf32/bf16/fp16) is a
:class:`ConfigError` whose one-line message names the key and where the value came from (the file, its tiny
block, or the ``--set``). Keys left out take the dataclass default.
"""

from __future__ import annotations

import dataclasses
import json
import math
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
    may wait for a hung rank before the run fails. ``cudnn_benchmark``: let cuDNN time its algorithms
    for each new input shape. ``compile``: train through the model's fast path
    (``ModelSpec.optimize_for_training`` in ``model.py``: ``torch.compile`` of the WaveGlow flow or of
    the Tacotron2 decoder step, with static shapes); the same mathematics as the plain eager path, which
    ``false`` (the default) keeps for debugging. The first steps then include compilation (tens of
    seconds on a GPU).
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
    compile: bool = False


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


def _type_name(expected: Any) -> str:
    """``int``, ``float``, ``list[str]``: how an expected type is named in error messages."""
    return str(expected) if typing.get_origin(expected) else getattr(expected, "__name__", str(expected))


def _check_value(where: str, value: Any, expected: Any) -> Any:
    """Return ``value`` as ``expected`` (an int is accepted for a float) or raise ConfigError.

    A bool is not accepted for an int (JSON ``true`` is not 1 here), and a float must be finite.
    """
    origin = typing.get_origin(expected) or expected
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{where}' must be a finite float, got {value!r}")
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
        raise ConfigError(f"config key '{where}' must be {_type_name(expected)}, got {type(value).__name__} {value!r}")
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
            try:
                into.setdefault(section, {})[key] = _check_value(f"{section}.{key}", value, types[key])
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None


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
    try:
        return section, key, _check_value(f"{section}.{key}", value, types[key])
    except ConfigError as err:
        raise ConfigError(f"--set {text}: {err}") from None


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
        ConfigError: unknown sections or keys, wrong types, a value out of its bounds or not one of its
            choices (checked on the config as run, and on the config with the tiny block applied, so
            a broken tiny block is found without ``--tiny`` too), ``--tiny`` without a tiny block.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source} must be a JSON object of sections, got {type(raw).__name__}")
    raw = dict(raw)
    tiny_block = raw.pop("tiny", None)
    values: dict[str, dict[str, Any]] = {}
    _apply(source, raw, schemas, values)
    origins = _Origins({(section, key): (0, source) for section, kv in values.items() for key in kv}, source)
    tiny_values = None
    if tiny_block is not None:
        checked: dict[str, dict[str, Any]] = {}
        label = f"{source} (tiny block)"
        _apply(label, tiny_block, schemas, checked)
        tiny_values, tiny_origins = _merge(values, checked), origins.add(checked, 1, label)
        if tiny:
            values, origins = tiny_values, tiny_origins
    elif tiny:
        raise ConfigError(f"{source}: --tiny given but the config has no 'tiny' block")
    for text in overrides:
        section, key, value = parse_override(text, schemas)
        values.setdefault(section, {})[key] = value
        origins = origins.add({section: {key: value}}, 2, f"--set {text}")
    sections = _check_ranges(values, schemas, origins)
    if tiny_values is not None and not tiny:  # a broken tiny block is reported now, not on the first --tiny run
        _check_ranges(tiny_values, schemas, tiny_origins)
    return Config(sections)


class _Origins:
    """Where each set value came from (the file, its tiny block, a ``--set``), to name it in range errors."""

    def __init__(self, table: dict[tuple[str, str], tuple[int, str]], source: str):
        self.table, self.source = table, source

    def add(self, values: Mapping[str, Mapping[str, Any]], layer: int, label: str) -> "_Origins":
        """A copy with the keys of ``values`` coming from ``label`` (``layer``: 0 file, 1 tiny, 2 --set)."""
        table = dict(self.table)
        table.update({(section, key): (layer, label) for section, kv in values.items() for key in kv})
        return _Origins(table, self.source)

    def label(self, *keys: tuple[str, str]) -> str:
        """The origin of the most recently applied of ``keys``; the file when none was set (a default)."""
        found = [self.table[k] for k in keys if k in self.table]
        return max(found)[1] if found else self.source


def _merge(values: Mapping[str, Mapping[str, Any]], over: Mapping[str, Mapping[str, Any]]) -> dict:
    """``values`` with the keys of ``over`` written over them (section by section; inputs unchanged)."""
    merged = {section: dict(kv) for section, kv in values.items()}
    for section, kv in over.items():
        merged.setdefault(section, {}).update(kv)
    return merged


# Bounds every config must keep: (section, key, lowest, lowest allowed itself?). Values outside them fail
# later with a traceback deep inside PyTorch or librosa (a DataLoader with -1 workers, a zero timeout, a
# negative seed for NumPy), so they are refused here with the key named.
_BOUNDS = (
    ("audio", "sampling_rate", 0, False), ("audio", "n_fft", 0, False), ("audio", "hop_length", 0, False),
    ("audio", "win_length", 0, False), ("audio", "n_mels", 0, False), ("audio", "fmin", 0, True),
    ("audio", "max_wav_value", 0, False),
    ("data", "val_size", 1, True), ("data", "num_workers", 0, True), ("data", "prefetch_factor", 1, True),
    ("train", "seed", 0, True), ("train", "max_steps", 1, True), ("train", "grad_accumulation", 1, True),
    ("train", "grad_clip", 0, True), ("train", "warmup_steps", 0, True), ("train", "log_interval", 1, True),
    ("train", "val_interval", 1, True), ("train", "checkpoint_interval", 1, True), ("train", "keep_last", 0, True),
    ("train", "spike_factor", 0, True), ("train", "dist_timeout_s", 0, False),
)
# The fields every model section has (the training loop reads them), bounded the same way.
_MODEL_BOUNDS = (("batch_size", 1, True), ("learning_rate", 0, False), ("weight_decay", 0, True))
_MAX_SEED = 2**31 - 1  # NumPy takes seeds below 2**32; each rank adds its rank to the seed


def _check_ranges(values: Mapping[str, Mapping[str, Any]], schemas: Mapping[str, type], origins: _Origins) -> dict:
    """Build one dataclass per section from ``values`` and check enums, bounds and the audio settings.

    Returns:
        section name -> dataclass instance.
    """
    sections = {name: cls(**values.get(name, {})) for name, cls in schemas.items()}

    def fail(keys: list[tuple[str, str]], message: str) -> None:
        raise ConfigError(f"{origins.label(*keys)}: {message}")

    bounds = [b for b in _BOUNDS if b[0] in sections]
    bounds += [(name, key, low, inclusive) for name in sections if name not in SHARED_SECTIONS
               for key, low, inclusive in _MODEL_BOUNDS if hasattr(sections[name], key)]
    for section, key, low, inclusive in bounds:
        value = getattr(sections[section], key)
        if value < low or (value == low and not inclusive):
            fail([(section, key)], f"config key '{section}.{key}' must be {'>=' if inclusive else '>'} {low}, "
                                   f"got {value}")
    if "train" in sections:
        train = sections["train"]
        for key, allowed in (("precision", PRECISIONS), ("lr_schedule", ("constant", "cosine")),
                             ("on_nonfinite", ("skip", "stop"))):
            if getattr(train, key) not in allowed:
                fail([("train", key)], f"config key 'train.{key}' must be one of {', '.join(allowed)}, "
                                       f"got '{getattr(train, key)}'")
        if train.seed > _MAX_SEED:
            fail([("train", "seed")], f"config key 'train.seed' must be <= {_MAX_SEED}, got {train.seed}")
    if "audio" in sections:
        audio = sections["audio"]
        for key in ("win_length", "hop_length"):
            if getattr(audio, key) > audio.n_fft:
                fail([("audio", key), ("audio", "n_fft")],
                     f"config key 'audio.{key}' ({getattr(audio, key)}) must not exceed audio.n_fft ({audio.n_fft})")
        if not audio.fmin < audio.fmax <= audio.sampling_rate / 2:
            fail([("audio", "fmin"), ("audio", "fmax"), ("audio", "sampling_rate")],
                 f"config keys 'audio.fmin' and 'audio.fmax' must satisfy fmin < fmax <= sampling_rate / 2, "
                 f"got fmin={audio.fmin}, fmax={audio.fmax}, sampling_rate={audio.sampling_rate}")
    return sections


class _DuplicateKey(Exception):
    """A JSON object names a key twice (raised while parsing, turned into a ConfigError)."""


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def load_config(path: str | Path, schemas: Mapping[str, type], *, tiny: bool = False,
                overrides: typing.Sequence[str] = ()) -> Config:
    """Read and check a JSON config file (see :func:`build_config`).

    Raises:
        ConfigError: the file is missing or unreadable, not UTF-8 JSON, names a key twice in one object, or
            fails the checks of :func:`build_config`.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=_no_duplicate_keys)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as err:  # a folder, no permission
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text ({err})") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    except _DuplicateKey as err:
        raise ConfigError(f"{path}: key '{err}' appears twice in one object (JSON would keep only the last)") from None
    return build_config(raw, schemas, tiny=tiny, overrides=overrides, source=str(path))


def config_from_dict(data: Mapping[str, Any], schemas: Mapping[str, type]) -> Config:
    """Rebuild a :class:`Config` from :meth:`Config.to_dict` output (e.g. from a checkpoint)."""
    return build_config({k: v for k, v in data.items() if k in schemas}, schemas, source="checkpoint config")
