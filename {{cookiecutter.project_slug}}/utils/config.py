"""Configuration: read ``config.json``, apply the ``tiny`` block and ``--set`` overrides, check every key.

``config.json`` is a JSON object of sections. The shared sections are ``audio``, ``data`` and ``train``
(the dataclasses below); each model adds a section of its own, named after the model and described by the
model's dataclass (``models/<name>.py``). An optional ``tiny`` object holds overrides with the same shape
(``{"train": {...}, "<model>": {...}}``) that ``--tiny`` applies, for smoke runs on a CPU.

Every key is checked against its dataclass field, and an unknown section or key, a value of the wrong type,
or one outside its bounds is a :class:`ConfigError` whose one-line message names the key, the expected type
in words and where the value came from (the file, its tiny block, or the ``--set``). Keys left out take the
dataclass default.

Field types: ``bool``, ``int``, ``float`` (an int is accepted and becomes a float; a bool is never a
number; floats must be finite), ``str``, ``Literal["a", "b"]`` (or of ints), ``list[X]``, ``tuple[X, ...]``
and ``tuple[X, Y]`` (a JSON list, made a tuple), ``dict[str, X]`` (a JSON object), ``Optional[X]``,
``X | None`` and ``Union[X, Y]``, nested in any way (``Optional[list[int]]``, ``tuple[int, int] | None``).
Bounds are declared with the field, by :func:`setting` (``batch_size: int = setting(12, ge=1)``), and checked
for every section the same way; the audio settings are also checked against each other.

``--set section.key=value`` values are JSON literals (``3``, ``0.5``, ``false``, ``null``, ``[1, 2]``); where
the JSON reading does not fit the field and the field takes a string, the text itself is the string, so
words and paths need no quotes (``train.precision=bf16``, ``data.dataset_path=/data/ljs``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type or out of bounds."""


_BOUND_TESTS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le),
                "lt": ("<", operator.lt)}
