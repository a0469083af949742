"""Tests of utils/config.py: every bad key or value is refused with a ConfigError that names it."""

import dataclasses
import json
import subprocess
import sys
from typing import Annotated, Literal, Optional, Union

import annotated_types
import pytest
from conftest import ROOT
from pydantic import Field, ValidationError

from model import BatchFrames
from models import MODELS, registry
from parts import SHARED_SECTIONS, TrainConfig, config_schemas
from utils.config import SHARED_SECTION_NAMES, Config, ConfigError, ModelSection, Section, build_config, config_from_dict, load_config, parse_override, read_moved
from utils.data.audio import AudioConfig
from utils.data.corpus import DataConfig
from utils.training.recipe import apply_recipe
from utils.training.setup import recipe_line

Count = Annotated[int, Field(ge=1)]
"""An int >= 1: the bound of each item of a list or tuple."""


class ToyModelConfig(Section):
    """A model section as a model declares one (independent of the example models), with a field of each type
    form the config reads and bounds declared with ``Field`` (on the field, or on each item through ``Annotated``)."""

    width: int = 8
    names: list[str] = Field(default_factory=lambda: ["a"])
    batch_size: int = Field(4, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    scale: Optional[float] = Field(None, gt=0, le=10)
    gain: float | None = None
    dims: tuple[Count, ...] = (2, 2)
    size: tuple[int, int] = (3, 4)
    pair: tuple[int, str] = (1, "a")
    sizes: list[Count] = Field(default_factory=lambda: [1])
    mode: Literal["a", "b"] = "a"
    level: Literal[1, 2] = 1
    weights: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    crop: Optional[list[int]] = None
    window: tuple[int, int] | None = None
    label: Optional[str] = None
    either: Union[int, str] = 0


SCHEMAS = {**SHARED_SECTIONS, "toy": ToyModelConfig}


def build(raw=None, **kwargs):
    return build_config(raw or {}, SCHEMAS, **kwargs)


def shape(value):
    """``value`` with every item replaced by its type (containers keep theirs): to tell 2 from 2.0, [1] from (1,)."""
    if isinstance(value, (list, tuple)):
        return type(value), [shape(item) for item in value]
    if isinstance(value, dict):
        return dict, {key: shape(item) for key, item in value.items()}
    return type(value)


# --- keys and sections ------------------------------------------------------------------------------------

def test_left_out_keys_take_the_section_defaults():
    cfg = build({"train": {"max_steps": 7}})
    assert cfg.train.max_steps == 7
    assert cfg.train.seed == TrainConfig().seed and cfg.audio == AudioConfig()
    assert cfg.section("toy") is cfg.toy and cfg.toy.width == 8


def test_unknown_section_is_named_with_the_known_ones():
    with pytest.raises(ConfigError,
                       match=r"^config: unknown section 'trian' \(known: audio, data, train, optimizer, toy\)$"):
        build({"trian": {"max_steps": 1}})
    with pytest.raises(ConfigError, match="config has no section 'nope'"):
        build().section("nope")


def test_unknown_key_is_named_with_its_section_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'train\.max_step' \(keys of 'train': seed, precision"):
        build({"train": {"max_step": 1}})
    with pytest.raises(ConfigError, match=r"unknown key 'toy\.depth' \(keys of 'toy': width, names, batch_size"):
        build({"toy": {"depth": 1}})


class Plain(ModelSection):
    """A model's section as this version declares one: no optimizer setting of its own."""

    width: int = Field(8, ge=1)


def test_keys_an_earlier_version_had_are_refused_together_each_naming_its_new_key():
    """A model section's ``learning_rate`` and ``weight_decay`` and ``train.lr_schedule`` and ``warmup_steps`` moved
    to the ``optimizer`` section: wherever a config gives them (the file, its tiny block, ``--set``), one line names
    each with its new key; a model whose section declares such a key of its own keeps it."""
    schemas = {**SHARED_SECTIONS, "plain": Plain, "other": Plain}
    raw = {"train": {"lr_schedule": "cosine", "seed": 3}, "plain": {"learning_rate": 1e-3, "weight_decay": 0.0},
           "tiny": {"other": {"learning_rate": 1e-2}}}
    with pytest.raises(ConfigError) as info:
        build_config(raw, schemas, source="old.json", overrides=["train.warmup_steps=5", "plain.width=4"])
    assert str(info.value) == (
        "old.json, old.json (tiny block), --set train.warmup_steps=5: train.lr_schedule moved to optimizer.schedule; "
        "plain.learning_rate, other.learning_rate moved to optimizer.lr; plain.weight_decay moved to "
        "optimizer.weight_decay; train.warmup_steps moved to optimizer.warmup_steps in this version (see CHANGELOG)")
    assert build({"toy": {"learning_rate": 0.5}}).toy.learning_rate == 0.5  # toy declares its own


def test_a_checkpoints_config_of_an_earlier_version_reads_its_moved_keys_as_the_new_ones():
    """A checkpoint written before the ``optimizer`` section recorded its run's rate in its model's section (every
    model's section had one) and the schedule in ``train``: read back, they are the ``optimizer`` section's, so that a
    resume names no change and ``inference.py`` loads it; a config of this version keeps its keys."""
    schemas = {**SHARED_SECTIONS, "plain": Plain, "other": Plain}
    now = build_config({"optimizer": {"lr": 2e-4, "weight_decay": 0.01, "schedule": "cosine", "warmup_steps": 3}},
                       schemas).to_dict()
    old = {name: dict(keys) for name, keys in now.items() if name != "optimizer"}  # as the earlier version wrote it
    old["train"].update(lr_schedule="cosine", warmup_steps=3)
    old["plain"].update(learning_rate=1e-3, weight_decay=0.0)  # another model's, which the run did not use
    old["other"].update(learning_rate=2e-4, weight_decay=0.01)
    assert config_from_dict(old, schemas, model_name="other").to_dict() == now
    assert read_moved(now, "other") == now and read_moved(old, "other") == now


def test_a_section_that_is_not_an_object_is_refused():
    with pytest.raises(ConfigError, match="section 'train' must be an object, got list"):
        build({"train": [1, 2]})
    with pytest.raises(ConfigError, match="must be a JSON object of sections, got list"):
        build_config([1, 2], SCHEMAS)


# --- types ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("section, key, value, message", [
    ("train", "max_steps", "abc", "config key 'train.max_steps' must be int, got str 'abc'"),
    ("train", "max_steps", 2.5, "config key 'train.max_steps' must be int, got float 2.5"),
    ("train", "max_steps", True, "config key 'train.max_steps' must be int, got bool True"),
    ("train", "cudnn_benchmark", 1, "config key 'train.cudnn_benchmark' must be bool or None, got int 1"),
    ("train", "grad_clip", "x", "config key 'train.grad_clip' must be float or None, got str 'x'"),
    ("train", "spike_factor", None, "config key 'train.spike_factor' must be float, got NoneType None"),
    ("data", "dataset_path", 5, "config key 'data.dataset_path' must be str, got int 5"),
    ("toy", "names", "a", "config key 'toy.names' must be list[str], got str 'a'"),
    ("toy", "names", ["a", 1], "config key 'toy.names[1]' must be str, got int 1"),
])
def test_wrong_type_is_named_with_the_expected_type(section, key, value, message):
    with pytest.raises(ConfigError) as info:
        build({section: {key: value}}, source="my.json")
    assert str(info.value) == f"my.json: {message}"


