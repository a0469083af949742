"""Configuration: ``config.json``, its ``tiny`` block and ``--set`` overrides, every key checked. Each section is a
:class:`Section` (pydantic), read strictly as JSON gives it (an int is a float for a float field, a list a tuple; a
bool or a string is never a number; floats are finite); whatever is wrong is a one-line :class:`ConfigError` naming
where the value came from (the file, its tiny block, the ``--set``), the key, what it allows and the value given."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError


class ConfigError(ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type or out of bounds."""


_UNIONS = (typing.Union, types.UnionType)
_NONE = type(None)
_PLURALS = {bool: "bools", int: "ints", float: "floats", str: "strings"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}  # bound errors
_SHAPE = ("missing", "too_long", "too_short")  # a tuple[X, Y] of the wrong length: named before its items' errors


def _bare(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _members(tp: Any) -> list[Any]:
    """The types a union takes other than ``None``; ``[tp]`` for any other type."""
    tp = _bare(tp)
    return [_bare(arg) for arg in typing.get_args(tp) if arg is not _NONE] if typing.get_origin(tp) in _UNIONS else [tp]


def _describe(tp: Any) -> str:
    """How messages name ``tp``: ``int``, ``float or None``, ``one of a, b``, ``list[str]`` (``tuple[str, ...]`` too),
    ``a list of 2 ints``, ``a list [int, str]``, ``an object {str: float}``; TypeError for a type JSON cannot hold."""
    tp = _bare(tp)
    origin, args = typing.get_origin(tp), tuple(_bare(arg) for arg in typing.get_args(tp))
    if tp in (bool, int, float, str, _NONE):
        return "None" if tp is _NONE else tp.__name__
    if origin is Literal and all(isinstance(choice, (str, int)) for choice in args):
        return f"one of {', '.join(str(choice) for choice in args)}"
    if origin in _UNIONS:
        return " or ".join(_describe(arg) for arg in sorted(args, key=lambda arg: arg is _NONE))
    if (origin is list and len(args) == 1) or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return f"list[{_describe(args[0])}]"
    if origin is tuple and args:
        if len(set(args)) == 1 and args[0] in _PLURALS:
            return f"a list of {len(args)} {_PLURALS[args[0]] if len(args) > 1 else args[0].__name__}"
        return f"a list [{', '.join(_describe(arg) for arg in args)}]"
    if origin is dict and args[:1] == (str,):
        return "an object {str: " + _describe(args[1]) + "}"
    raise TypeError(f"type {tp!r} is not supported (use bool, int, float, str, Literal of strings or ints, "
                    f"list[X], tuple[X, ...], tuple[X, Y], dict[str, X], Optional or Union of these)")


def _bool_or_float_for_int_choice(tp: Any, value: Any) -> bool:
    """Whether ``value`` is ``true`` or ``1.0`` for a ``Literal[1, 2]`` field (pydantic, even strict, reads 1)."""
    members = _members(tp)
    return (len(members) == 1 and typing.get_origin(members[0]) is Literal and isinstance(value, (bool, float))
            and not any(type(choice) is type(value) for choice in typing.get_args(members[0])))


def _takes_text(tp: Any) -> bool:
    """Whether the field type ``tp`` takes some string."""
    return any(member is str or (typing.get_origin(member) is Literal
                                 and any(isinstance(choice, str) for choice in typing.get_args(member)))
               for member in _members(tp))


def _place(section: str, cls: type[Section], loc: tuple) -> tuple[str, Any]:
    """The key at pydantic's ``loc`` in ``section`` and its type: ``("toy.sizes[1]", int)``; a union is named whole."""
    where, tp = f"{section}.{loc[0]}", cls.model_fields[loc[0]].annotation
    for part in loc[1:]:
        members = _members(tp)
        origin, args = typing.get_origin(members[0]), typing.get_args(members[0])
        if len(members) > 1 or origin not in (list, tuple, dict):  # pydantic's tags of a union's members
            break
        tp = args[1] if origin is dict else args[0] if origin is list or args[-1] is Ellipsis else args[part]
        where += f"[{json.dumps(part)}]"
    return where, tp


def _explain(section: str, cls: type[Section], error: Mapping[str, Any]) -> str:
    """One pydantic error as the message's text: the key, what it allows, the value given."""
    kind, loc, value = error["type"], error["loc"], error["input"]
    if not loc:  # a check across keys (model_validator)
        return error["msg"] if kind == "cross_check" else f"section '{section}': {error['msg']}"
    where, tp = _place(section, cls, loc[:-1] if kind == "missing" else loc)  # missing: an item of a fixed tuple
    if kind in _BOUNDS:
        (bound,) = error["ctx"].values()  # {"gt": 0}
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        number = float(value) if float in _members(tp) and isinstance(value, int) else value
        return f"config key '{where}' must be {_BOUNDS[kind]} {bound}, got {number}"
    if kind == "finite_number":
        return f"config key '{where}' must be a finite float, got {value!r}"
    if kind.endswith("_type") or kind.startswith("int_parsing") or kind in ("literal_error", *_SHAPE):
        got = repr(value) if typing.get_origin(_bare(tp)) is Literal else f"{type(value).__name__} {value!r}"
        return f"config key '{where}' must be {_describe(tp)}, got {got}"
    return f"config key '{where}': {error['msg']}, got {value!r}"


def _read(cls: type[Section], values: Mapping[str, Any]) -> tuple[Optional[Section], list]:
    """``values`` read as ``cls`` through JSON text: ``(section, [])``, or ``(None, errors)`` with those pydantic lets
    pass (``true`` for ``Literal[1, 2]``) or cannot see (a set)."""
    found = []
    for key, value in values.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            found.append({"type": "json_type", "loc": (key,), "input": value})
        if _bool_or_float_for_int_choice(cls.model_fields[key].annotation, value):
            found.append({"type": "literal_error", "loc": (key,), "input": value})
    try:
        read = cls.model_validate_json(json.dumps(values))
    except ValidationError as err:
        return None, found + err.errors()
    except (TypeError, ValueError):  # json.dumps: found names the value
        return None, found
    return (None, found) if found else (read, [])


def _type_errors(errors: list, keys: typing.Iterable[str]) -> list:
    """The errors at one of ``keys`` but bounds, which wait for the config as run (a later layer may repair them)."""
    order = {key: i for i, key in enumerate(keys)}
    errors = [error for error in errors if error["loc"] and error["loc"][0] in order and error["type"] not in _BOUNDS]
    return sorted(errors, key=lambda error: (order[error["loc"][0]], error["type"] not in _SHAPE))


class Section(BaseModel):
    """A section of ``config.json``: its keys as fields with types, defaults, bounds (``Field(64, ge=1)``; per item
    through ``Annotated``), choices (``Literal``) and checks across keys (a ``model_validator`` raising
    :func:`cross_check_error`); mutable. Defining one raises TypeError for a field without a default or of a type JSON
    cannot hold, ValueError for a default that breaks its rules."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, validate_default=True)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name, field in cls.model_fields.items():
            if field.is_required():
                raise TypeError(f"config field {cls.__name__}.{name} needs a default (for a config that leaves it out)")
            try:
                _describe(field.annotation)
            except TypeError as err:
                raise TypeError(f"config field {cls.__name__}.{name}: {err}") from None
        errors = _read(cls, {})[1]
        if errors:
            raise ValueError(f"the defaults of {cls.__name__} break its rules: "
                             f"{_explain(cls.__name__, cls, errors[0])}")


class ModelSection(Section):
    """What every model's section holds: ``batch_size`` (items per process and micro-batch)."""

    batch_size: int = Field(16, ge=1)


SHARED_SECTION_NAMES = ("audio", "data", "train", "optimizer")
"""The sections every model reads (``parts.SHARED_SECTIONS``): names no model may take."""

MOVED: dict[str, str] = {"*.learning_rate": "optimizer.lr", "*.weight_decay": "optimizer.weight_decay",
                         "train.lr_schedule": "optimizer.schedule", "train.warmup_steps": "optimizer.warmup_steps"}
"""Keys an earlier version had, ``old -> new`` (``*``: a model's section): a config that gives an old one is refused
naming the new (:func:`refuse_moved`); a checkpoint's recorded config reads it as the new (:func:`read_moved`)."""


def cross_check_error(message: str, *keys: str) -> PydanticCustomError:
    """What a section's ``model_validator`` raises when ``keys`` contradict each other (``message`` names them)."""
    return PydanticCustomError("cross_check", "{message}", {"message": message, "keys": keys})


class Config:
    """Checked configuration: one :class:`Section` per section as attributes (``cfg.audio``)."""

    def __init__(self, sections: Mapping[str, Section]):
        self._sections = dict(sections)
        self.__dict__.update(self._sections)

    def section(self, name: str) -> Any:
        """The :class:`Section` named ``name``; raises :class:`ConfigError` if there is none."""
        if name not in self._sections:
            raise ConfigError(f"config has no section '{name}' (sections: {', '.join(self._sections)})")
        return self._sections[name]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain dict (what checkpoints store; :func:`config_from_dict` loads it back)."""
        return {name: value.model_dump() for name, value in self._sections.items()}

    def defaults(self) -> dict[str, dict[str, Any]]:
        """Each section's keys at their defaults, as :meth:`to_dict` gives values."""
        return {name: type(value)().model_dump() for name, value in self._sections.items()}

    def changed_since(self, before: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """``{section: {key: value}}``: the values that differ from ``before`` (an earlier :meth:`to_dict`)."""
        return {name: changed for name, values in self.to_dict().items()
                if (changed := {key: value for key, value in values.items() if before.get(name, {}).get(key) != value})}

    def apply(self, values: Any, source: str) -> list[tuple[str, Any, Any]]:
        """Set ``values`` (as :meth:`changed_since` gives them; ``source``: where they come from), each section checked
        whole before any value is set; returns ``(section.key, old, new)`` for each change. Raises ConfigError naming
        ``source`` for what is no such object, an unknown section or key, or a value that fails a check."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source} must be an object of sections, got {type(values).__name__}")
        schemas, read = {name: type(section) for name, section in self._sections.items()}, {}
        for name, keys in values.items():
            cls = _section_cls(source, schemas, name, keys)
            read[name], errors = _read(cls, {**self._sections[name].model_dump(), **keys})
            if errors:  # a key's own error first, then a check across keys
                raise ConfigError(f"{source}: {_explain(name, cls, min(errors, key=lambda error: not error['loc']))}")
        changed = []
        for name, keys in values.items():
            for key in keys:
                old, new = getattr(self._sections[name], key), getattr(read[name], key)
                if old != new:
                    changed.append((f"{name}.{key}", old, new))
                    setattr(self._sections[name], key, new)
        return changed


def _section_cls(label: str, schemas: Mapping[str, type[Section]], section: str, values: Any) -> type[Section]:
    """The class of ``section``, once it and the keys of ``values`` are known ones."""
    if section not in schemas:
        raise ConfigError(f"{label}: unknown section '{section}' (known: {', '.join(schemas)})")
    if not isinstance(values, Mapping):
        raise ConfigError(f"{label}: section '{section}' must be an object, got {type(values).__name__}")
    cls = schemas[section]
    for key in values:
        if key not in cls.model_fields:
            raise ConfigError(f"{label}: unknown key '{section}.{key}' (keys of '{section}': "
                              f"{', '.join(cls.model_fields)})")
    return cls


def _check_layer(label: str, block: Any, schemas: Mapping[str, type[Section]]) -> dict[str, dict[str, Any]]:
    """One layer (the file, its tiny block) checked by itself: known sections and keys, values of their types."""
    if not isinstance(block, Mapping):
        raise ConfigError(f"{label} must be a JSON object of sections, got {type(block).__name__}")
    for section, values in block.items():
        cls = _section_cls(label, schemas, section, values)
        errors = _type_errors(_read(cls, values)[1], values)
        if errors:
            raise ConfigError(f"{label}: {_explain(section, cls, errors[0])}")
    return {section: dict(values) for section, values in block.items()}


def parse_override(text: str, schemas: Mapping[str, type[Section]]) -> tuple[str, str, Any]:
    """One ``section.key=value`` as ``(section, key, value)``: a JSON literal, or the text itself where that fails or
    misfits a field that takes a string (``data.dataset_path=123`` is ``"123"``); bounds wait for :func:`build_config`.
    Raises ConfigError for malformed text, an unknown section or key, or a value of the wrong type."""
    name, sep, value_text = text.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set expects section.key=value, got '{text}'")
    label = f"--set {text}"
    cls = _section_cls(label, schemas, section, {key: None})
    try:
        value = json.loads(value_text)
    except json.JSONDecodeError:
        value = value_text  # a bare word or path
    read, errors = _read(cls, {key: value})
    if _type_errors(errors, [key]) and not isinstance(value, str) and _takes_text(cls.model_fields[key].annotation):
        value = value_text  # e.g. a number or null for a string field: the text is meant
        read, errors = _read(cls, {key: value})
    errors = _type_errors(errors, [key])
    if errors:
        raise ConfigError(f"{label}: {_explain(section, cls, errors[0])}")
    return section, key, getattr(read, key) if read is not None else value


def _assemble(schemas: Mapping[str, type[Section]], source: str, layers: list[tuple[str, Mapping]]) -> Config:
    """The config as run: ``layers`` (``(label, {section: {key: value}})``) in order over the defaults; an error names
    the layer its key came from (``source`` for a default)."""
    values, origins = {}, {}  # {section: {key: value}}, {(section, key): (layer's order, its label)}
    for order, (label, layer) in enumerate(layers):
        for section, kv in layer.items():
            values.setdefault(section, {}).update(kv)
            origins.update({(section, key): (order, label) for key in kv})
    sections, problems = {}, []
    for name, cls in schemas.items():
        sections[name], errors = _read(cls, values.get(name, {}))
        problems += [(name, cls, error) for error in errors]
    if problems:  # a key's own error first, then a check across keys
        name, cls, error = min(problems, key=lambda problem: not problem[2]["loc"])
        keys = error["loc"][:1] or error.get("ctx", {}).get("keys") or tuple(cls.model_fields)
        found = [origins[name, key] for key in keys if (name, key) in origins]
        raise ConfigError(f"{max(found)[1] if found else source}: {_explain(name, cls, error)}")
    return Config(sections)


def refuse_left_out(given: typing.Iterable[tuple[str, str]], left_out: Mapping[str, typing.Sequence[str]]) -> None:
    """One ConfigError naming every key of ``given`` (``(where, "section.key")``) of a part the project was generated
    without (``left_out``: ``parts.LEFT_OUT``), each with its part, and the ``cruft update`` that brings them back."""
    given = list(given)
    keys = {key for _, key in given}
    found = {part: [key for key in part_keys if key in keys] for part, part_keys in left_out.items()}
    found = {part: part_keys for part, part_keys in found.items() if part_keys}
    if not found:
        return
    places = list(dict.fromkeys(where for where, key in given if any(key in part_keys for part_keys in found.values())))
    named = "; ".join(f"{', '.join(part_keys)} ({part})" for part, part_keys in found.items())
    answers = json.dumps(dict.fromkeys(found, "yes"))
    raise ConfigError(f"{', '.join(places)}: keys of parts this project was generated without: {named}; leave them out, "
                      f"or bring the parts back with cruft update --variables-to-update '{answers}'")


def _moved_to(name: str, schemas: Mapping[str, type[Section]]) -> Optional[str]:
    """Where the key ``name`` moved (:data:`MOVED`), or None (a key its section declares, or one no version had)."""
    section, _, key = name.partition(".")
    if section not in schemas or key in schemas[section].model_fields:
        return None
    return MOVED.get(name) or (MOVED.get(f"*.{key}") if section not in SHARED_SECTION_NAMES else None)


def refuse_moved(given: typing.Iterable[tuple[str, str]], schemas: Mapping[str, type[Section]]) -> None:
    """One ConfigError naming every key of ``given`` that an earlier version had (:data:`MOVED`), with its new key."""
    found = [(where, name, new) for where, name in given if (new := _moved_to(name, schemas)) is not None]
    if not found:
        return
    moved: dict[str, dict[str, None]] = {}  # new key -> the old ones given, in their order
    for _, name, new in found:
        moved.setdefault(new, {})[name] = None
    said = "; ".join(f"{', '.join(olds)} moved to {new}" for new, olds in moved.items())
    places = ", ".join(dict.fromkeys(where for where, _, _ in found))
    raise ConfigError(f"{places}: {said} in this version (see CHANGELOG)")


def read_moved(config: Mapping[str, Any], model_name: Optional[str]) -> dict[str, Any]:
    """A checkpoint's recorded config with the keys an earlier version had (:data:`MOVED`) read as the new ones (model
    ``model_name``'s ``learning_rate`` as ``optimizer.lr``; another model's left out), unless it has the new section."""
    read = {name: dict(keys) if isinstance(keys, Mapping) else keys for name, keys in config.items()}
    for old, new in MOVED.items():
        (section, key), (new_section, new_key) = old.split("."), new.split(".")
        if new_section in config:
            continue
        owners = [name for name in read if name not in SHARED_SECTION_NAMES] if section == "*" else [section]
        values = {name: read[name].pop(key) for name in owners
                  if isinstance(read.get(name), dict) and key in read[name]}
        used = model_name if section == "*" else section  # the section whose value the run used
        if used in values:
            read.setdefault(new_section, {})[new_key] = values[used]
    return read


def _keys_given(label: str, block: Any) -> list[tuple[str, str]]:
    """``(label, "section.key")`` for each key of the layer ``block``."""
    if not isinstance(block, Mapping):
        return []
    return [(label, f"{section}.{key}") for section, values in block.items() if isinstance(values, Mapping)
            for key in values]


def build_config(raw: Mapping[str, Any], schemas: Mapping[str, type[Section]], *, tiny: bool = False,
                 overrides: typing.Sequence[str] = (), source: str = "config",
                 left_out: Optional[Mapping[str, typing.Sequence[str]]] = None) -> Config:
    """``raw`` (``{section: {key: value}, "tiny": {...}}``) checked against ``schemas``, with the tiny block if
    ``tiny``, then ``overrides``; ``source`` names the file. Raises ConfigError for keys of the parts ``left_out`` or
    of an earlier version (each all at once), unknown sections or keys, wrong types, values out of bounds or
    contradicting each other (the tiny block's too), ``--tiny`` without a tiny block."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source} must be a JSON object of sections, got {type(raw).__name__}")
    raw = dict(raw)
    tiny_block = raw.pop("tiny", None)
    given = [*_keys_given(source, raw), *_keys_given(f"{source} (tiny block)", tiny_block),
             *((f"--set {text}", text.partition("=")[0].strip()) for text in overrides)]
    refuse_left_out(given, left_out or {})
    refuse_moved(given, schemas)
    layers, label = [(source, _check_layer(source, raw, schemas))], f"{source} (tiny block)"
    tiny_layer = [] if tiny_block is None else [(label, _check_layer(label, tiny_block, schemas))]
    if tiny and not tiny_layer:
        raise ConfigError(f"{source}: --tiny given but the config has no 'tiny' block")
    parsed = [(text, parse_override(text, schemas)) for text in overrides]
    sets = [(f"--set {text}", {section: {key: value}}) for text, (section, key, value) in parsed]
    config = _assemble(schemas, source, layers + (tiny_layer if tiny else []) + sets)
    if tiny_layer and not tiny:  # a broken tiny block is reported now, not on the first --tiny run
        _assemble(schemas, source, layers + tiny_layer)
    return config


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s hook: a ConfigError naming the first key given twice."""
    keys = [key for key, _ in pairs]
    for i, key in enumerate(keys):
        if key in keys[:i]:
            raise ConfigError(f"key '{key}' appears twice in one object (JSON would keep only the last)")
    return dict(pairs)


def load_config(path: str | Path, schemas: Mapping[str, type[Section]], *, tiny: bool = False,
                overrides: typing.Sequence[str] = (), left_out: Optional[Mapping[str, typing.Sequence[str]]] = None
                ) -> Config:
    """A JSON config file, checked (:func:`build_config`). Raises ConfigError for a file missing or unreadable, not
    UTF-8 JSON, naming a key twice, or failing the checks."""
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
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return build_config(raw, schemas, tiny=tiny, overrides=overrides, source=str(path), left_out=left_out)


def config_from_dict(data: Mapping[str, Any], schemas: Mapping[str, type[Section]],
                     left_out: Optional[Mapping[str, typing.Sequence[str]]] = None,
                     model_name: Optional[str] = None) -> Config:
    """A :class:`Config` of :meth:`Config.to_dict`'s (a checkpoint's, of a run of ``model_name``; sections not in
    ``schemas`` left out, :func:`read_moved`). Raises ConfigError as :func:`build_config`, naming the checkpoint
    config."""
    return build_config({k: v for k, v in read_moved(data, model_name).items() if k in schemas}, schemas,
                        source="checkpoint config", left_out=left_out)