"""Bound name (a keyword of :func:`setting`) -> (how messages write it, the test a value must pass)."""


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
            help: str | None = None) -> Any:
    """A config dataclass field with its bounds: ``batch_size: int = setting(12, ge=1)``.

    Args:
        default, default_factory: as for :func:`dataclasses.field`.
        ge, gt, le, lt: the value must be ``>=``, ``>``, ``<=``, ``<`` this number. Bounds apply to a number,
            to each number in a list, tuple or dict value, and not to ``None`` (of an ``Optional`` field)
            or to strings.
        help: what the setting means, kept in the field's metadata (``field.metadata["help"]``).

    Returns:
        A :class:`dataclasses.Field` whose ``metadata`` holds the bounds given (``{"ge": 1}``) and ``help``.
        It is typed ``Any``, as :func:`dataclasses.field` is, so that ``x: int = setting(...)`` type-checks.

    Raises:
        TypeError: a bound that is not a number.
        ValueError: ``default`` is outside the bounds, or both ``default`` and ``default_factory`` are given.
    """
    bounds = {name: bound for name, bound in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if bound is not None}
    for name, bound in bounds.items():
        if not _is_number(bound):
            raise TypeError(f"setting(): {name} must be a number, got {type(bound).__name__} {bound!r}")
    if default is not dataclasses.MISSING:
        for where, number in _numbers("the default", default):
            problem = _bound_problem(number, bounds)
            if problem:
                raise ValueError(f"setting(): {where} {problem}")
    metadata = {**bounds, **({"help": help} if help is not None else {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _item(where: str, key: int | str) -> str:
    """How messages name an item of a config value: ``toy.sizes[1]``, ``toy.weights["a"]``."""
    return f"{where}[{json.dumps(key)}]"


def _numbers(where: str, value: Any) -> typing.Iterator[tuple[str, float]]:
    """``(name, number)`` for ``value`` itself if it is a number, else for each number inside its lists,
    tuples and dicts (``toy.sizes[1]``, ``toy.weights["a"]``); ``None``, bools and strings give nothing."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _numbers(_item(where, i), item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _numbers(_item(where, key), item)
    elif _is_number(value):
        yield where, value


def _bound_problem(number: float, bounds: Mapping[str, Any]) -> str | None:
    """``"must be >= 1, got 0"`` for the first bound in ``bounds`` (a field's metadata) that ``number`` breaks."""
    for name, (symbol, holds) in _BOUND_TESTS.items():
        if name in bounds and not holds(number, bounds[name]):
            return f"must be {symbol} {bounds[name]}, got {number}"
    return None


@dataclasses.dataclass
class AudioConfig:
    """Signal settings shared by every model (NVIDIA's LJSpeech defaults).

    ``sampling_rate`` in Hz; ``n_fft``, ``hop_length`` and ``win_length`` in samples;
    ``fmin``/``fmax`` in Hz; ``max_wav_value`` is the full-scale value of 16-bit PCM.
    """

    sampling_rate: int = setting(22050, gt=0)
    n_fft: int = setting(1024, gt=0)
    hop_length: int = setting(256, gt=0)
    win_length: int = setting(1024, gt=0)
    n_mels: int = setting(80, gt=0)
    fmin: float = setting(0.0, ge=0)
    fmax: float = 8000.0
    max_wav_value: float = setting(32768.0, gt=0)


@dataclasses.dataclass
class DataConfig:
    """Where the corpus is and how it is loaded.

    ``dataset_path``: an LJSpeech-layout folder (``metadata.csv`` + ``wavs/``). ``training_files`` and
    ``validation_files``: optional NVIDIA-style filelists (``path|text``, paths relative to the dataset
    folder); when empty, ``metadata.csv`` is split and the last ``val_size`` utterances validate.
    ``num_workers`` DataLoader worker processes per rank, each keeping ``prefetch_factor`` batches ready;
    with ``persistent_workers`` they live for the whole run instead of starting anew every epoch (an epoch
    a dataset's items depend on must then reach them: :class:`utils.data_utils.SharedEpoch`).
    ``on_bad_clip``: what ``train.py``'s start-up check of the corpus does with bad clips and lines (a malformed
    or repeated metadata line, an empty transcript, a missing wav or a folder in its place, an unreadable,
    truncated or silent clip, one shorter than one STFT window, a transcript without a usable character):
    ``error`` names them all and stops before training, ``skip`` trains without them and lists them in
    ``OUTPUT/skipped_clips.txt``. ``exclude``: utterance ids to leave out (``skip`` adds the bad clips' ids
    for the run; a malformed line's id is ``metadata.csv:LINE``). ``batching``: how training utterances are grouped
    into batches: ``random`` (any lengths together, padded to the longest) or ``buckets`` (utterances of similar
    length together, :class:`utils.data_utils.LengthBucketSampler`, for a model whose items differ in length,
    ``ModelSpec.variable_length``); ``bucket_pool``: micro-batches sorted by length together. ``mel_dir``: a folder of
    mels to train a vocoder on instead of the mels of its audio (``<mel_dir>/<id>.pt``, ``(n_mels, frames)``, e.g.
    Tacotron2's teacher-forced mels from ``scripts/dump_gta_mels.py``); empty: mels computed from the audio.
    """

    dataset_path: str = "data/LJSpeech-1.1"
    training_files: str = ""
    validation_files: str = ""
    val_size: int = setting(100, ge=1)
    num_workers: int = setting(4, ge=0)
    prefetch_factor: int = setting(2, ge=1)
    persistent_workers: bool = True
    on_bad_clip: Literal["error", "skip"] = "error"
    exclude: list[str] = dataclasses.field(default_factory=list)
    batching: Literal["random", "buckets"] = "random"
    bucket_pool: int = setting(64, ge=1)
    mel_dir: str = ""


@dataclasses.dataclass
class TrainConfig:
    """The loop's settings. Intervals are in optimizer steps.

    ``seed``: at most ``2**31 - 1`` (NumPy takes seeds below ``2**32``, and each rank adds its rank).
    ``precision``: ``fp32`` | ``tf32`` | ``bf16`` | ``fp16`` (fp16 uses a GradScaler).
    ``grad_accumulation``: micro-batches per optimizer step (the effective batch is
    ``batch_size * grad_accumulation * world_size``). ``grad_clip``: max gradient norm, 0 disables.
    ``lr_schedule``: ``constant`` or ``cosine`` (to 1% at ``max_steps``), after ``warmup_steps`` of linear
    warm-up (a model with its own schedulers, ``ModelSpec.build_scheduler``, refuses both). ``on_nonfinite``: what
    a NaN/inf loss or gradient norm does: ``skip`` the step (counted) or ``stop`` the run. ``max_skips_in_a_row``:
    an optimizer whose update was skipped this many steps in a row (non-finite, spike, fp16 overflow) stops the run
    naming the last good checkpoint (0: never). ``spike_factor``: a step whose loss or gradient norm is above
    ``factor`` times the highest of the last 100 steps' (``utils.run_log.SpikeMonitor``; after ``spike_warmup``
    steps) is a spike, written with the batch's utterance ids to ``anomalies.jsonl`` (0 disables); ``on_spike``
    says what a spike then does: ``log`` it only, ``skip`` the step (no update, counted with the skipped steps) or
    ``stop`` the run naming the last good checkpoint. ``memory_imbalance``: a rank whose peak memory is this share
    above the ranks' median is named in a warning; ``straggler_share``: likewise for a rank's compute time per step
    against the other ranks' median, 3 log intervals in a row (CPU seconds when the ranks compute on the CPU).
    ``dist_timeout_s``: seconds a collective
    may wait for a hung rank before the run fails. ``cudnn_benchmark``: let cuDNN time its algorithms
    for each new input shape. ``compile``: train through the model's fast path
    (``ModelSpec.optimize_for_training``, e.g. ``torch.compile`` of the model's hot loop with static
    shapes); the same mathematics as the plain eager path, which
    ``false`` (the default) keeps for debugging. The first steps then include compilation (tens of
    seconds on a GPU).

    ``parallelism``: ``ddp`` (every rank holds the whole model, its gradients and optimizer state) or ``fsdp``
    (FSDP2: each rank holds ``1 / world_size`` of them, per block of ``ModelSpec.blocks``; with ``bf16`` the
    blocks compute in bf16 with fp32 master weights and fp32 gradient reduction; checkpoints are sharded folders
    written by every rank). ``reshard_after_forward``: FSDP frees a block's gathered weights after its forward
    (less memory, one more all-gather in the backward). ``activation_checkpointing``: ``none``, ``full`` (every
    block of ``ModelSpec.blocks`` recomputes its forward in the backward pass instead of keeping its
    activations) or ``selective`` (every ``activation_checkpointing_every``-th block). ``async_checkpoint``
    (``fsdp``): a checkpoint is copied to host memory and written in the background while training goes on.

    ``ema_decay``: keep an exponential moving average of the weights of the networks inference uses
    (``ModelSpec.inference_modules``; the whole model by default), ``ema = decay * ema + (1 - decay) * weights``
    after every real optimizer step (``utils.training.ema.EMA``); validation and inference use it, training goes on with
    the raw weights; 0 (the default) keeps none. Typical: 0.999 to 0.9999.
    """

    seed: int = setting(1234, ge=0, le=2**31 - 1)
    precision: Literal["fp32", "tf32", "bf16", "fp16"] = "tf32"
    max_steps: int = setting(500000, ge=1)
    grad_accumulation: int = setting(1, ge=1)
    grad_clip: float = setting(0.0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = setting(0, ge=0)
    log_interval: int = setting(10, ge=1)
    val_interval: int = setting(1000, ge=1)
    checkpoint_interval: int = setting(1000, ge=1)
    keep_last: int = setting(5, ge=0)
    on_nonfinite: Literal["skip", "stop"] = "skip"
    max_skips_in_a_row: int = setting(20, ge=0)
    spike_factor: float = setting(3.0, ge=0)
    spike_warmup: int = setting(20, ge=1)
    memory_imbalance: float = setting(0.2, gt=0)
    straggler_share: float = setting(0.2, gt=0)
    on_spike: Literal["log", "skip", "stop"] = "log"
    dist_timeout_s: float = setting(600.0, gt=0)
    cudnn_benchmark: bool = True
    compile: bool = False
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    reshard_after_forward: bool = True
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    activation_checkpointing_every: int = setting(2, ge=1)
    async_checkpoint: bool = False
    ema_decay: float = setting(0.0, ge=0, lt=1)


SHARED_SECTIONS: dict[str, type] = {"audio": AudioConfig, "data": DataConfig, "train": TrainConfig}


class Config:
    """Checked configuration: one dataclass instance per section, reachable as attributes.

    ``cfg.audio``, ``cfg.data``, ``cfg.train`` and ``cfg.<model name>`` (one per registered model).
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
        """Plain dict (what checkpoints store; loads back with :func:`config_from_dict`). Tuples stay tuples
        here and become lists in JSON; both load back as tuples."""
        return {name: dataclasses.asdict(value) for name, value in self._sections.items()}


# --- field types: naming them, and reading JSON values as them ---------------------------------------------

_UNIONS = (typing.Union, types.UnionType)
_NONE = type(None)
_SCALARS = (bool, int, float, str, _NONE)
_PLURALS = {bool: "bools", int: "ints", float: "floats", str: "strings"}


def _field_types(cls: type) -> dict[str, Any]:
    """Field name -> type, for the section dataclass ``cls``.

    Raises:
        TypeError: a field's type is not one this module reads (see the module docstring).
    """
    hints = typing.get_type_hints(cls)
    field_types = {field.name: hints[field.name] for field in dataclasses.fields(cls)}
    for name, tp in field_types.items():
        try:
            _describe(tp)
        except TypeError as err:
            raise TypeError(f"config field {cls.__name__}.{name}: {err}") from None
    return field_types


def _is_variadic(args: tuple) -> bool:
    """Whether the arguments of a ``tuple[...]`` are ``X, ...`` (any length)."""
    return len(args) == 2 and args[1] is Ellipsis


def _describe(tp: Any) -> str:
    """How error messages name the type ``tp``: ``int``, ``float or None``, ``one of a, b``, ``list[str]``
    (also ``tuple[str, ...]``), ``a list of 2 ints``, ``a list [int, str]``, ``an object {str: float}``.

    Raises:
        TypeError: ``tp`` is not a type this module reads.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _SCALARS:
        return "None" if tp is _NONE else tp.__name__
    if origin is Literal and all(isinstance(choice, (str, int)) or choice is None for choice in args):
        return f"one of {', '.join(str(choice) for choice in args)}"
    if origin in _UNIONS:
        return " or ".join(_describe(arg) for arg in sorted(args, key=lambda arg: arg is _NONE))
    if (origin is list and len(args) == 1) or (origin is tuple and _is_variadic(args)):
        return f"list[{_describe(args[0])}]"
    if origin is tuple:
        if args and len(set(args)) == 1 and args[0] in _PLURALS:
            return f"a list of {len(args)} {_PLURALS[args[0]] if len(args) > 1 else args[0].__name__}"
        return f"a list [{', '.join(_describe(arg) for arg in args)}]"
    if origin is dict and args[:1] == (str,):
        return "an object {str: " + _describe(args[1]) + "}"
    raise TypeError(f"type {tp!r} is not supported (use bool, int, float, str, Literal of strings or ints, "
                    f"list[X], tuple[X, ...], tuple[X, Y], dict[str, X], Optional or Union of these)")


def _fits(value: Any, tp: Any) -> bool:
    """Whether ``value`` has the shape ``tp`` reads, before any item of it is checked: the scalar type (an int
    fits a float, a bool fits neither), a member of a Literal, a list (of the length of a fixed tuple), an
    object."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return any(_fits(value, arg) for arg in args)
    if origin is Literal:
        return any(type(value) is type(choice) and value == choice for choice in args)
    if origin is tuple and not _is_variadic(args):
        return isinstance(value, (list, tuple)) and len(value) == len(args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, Mapping)
    if tp is float:
        return _is_number(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _takes_text(tp: Any) -> bool:
    """Whether ``tp`` takes some string: ``str``, a Literal with a string, a union with one of those."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return any(_takes_text(arg) for arg in args)
    if origin is Literal:
        return any(isinstance(choice, str) for choice in args)
    return tp is str


def _convert(where: str, value: Any, tp: Any) -> Any:
    """``value`` (as JSON gives it, or as :meth:`Config.to_dict` left it) as a value of ``tp``, the field
    type of config key ``where``: an int made a float, a list made a tuple, each item converted in turn.

    Raises:
        ConfigError: naming ``where`` (or the item of it, ``toy.names[1]``) and the expected type.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNIONS:
        return _convert_union(where, value, tp)
    if not _fits(value, tp):
        got = repr(value) if origin is Literal else f"{type(value).__name__} {value!r}"
        raise ConfigError(f"config key '{where}' must be {_describe(tp)}, got {got}")
    if tp is float:
        try:
            number = float(value)
        except OverflowError:  # an int beyond the range of a float
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"config key '{where}' must be a finite float, got {value!r}")
        return number
    if origin is list:
        return [_convert(_item(where, i), item, args[0]) for i, item in enumerate(value)]
    if origin is tuple:
        item_types = args[:1] * len(value) if _is_variadic(args) else args
        return tuple(_convert(_item(where, i), item, item_tp)
                     for i, (item, item_tp) in enumerate(zip(value, item_types)))
    if origin is dict:
        bad_keys = [key for key in value if not isinstance(key, str)]
        if bad_keys:
            raise ConfigError(f"config key '{where}' must be {_describe(tp)}, got the key {bad_keys[0]!r}")
        return {key: _convert(_item(where, key), item, args[1]) for key, item in value.items()}
    return value


def _convert_union(where: str, value: Any, tp: Any) -> Any:
    """:func:`_convert` for ``Union[...]``, ``Optional[...]`` and ``X | Y``.

    The members whose shape ``value`` fits are tried in their declared order, except that ``float`` comes
    after ``int`` (an int stays an int where the union takes both). Where only one member fits, its own
    error is given (the bad item of a list, a non-finite float); otherwise the error names the whole union.
    """
    candidates = sorted((arg for arg in typing.get_args(tp) if _fits(value, arg)), key=lambda arg: arg is float)
    if len(candidates) == 1:
        return _convert(where, value, candidates[0])
    for candidate in candidates:
        try:
            return _convert(where, value, candidate)
        except ConfigError:
            pass
    raise ConfigError(f"config key '{where}' must be {_describe(tp)}, got {type(value).__name__} {value!r}")


# --- building a Config ---------------------------------------------------------------------------------------

def _apply(where: str, raw: Mapping[str, Any], schemas: Mapping[str, type], into: dict) -> None:
    """Check the ``{section: {key: value}}`` mapping ``raw`` and write it over ``into``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a JSON object of sections, got {type(raw).__name__}")
    for section, values in raw.items():
        if section not in schemas:
            raise ConfigError(f"{where}: unknown section '{section}' (known: {', '.join(schemas)})")
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: section '{section}' must be an object, got {type(values).__name__}")
        field_types = _field_types(schemas[section])
        for key, value in values.items():
            if key not in field_types:
                raise ConfigError(
                    f"{where}: unknown key '{section}.{key}' (keys of '{section}': {', '.join(field_types)})")
            try:
                into.setdefault(section, {})[key] = _convert(f"{section}.{key}", value, field_types[key])
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None


def parse_override(text: str, schemas: Mapping[str, type]) -> tuple[str, str, Any]:
    """Parse one ``section.key=value`` override into ``(section, key, value)``.

    The value is read as a JSON literal (``null`` is ``None``, a list becomes a tuple for a tuple field).
    Where that fails, or gives a value the field does not take while the field takes a string (``str``,
    ``Optional[str]``, a Literal of strings), the text itself is the value: ``data.dataset_path=123`` is
    ``"123"``, ``train.precision=bf16`` is ``"bf16"``.

    Raises:
        ConfigError: malformed text, unknown section or key, or a value of the wrong type.
        TypeError: the section's dataclass has a field of a type this module does not read.
    """
    name, sep, value_text = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set expects section.key=value, got '{text}'")
    if section not in schemas:
        raise ConfigError(f"--set {text}: unknown section '{section}' (known: {', '.join(schemas)})")
    field_types = _field_types(schemas[section])
    if key not in field_types:
        raise ConfigError(
            f"--set {text}: unknown key '{section}.{key}' (keys of '{section}': {', '.join(field_types)})")
    tp = field_types[key]
    try:
        value = json.loads(value_text)
    except json.JSONDecodeError:
        value = value_text  # a bare word or path
    if not isinstance(value, str) and not _fits(value, tp) and _takes_text(tp):
        value = value_text  # e.g. a number or null for a string field: the text is meant
    try:
        return section, key, _convert(f"{section}.{key}", value, tp)
    except ConfigError as err:
        raise ConfigError(f"--set {text}: {err}") from None


def build_config(raw: Mapping[str, Any], schemas: Mapping[str, type], *, tiny: bool = False,
                 overrides: typing.Sequence[str] = (), source: str = "config") -> Config:
    """Check ``raw`` against ``schemas``, apply the ``tiny`` block (if asked) then ``overrides``.

    Args:
        raw: the parsed config, ``{section: {key: value}, "tiny": {...}}``.
        schemas: section name -> dataclass (shared sections plus one per model).
        tiny: apply ``raw["tiny"]``.
        overrides: ``section.key=value`` strings (see :func:`parse_override`), applied last.
        source: name used in error messages (the file path).

    Raises:
        ConfigError: unknown sections or keys, wrong types (a Literal's value not one of its choices
            included), a value out of its field's bounds (checked on the config as run, and on the config
            with the tiny block applied, so a broken tiny block is found without ``--tiny`` too), audio
            settings that contradict each other, ``--tiny`` without a tiny block.
        TypeError: a dataclass of ``schemas`` has a field of a type this module does not read (a mistake in
            the code, not in the config: found here whether or not the config sets that field).
    """
    for cls in schemas.values():  # a field type this module cannot read is found now, set or not
        _field_types(cls)
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


def _check_ranges(values: Mapping[str, Mapping[str, Any]], schemas: Mapping[str, type], origins: _Origins) -> dict:
    """Build one dataclass per section from ``values``, check every field against the bounds in its metadata
    (see :func:`setting`) and the audio settings against each other.

    Out-of-range values would fail later with a traceback deep inside PyTorch or librosa (a DataLoader with
    -1 workers, a zero timeout, a negative seed for NumPy), so they are refused here with the key named.

    Returns:
        section name -> dataclass instance.
    """
    sections = {name: cls(**values.get(name, {})) for name, cls in schemas.items()}

    def fail(keys: list[tuple[str, str]], message: str) -> None:
        raise ConfigError(f"{origins.label(*keys)}: {message}")

    for name, section in sections.items():
        for field in dataclasses.fields(section):
            for where, number in _numbers(f"{name}.{field.name}", getattr(section, field.name)):
                problem = _bound_problem(number, field.metadata)
                if problem:
                    fail([(name, field.name)], f"config key '{where}' {problem}")
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
        TypeError: as :func:`build_config` (a field type this module does not read).
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
    """Rebuild a :class:`Config` from :meth:`Config.to_dict` output (e.g. from a checkpoint), as it is or
    after a JSON round trip (lists become tuples again for tuple fields). Sections not in ``schemas`` (another
    model's) are left out.

    Raises:
        ConfigError: as :func:`build_config`, naming the ``checkpoint config`` (e.g. a key since removed).
        TypeError: as :func:`build_config`.
    """
    return build_config({k: v for k, v in data.items() if k in schemas}, schemas, source="checkpoint config")