def test_an_int_is_accepted_for_a_float_and_becomes_one():
    cfg = build({"train": {"grad_clip": 1}, "toy": {"learning_rate": 1}})
    assert cfg.train.grad_clip == 1.0 and type(cfg.train.grad_clip) is float
    assert type(cfg.toy.learning_rate) is float


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_refused(value):
    with pytest.raises(ConfigError, match="'train.grad_clip' must be a finite float"):
        build({"train": {"grad_clip": value}})


# --- type forms: Optional, X | None, Union, tuple, list, Literal, dict, nested ------------------------------

TYPE_FORMS = [  # (key, JSON value, the Python value the field gets)
    ("scale", 0.5, 0.5),                            # Optional[float]
    ("scale", 2, 2.0),
    ("scale", None, None),
    ("gain", 1, 1.0),                               # float | None
    ("gain", None, None),
    ("dims", [1, 2, 3], (1, 2, 3)),                 # tuple[int, ...]
    ("dims", [], ()),
    ("size", [5, 6], (5, 6)),                       # tuple[int, int]
    ("pair", [2, "b"], (2, "b")),                   # tuple[int, str]
    ("sizes", [3, 4], [3, 4]),                      # list[int]
    ("mode", "b", "b"),                             # Literal["a", "b"]
    ("level", 2, 2),                                # Literal[1, 2]
    ("weights", {"x": 1, "y": 0.5}, {"x": 1.0, "y": 0.5}),  # dict[str, float]
    ("crop", [1, 2], [1, 2]),                       # Optional[list[int]]
    ("crop", None, None),
    ("window", [4, 8], (4, 8)),                     # tuple[int, int] | None
    ("window", None, None),
    ("label", "hi", "hi"),                          # Optional[str]
    ("label", None, None),
    ("either", 3, 3),                               # Union[int, str]
    ("either", "x", "x"),
]


@pytest.mark.parametrize("key, value, expected", TYPE_FORMS)
def test_each_type_form_reads_from_a_json_file(tmp_path, key, value, expected):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"toy": {key: value}}))
    got = getattr(load_config(path, SCHEMAS).toy, key)
    assert got == expected and shape(got) == shape(expected)


@pytest.mark.parametrize("key, value, expected", TYPE_FORMS)
def test_each_type_form_reads_from_set(key, value, expected):
    text = f"toy.{key}={json.dumps(value)}"
    assert parse_override(text, SCHEMAS) == ("toy", key, expected)
    got = getattr(build(overrides=[text]).toy, key)
    assert got == expected and shape(got) == shape(expected)


@pytest.mark.parametrize("text, expected", [
    ("toy.scale=null", None),          # null is None where the field takes None ...
    ("toy.label=null", None),
    ("toy.label=hi there", "hi there"),  # ... and a bare text is a string where the field takes one
    ("toy.label=123", "123"),
    ('toy.label="null"', "null"),
    ("toy.mode=b", "b"),
    ("toy.either=x", "x"),
    ("toy.either=7", 7),
    ("toy.either=2.5", "2.5"),         # a float is no int: the string is meant
])
def test_set_reads_null_and_bare_strings_by_the_field_type(text, expected):
    _, _, value = parse_override(text, SCHEMAS)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("key, value, message", [
    ("scale", "x", "config key 'toy.scale' must be float or None, got str 'x'"),
    ("scale", True, "config key 'toy.scale' must be float or None, got bool True"),
    ("scale", float("inf"), "config key 'toy.scale' must be a finite float, got inf"),
    ("gain", [1], "config key 'toy.gain' must be float or None, got list [1]"),
    ("dims", 3, "config key 'toy.dims' must be list[int], got int 3"),
    ("dims", [1, "a"], "config key 'toy.dims[1]' must be int, got str 'a'"),
    ("size", [1, 2, 3], "config key 'toy.size' must be a list of 2 ints, got list [1, 2, 3]"),
    ("size", [1, 2.5], "config key 'toy.size[1]' must be int, got float 2.5"),
    ("pair", [1], "config key 'toy.pair' must be a list [int, str], got list [1]"),
    ("pair", [1, 2], "config key 'toy.pair[1]' must be str, got int 2"),
    ("sizes", [1, True], "config key 'toy.sizes[1]' must be int, got bool True"),
    ("mode", "c", "config key 'toy.mode' must be one of a, b, got 'c'"),
    ("level", 3, "config key 'toy.level' must be one of 1, 2, got 3"),
    ("level", True, "config key 'toy.level' must be one of 1, 2, got True"),
    ("level", "1", "config key 'toy.level' must be one of 1, 2, got '1'"),
    ("level", 1.0, "config key 'toy.level' must be one of 1, 2, got 1.0"),
    ("weights", [1], "config key 'toy.weights' must be an object {str: float}, got list [1]"),
    ("weights", {"x": "y"}, "config key 'toy.weights[\"x\"]' must be float, got str 'y'"),
    ("crop", "a", "config key 'toy.crop' must be list[int] or None, got str 'a'"),
    ("crop", [1, "a"], "config key 'toy.crop[1]' must be int, got str 'a'"),
    ("window", [1], "config key 'toy.window' must be a list of 2 ints or None, got list [1]"),
    ("window", [1, None], "config key 'toy.window[1]' must be int, got NoneType None"),
    ("label", 5, "config key 'toy.label' must be str or None, got int 5"),
    ("either", 2.5, "config key 'toy.either' must be int or str, got float 2.5"),
    ("either", None, "config key 'toy.either' must be int or str, got NoneType None"),
])
def test_wrong_value_of_a_type_form_is_one_line_naming_the_type(key, value, message):
    with pytest.raises(ConfigError) as info:
        build({"toy": {key: value}}, source="my.json")
    assert str(info.value) == f"my.json: {message}"


@pytest.mark.parametrize("text, message", [
    ("toy.scale=x", "config key 'toy.scale' must be float or None, got str 'x'"),
    ("toy.scale=1e999", "config key 'toy.scale' must be a finite float, got inf"),
    ("toy.gain=true", "config key 'toy.gain' must be float or None, got bool True"),
    ('toy.dims=[1, "a"]', "config key 'toy.dims[1]' must be int, got str 'a'"),
    ("toy.dims=1,2", "config key 'toy.dims' must be list[int], got str '1,2'"),
    ("toy.size=[1,2,3]", "config key 'toy.size' must be a list of 2 ints, got list [1, 2, 3]"),
    ("toy.mode=c", "config key 'toy.mode' must be one of a, b, got 'c'"),
    ("toy.mode=null", "config key 'toy.mode' must be one of a, b, got 'null'"),
    ("toy.level=3", "config key 'toy.level' must be one of 1, 2, got 3"),
    ("toy.level=one", "config key 'toy.level' must be one of 1, 2, got 'one'"),
    ("toy.level=true", "config key 'toy.level' must be one of 1, 2, got True"),
    ('toy.weights={"x": "y"}', "config key 'toy.weights[\"x\"]' must be float, got str 'y'"),
    ("toy.crop=a", "config key 'toy.crop' must be list[int] or None, got str 'a'"),
    ("toy.window=[1]", "config key 'toy.window' must be a list of 2 ints or None, got list [1]"),
])
def test_bad_set_of_a_type_form_is_one_line_naming_the_type(text, message):
    with pytest.raises(ConfigError) as info:
        build(overrides=[text])
    assert str(info.value) == f"--set {text}: {message}"


def test_a_python_value_json_cannot_hold_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"^config: config key 'data.exclude' must be list\[str\], got set \{'a'\}$"):
        build({"data": {"exclude": {"a"}}})


def test_a_huge_int_for_a_float_is_refused_as_not_finite():
    with pytest.raises(ConfigError, match=r"config key 'toy.scale' must be a finite float, got 1000"):
        build({"toy": {"scale": 10**400}})


def test_a_field_type_the_config_cannot_read_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"^config field Odd.tags: type set\[str\] is not supported"):
        class Odd(Section):  # found when the class is defined, whether or not a config sets the field
            tags: set[str] = Field(default_factory=set)
    with pytest.raises(TypeError, match=r"^config field NoDefault.width needs a default"):
        class NoDefault(Section):
            width: int


# --- --set overrides --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("train.max_steps=3", 3),
    ("train.max_steps= 3", 3),
    ("train.grad_clip=0.5", 0.5),
    ("train.grad_clip=2", 2.0),
    ("train.cudnn_benchmark=false", False),
    ("train.precision=bf16", "bf16"),          # a bare string
    ('train.precision="fp16"', "fp16"),        # a JSON string
    ("data.dataset_path=123", "123"),          # looks like a number, but the key is a string
    ("data.dataset_path=null", "null"),
    ("data.dataset_path=/a b/c=d", "/a b/c=d"),  # only the first '=' splits
    ("data.training_files=", ""),
    ('toy.names=["x", "y"]', ["x", "y"]),
])
def test_set_parses_json_literals_and_bare_strings(text, expected):
    section, key, value = parse_override(text, SCHEMAS)
    assert f"{section}.{key}" == text.split("=")[0].strip()
    assert value == expected and type(value) is type(expected)
    assert getattr(build(overrides=[text]).section(section), key) == expected


@pytest.mark.parametrize("text, message", [
    ("train.max_steps", "--set expects section.key=value, got 'train.max_steps'"),
    ("max_steps=3", "--set expects section.key=value, got 'max_steps=3'"),
    ("train.=3", "--set expects section.key=value, got 'train.=3'"),
    ("trian.max_steps=3", "--set trian.max_steps=3: unknown section 'trian' (known: audio, data, train, optimizer, "
                          "toy)"),
    ("train.nope=3", "--set train.nope=3: unknown key 'train.nope' (keys of 'train': seed, precision,"),
    ("train.max_steps=abc", "--set train.max_steps=abc: config key 'train.max_steps' must be int, got str 'abc'"),
    ("train.cudnn_benchmark=True", "config key 'train.cudnn_benchmark' must be bool or None, got str 'True'"),
    ("toy.names=x", "config key 'toy.names' must be list[str], got str 'x'"),
    ("train.grad_clip=1e999", "config key 'train.grad_clip' must be a finite float, got inf"),
])
def test_bad_set_is_named(text, message):
    with pytest.raises(ConfigError) as info:
        build(overrides=[text])
    assert str(info.value).startswith(message if message.startswith("--set") else f"--set {text}: {message}"), \
        str(info.value)


def test_overrides_apply_last_and_in_order():
    raw = {"train": {"max_steps": 5}, "tiny": {"train": {"max_steps": 6}}}
    cfg = build(raw, tiny=True, overrides=["train.max_steps=7", "train.max_steps=8"])
    assert cfg.train.max_steps == 8


# --- the tiny block ---------------------------------------------------------------------------------------

def test_tiny_block_applies_only_with_tiny():
    raw = {"train": {"max_steps": 100, "seed": 3}, "tiny": {"train": {"max_steps": 2}, "toy": {"width": 2}}}
    plain, tiny = build(raw), build(raw, tiny=True)
    assert (plain.train.max_steps, plain.toy.width) == (100, 8)
    assert (tiny.train.max_steps, tiny.toy.width, tiny.train.seed) == (2, 2, 3)
    assert raw["tiny"] == {"train": {"max_steps": 2}, "toy": {"width": 2}}, "the input is left as it was"


@pytest.mark.parametrize("tiny_block, message", [
    ({"train": {"max_steps": "2"}}, "my.json (tiny block): config key 'train.max_steps' must be int, got str '2'"),
    ({"train": {"bogus": 1}}, "my.json (tiny block): unknown key 'train.bogus'"),
    ({"bogus": {}}, "my.json (tiny block): unknown section 'bogus'"),
    ({"train": {"precision": "fp8"}}, "my.json (tiny block): config key 'train.precision' must be one of"),
    ({"train": {"keep_last": -1}}, "my.json (tiny block): config key 'train.keep_last' must be >= 0, got -1"),
    ([1], "my.json (tiny block) must be a JSON object of sections, got list"),
])
@pytest.mark.parametrize("tiny", [False, True])
def test_tiny_block_is_checked_with_and_without_tiny(tiny_block, message, tiny):
    with pytest.raises(ConfigError) as info:
        build({"tiny": tiny_block}, tiny=tiny, source="my.json")
    assert str(info.value).startswith(message), str(info.value)


def test_tiny_without_a_tiny_block_is_refused():
    with pytest.raises(ConfigError, match="my.json: --tiny given but the config has no 'tiny' block"):
        build({}, tiny=True, source="my.json")


# --- settings set from elsewhere (a checkpoint's) ---------------------------------------------------------

def test_settings_from_a_checkpoint_are_checked_whole_before_any_is_set():
    """``Config.apply`` (a resume's settings that its first weights set): what changed, as typed values (a list read
    as the field's tuple); anything unknown or failing a check is one line naming where it came from, and nothing of
    it is set, another section's good values included. ``changed_since`` gives what ``apply`` takes."""
    cfg = build()
    before = cfg.to_dict()
    assert cfg.apply({"toy": {"dims": [5, 6], "width": 8}, "train": {"seed": 4}}, "ckpt") == [
        ("toy.dims", (2, 2), (5, 6)), ("train.seed", before["train"]["seed"], 4)]
    assert (cfg.toy.dims, cfg.toy.width, cfg.train.seed) == ((5, 6), 8, 4)
    assert cfg.changed_since(before) == {"toy": {"dims": (5, 6)}, "train": {"seed": 4}}
    for values, message in (
            ({"train": {"seed": 9}, "toy": {"dims": [0]}}, "ckpt: config key 'toy.dims[0]' must be >= 1, got 0"),
            ({"train": {"seed": 9}, "toy": {"batch_size": "2"}}, "ckpt: config key 'toy.batch_size' must be int"),
            ({"train": {"seed": 9}, "nope": {}}, "ckpt: unknown section 'nope'"),
            ({"train": {"seed": 9, "nope": 1}}, "ckpt: unknown key 'train.nope'"),
            ({"train": [9]}, "ckpt: section 'train' must be an object, got list"),
            ([("train", {})], "ckpt must be an object of sections, got list")):
        with pytest.raises(ConfigError) as info:
            cfg.apply(values, "ckpt")
        assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)
        assert (cfg.train.seed, cfg.toy.dims) == (4, (5, 6)), "nothing is set from settings that fail"


# --- choices and bounds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("section, key, good, bad", [
    ("train", "precision", ["fp32", "tf32", "bf16", "fp16"], ["fp8", "FP32", ""]),
    ("optimizer", "schedule", ["constant", "cosine"], ["linear"]),
    ("train", "on_nonfinite", ["skip", "stop"], ["ignore"]),
])
def test_enum_keys_accept_their_choices_and_name_them_otherwise(section, key, good, bad):
    for value in good:
        assert getattr(build({section: {key: value}}).section(section), key) == value
    for value in bad:
        with pytest.raises(ConfigError) as info:
            build({section: {key: value}})
        assert f"config key '{section}.{key}' must be one of {', '.join(good)}, got '{value}'" in str(info.value)


@pytest.mark.parametrize("section, key, value, message", [
    ("train", "max_steps", 0, "'train.max_steps' must be >= 1, got 0"),
    ("train", "keep_last", -1, "'train.keep_last' must be >= 0, got -1"),
    ("train", "dist_timeout_s", 0, "'train.dist_timeout_s' must be > 0, got 0.0"),
    ("train", "grad_clip", -1, "'train.grad_clip' must be >= 0, got -1.0"),
    ("train", "seed", -1, "'train.seed' must be >= 0, got -1"),
    ("train", "seed", 2**32, "'train.seed' must be <= 2147483647, got 4294967296"),
    ("data", "num_workers", -1, "'data.num_workers' must be >= 0, got -1"),
    ("data", "val_size", 0, "'data.val_size' must be >= 1, got 0"),
    ("toy", "batch_size", 0, "'toy.batch_size' must be >= 1, got 0"),
    ("toy", "learning_rate", 0, "'toy.learning_rate' must be > 0, got 0.0"),
    ("optimizer", "lr", 0, "'optimizer.lr' must be > 0, got 0.0"),
    ("optimizer", "warmup_steps", -1, "'optimizer.warmup_steps' must be >= 0, got -1"),
    ("audio", "sampling_rate", 0, "'audio.sampling_rate' must be > 0, got 0"),
    ("audio", "win_length", 2048, "'audio.win_length' (2048) must not exceed audio.n_fft (1024)"),
    ("audio", "fmax", 12000.0, "fmin < fmax <= sampling_rate / 2, got fmin=0.0, fmax=12000.0, sampling_rate=22050"),
])
def test_values_out_of_bounds_are_named(section, key, value, message):
    with pytest.raises(ConfigError) as info:
        build({section: {key: value}}, source="c.json")
    assert str(info.value).startswith("c.json: config key") and message in str(info.value), str(info.value)
    text = f"{section}.{key}={json.dumps(value)}"  # the same through --set, which is named instead of the file
    with pytest.raises(ConfigError) as info:
        build(source="c.json", overrides=[text])
    assert str(info.value).startswith(f"--set {text}: config key") and message in str(info.value), str(info.value)


def test_range_errors_name_where_the_value_came_from():
    raw = {"train": {"keep_last": -1}, "tiny": {"train": {"keep_last": -2}}}
    with pytest.raises(ConfigError, match=r"^c.json: config key 'train.keep_last' must be >= 0, got -1$"):
        build(raw, source="c.json")
    with pytest.raises(ConfigError,
                       match=r"^c.json \(tiny block\): config key 'train.keep_last' must be >= 0, got -2$"):
        build(raw, source="c.json", tiny=True)
    fixed = build(raw, source="c.json", tiny=True, overrides=["train.keep_last=3"])  # a --set may repair it
    assert fixed.train.keep_last == 3
    with pytest.raises(ConfigError, match=r"^--set audio.n_fft=512: config key 'audio.win_length' \(1024\)"):
        build(source="c.json", overrides=["audio.n_fft=512"])


def test_bounds_themselves_are_accepted():
    cfg = build({"train": {"keep_last": 0, "grad_clip": 0, "seed": 0}, "optimizer": {"warmup_steps": 0},
                 "data": {"num_workers": 0}, "audio": {"fmax": 11025.0, "win_length": 1024}})
    assert cfg.train.keep_last == 0 and cfg.data.num_workers == 0 and cfg.audio.fmax == 11025.0


@pytest.mark.parametrize("raw, message", [
    ({"scale": 0}, "config key 'toy.scale' must be > 0, got 0.0"),
    ({"scale": 10.5}, "config key 'toy.scale' must be <= 10, got 10.5"),
    ({"sizes": [2, 0, 3]}, "config key 'toy.sizes[1]' must be >= 1, got 0"),       # list: every element
    ({"dims": [4, 5, -1]}, "config key 'toy.dims[2]' must be >= 1, got -1"),        # variadic tuple
    ({"weights": {"x": 1, "y": -2}}, "config key 'toy.weights[\"y\"]' must be >= 0, got -2.0"),  # dict values
    ({"batch_size": 0}, "config key 'toy.batch_size' must be >= 1, got 0"),
])
def test_bounds_declared_with_setting_are_enforced_with_the_key_named(raw, message):
    with pytest.raises(ConfigError) as info:
        build({"toy": raw}, source="c.json")
    assert str(info.value) == f"c.json: {message}"
    key, value = next(iter(raw.items()))
    text = f"toy.{key}={json.dumps(value)}"
    with pytest.raises(ConfigError) as info:
        build(source="c.json", overrides=[text])
    assert str(info.value) == f"--set {text}: {message}"


def test_bounds_are_not_applied_to_none_and_hold_at_their_limits():
    cfg = build({"toy": {"scale": None, "sizes": [1, 1], "dims": [], "weights": {"x": 0}}})
    assert cfg.toy.scale is None and cfg.toy.sizes == [1, 1]
    assert build({"toy": {"scale": 10}}).toy.scale == 10.0
    assert build(overrides=["toy.scale=null"]).toy.scale is None


def test_fields_keep_their_bounds_and_descriptions():
    class Sec(Section):
        rate: float = Field(0.5, gt=0, lt=1, description="keep probability")
        steps: list[Count] = Field(default_factory=lambda: [1])
        plain: int = 3

    fields = Sec.model_fields
    assert fields["rate"].metadata == [annotated_types.Gt(0), annotated_types.Lt(1)]
    assert fields["rate"].description == "keep probability"
    assert fields["steps"].metadata == [] and fields["plain"].metadata == [] and fields["plain"].description is None
    assert Sec() == Sec(rate=0.5, steps=[1], plain=3) and Sec().steps is not Sec().steps
    cfg = build_config({"sec": {"rate": 0.25}}, {"sec": Sec})
    assert cfg.sec.rate == 0.25
    with pytest.raises(ConfigError, match=r"^config: config key 'sec.rate' must be < 1, got 1.0$"):
        build_config({"sec": {"rate": 1}}, {"sec": Sec})
    with pytest.raises(ConfigError, match=r"^config: config key 'sec.steps\[1\]' must be >= 1, got 0$"):
        build_config({"sec": {"steps": [1, 0]}}, {"sec": Sec})


def test_a_default_out_of_its_bounds_and_a_bound_that_is_no_number_are_refused_where_the_class_is_defined():
    with pytest.raises(ValueError,
                       match=r"^the defaults of Low break its rules: config key 'Low.x' must be >= 1, got 0$"):
        class Low(Section):
            x: int = Field(0, ge=1)
    with pytest.raises(ValueError, match=r"config key 'Items.xs\[1\]' must be > 0, got -1$"):
        class Items(Section):
            xs: tuple[Annotated[int, Field(gt=0)], ...] = (1, -1)
    with pytest.raises(ValueError, match=r"config key 'Listed.xs' must be a list of 2 ints, got list \[1, 2\]$"):
        class Listed(Section):
            xs: tuple[int, int] = [1, 2]  # a default is Python: a tuple field's default is a tuple
    with pytest.raises(Exception, match="must be real number, not str"):  # pydantic's SchemaError
        class Bound(Section):
            x: float = Field(1.0, le="x")
    with pytest.raises(TypeError, match="cannot specify both default and default_factory"):
        Field(1, default_factory=list)


def test_shared_sections_declare_their_bounds_and_choices_on_the_fields():
    fields = TrainConfig.model_fields
    assert fields["seed"].metadata == [annotated_types.Ge(0), annotated_types.Le(2**31 - 1)]
    assert fields["dist_timeout_s"].metadata == [annotated_types.Gt(0)]
    assert fields["precision"].annotation == Literal["fp32", "tf32", "bf16", "fp16"]
    assert parse_override("train.precision=bf16", SCHEMAS)[2] == "bf16"
    with pytest.raises(ConfigError, match=r"'train.precision' must be one of fp32, tf32, bf16, fp16, got 'fp64'$"):
        parse_override("train.precision=fp64", SCHEMAS)


def test_sections_are_mutable_compare_by_value_and_refuse_unknown_attributes():
    cfg, other = build(), build()
    cfg.data.exclude = sorted({*cfg.data.exclude, "LJ001-0001"})  # what the start-up check of the corpus does
    assert cfg.data.exclude == ["LJ001-0001"] and other.data.exclude == []
    assert cfg.audio == other.audio and cfg.audio == AudioConfig()
    other.audio.hop_length = 128
    assert cfg.audio != other.audio
    assert DataConfig(dataset_path="x", exclude=["a"]).exclude == ["a"]
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        AudioConfig(hop=1)
    with pytest.raises(ValidationError, match="must not exceed audio.n_fft"):
        AudioConfig(n_fft=512)


# --- files ------------------------------------------------------------------------------------------------

def test_load_config_file_problems_are_named(tmp_path):
    with pytest.raises(ConfigError, match=f"config file not found: {tmp_path / 'none.json'}"):
        load_config(tmp_path / "none.json", SCHEMAS)
    with pytest.raises(ConfigError, match=f"cannot read config file {tmp_path}: Is a directory"):
        load_config(tmp_path, SCHEMAS)
    bad = tmp_path / "bad.json"
    bad.write_text('{"train": {"max_steps": 3,}}')
    with pytest.raises(ConfigError, match=r"bad.json is not valid JSON: .*line 1"):
        load_config(bad, SCHEMAS)
    bad.write_bytes(b'{"train": "\xff"}')
    with pytest.raises(ConfigError, match="bad.json is not UTF-8 text"):
        load_config(bad, SCHEMAS)
    bad.write_text('{"train": {"max_steps": 3, "seed": 1, "max_steps": 4}}')
    with pytest.raises(ConfigError, match="bad.json: key 'max_steps' appears twice"):
        load_config(bad, SCHEMAS)
    bad.write_text("[]")
    with pytest.raises(ConfigError, match="bad.json must be a JSON object of sections, got list"):
        load_config(bad, SCHEMAS)
    bad.write_text('{"train": {"max_steps": "3"}}')
    with pytest.raises(ConfigError, match="bad.json: config key 'train.max_steps' must be int, got str '3'"):
        load_config(bad, SCHEMAS)


def test_to_dict_round_trips_through_config_from_dict():
    cfg = build({"train": {"max_steps": 9}, "toy": {"names": ["p", "q"]}})
    again = config_from_dict(json.loads(json.dumps(cfg.to_dict())), SCHEMAS)
    assert isinstance(again, Config) and again.to_dict() == cfg.to_dict()
    data = cfg.to_dict()
    data["train"]["removed_key"] = 1
    with pytest.raises(ConfigError, match="checkpoint config: unknown key 'train.removed_key'"):
        config_from_dict(data, SCHEMAS)


def test_to_dict_round_trips_none_tuples_and_literals():
    raw = {"train": {"precision": "bf16"}, "optimizer": {"schedule": "cosine"},
           "toy": {"scale": None, "window": [2, 3], "dims": [1], "pair": [7, "z"], "mode": "b", "level": 2,
                   "weights": {"a": 1}, "crop": None, "label": None, "either": "e"}}
    cfg = build(raw)
    assert cfg.toy.window == (2, 3) and cfg.toy.weights == {"a": 1.0}
    for data in (cfg.to_dict(), json.loads(json.dumps(cfg.to_dict()))):  # as a checkpoint holds it, and as JSON
        again = config_from_dict(data, SCHEMAS)
        assert again.toy == cfg.toy and again.train == cfg.train
        assert shape(again.to_dict()) == shape(cfg.to_dict())


@pytest.mark.parametrize("tiny", [False, True])
def test_the_shipped_config_json_loads(tiny):
    schemas = {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
    cfg = load_config(f"{ROOT}/config.json", schemas, tiny=tiny)
    assert (cfg.train.precision == "fp32") == tiny
    for name in MODELS:
        assert cfg.section(name).batch_size >= 1


def test_a_config_saved_before_mel_framing_frames_as_jik876():
    saved = build().to_dict()
    del saved["audio"]["mel_framing"]  # a checkpoint written before the setting, trained on jik876's frames
    audio = config_from_dict(saved, SCHEMAS).audio
    assert audio.mel_framing is None and audio.framing == "jik876"


def test_the_start_up_line_names_the_recipe_a_model_gets_its_own_or_the_projects_defaults():
    """``train.py``'s start-up line (``setup.recipe_line``): the values a model without a recipe gets are the ones
    ``apply_recipe`` gives its config's nulls; a recipe's own values, and the defaults for what it leaves out."""
    mine = dataclasses.replace(next(iter(MODELS.values())), name="mine", recipe={})
    assert recipe_line(mine) == ("recipe (the project's defaults: mine's ModelSpec has none) for the settings "
                                 "config.json leaves null: audio.mel_framing=jik876, train.grad_clip=0.0, "
                                 "train.cudnn_benchmark=true, optimizer.lr=0.001, optimizer.weight_decay=0.0, "
                                 "data.batching=random, data.max_frames=0, train.ema_decay=0.0")
    cfg = apply_recipe(mine, load_config(f"{ROOT}/config.json", config_schemas()))
    assert (cfg.audio.mel_framing, cfg.train.grad_clip, cfg.train.cudnn_benchmark) == ("jik876", 0.0, True)
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay, cfg.data.batching, cfg.data.max_frames) == (
        1e-3, 0.0, "random", 0)
    assert cfg.train.ema_decay == 0.0
    some = dataclasses.replace(mine, recipe={"train.grad_clip": 1.0, "optimizer.lr": 3e-3})
    assert recipe_line(some) == ("recipe (mine's ModelSpec.recipe, the project's defaults for the rest) for the "
                                 "settings config.json leaves null: audio.mel_framing=jik876, train.grad_clip=1.0, "
                                 "train.cudnn_benchmark=true, optimizer.lr=0.003, optimizer.weight_decay=0.0, "
                                 "data.batching=random, data.max_frames=0, train.ema_decay=0.0")
    own = dataclasses.replace(mine, recipe={"audio.mel_framing": "nvidia", "train.grad_clip": 1.0,
                                            "train.cudnn_benchmark": False, "optimizer.lr": 1e-4,
                                            "optimizer.weight_decay": 1e-6, "data.batching": "frames",
                                            "data.max_frames": BatchFrames(500), "train.ema_decay": 0.999})
    assert recipe_line(own) == ("recipe (mine's ModelSpec.recipe) for the settings config.json leaves null: "
                                "audio.mel_framing=nvidia, train.grad_clip=1.0, train.cudnn_benchmark=false, "
                                "optimizer.lr=0.0001, optimizer.weight_decay=1e-06, data.batching=frames, "
                                "data.max_frames=batch_size x 500, train.ema_decay=0.999")
    framed = dataclasses.replace(own, name=next(iter(MODELS)))  # a model the config has a section of: its batch_size
    cfg = apply_recipe(framed, load_config(f"{ROOT}/config.json", config_schemas(), tiny=True))
    assert (cfg.data.batching, cfg.data.max_frames) == ("frames", 500 * cfg.section(framed.name).batch_size)
    assert cfg.train.ema_decay == 0.999


def test_the_registry_refuses_a_model_section_without_what_every_model_has():
    """A model's section must be a ModelSection (batch_size): the rule, checked."""

    class Plain(Section):
        width: int = Field(4, ge=1)

    class Own(ModelSection):
        batch_size: int = Field(3, ge=1)

    spec = next(iter(MODELS.values()))
    with pytest.raises(ValueError, match=r"its config_cls .*Plain.* is not a utils.config.ModelSection"):
        registry(dataclasses.replace(spec, config_cls=Plain))
    assert registry(dataclasses.replace(spec, config_cls=Own))[spec.name].config_cls().batch_size == 3


def test_the_registry_refuses_the_shared_sections_names_which_are_the_sections_config_schemas_gives():
    """The names the registry refuses (``utils.config.SHARED_SECTION_NAMES``) are the shared sections'
    (``SHARED_SECTIONS``), and ``config_schemas`` gives them, then one section per registered model."""
    assert tuple(SHARED_SECTIONS) == SHARED_SECTION_NAMES
    assert list(config_schemas()) == [*SHARED_SECTION_NAMES, *MODELS]
    spec = next(iter(MODELS.values()))
    for name in (*SHARED_SECTION_NAMES, "tiny", "not-an-identifier"):
        with pytest.raises(ValueError, match=f"model name '{name}' must be an identifier other than audio, data, "
                                             "train, optimizer, tiny"):
            registry(dataclasses.replace(spec, name=name))


def test_importing_the_registry_imports_no_training_module():
    """``models`` (the registry) reads the shared sections' names from the neutral core: the loop's settings, setup,
    steps and checks stay unimported (a tool that only lists the models does not load them)."""
    listed = subprocess.run([sys.executable, "-c", "import models, sys; print(sorted(m for m in sys.modules "
                             "if m == 'utils.training' or m.startswith('utils.training.')))"],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    assert listed.stdout.strip() == "[]", listed.stdout + listed.stderr
