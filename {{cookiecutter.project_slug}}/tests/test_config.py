"""Tests of utils/config.py: every bad key or value is refused with a ConfigError that names it."""

import dataclasses
import json

import pytest

from conftest import ROOT
from model import MODELS
from utils.config import (SHARED_SECTIONS, AudioConfig, Config, ConfigError, TrainConfig, build_config,
                          config_from_dict, load_config, parse_override)


@dataclasses.dataclass
class ToyModelConfig:
    """A model section as model.py would declare one (independent of the example models)."""

    width: int = 8
    names: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    batch_size: int = 4
    learning_rate: float = 1e-3
    weight_decay: float = 0.0


SCHEMAS = {**SHARED_SECTIONS, "toy": ToyModelConfig}


def build(raw=None, **kwargs):
    return build_config(raw or {}, SCHEMAS, **kwargs)


# --- keys and sections ------------------------------------------------------------------------------------

def test_left_out_keys_take_the_dataclass_defaults():
    cfg = build({"train": {"max_steps": 7}})
    assert cfg.train.max_steps == 7
    assert cfg.train.seed == TrainConfig().seed and cfg.audio == AudioConfig()
    assert cfg.section("toy") is cfg.toy and cfg.toy.width == 8


def test_unknown_section_is_named_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"^config: unknown section 'trian' \(known: audio, data, train, toy\)$"):
        build({"trian": {"max_steps": 1}})
    with pytest.raises(ConfigError, match="config has no section 'nope'"):
        build().section("nope")


def test_unknown_key_is_named_with_its_section_keys():
    with pytest.raises(ConfigError, match=r"unknown key 'train\.max_step' \(keys of 'train': seed, precision"):
        build({"train": {"max_step": 1}})
    with pytest.raises(ConfigError, match=r"unknown key 'toy\.depth' \(keys of 'toy': width, names, batch_size"):
        build({"toy": {"depth": 1}})


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
    ("train", "cudnn_benchmark", 1, "config key 'train.cudnn_benchmark' must be bool, got int 1"),
    ("train", "grad_clip", "x", "config key 'train.grad_clip' must be float, got str 'x'"),
    ("train", "grad_clip", None, "config key 'train.grad_clip' must be float, got NoneType None"),
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
    ("trian.max_steps=3", "--set trian.max_steps=3: unknown section 'trian' (known: audio, data, train, toy)"),
    ("train.nope=3", "--set train.nope=3: unknown key 'train.nope' (keys of 'train': seed, precision,"),
    ("train.max_steps=abc", "--set train.max_steps=abc: config key 'train.max_steps' must be int, got str 'abc'"),
    ("train.cudnn_benchmark=True", "config key 'train.cudnn_benchmark' must be bool, got str 'True'"),
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


# --- choices and bounds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("key, good, bad", [
    ("precision", ["fp32", "tf32", "bf16", "fp16"], ["fp8", "FP32", ""]),
    ("lr_schedule", ["constant", "cosine"], ["linear"]),
    ("on_nonfinite", ["skip", "stop"], ["ignore"]),
])
def test_enum_keys_accept_their_choices_and_name_them_otherwise(key, good, bad):
    for value in good:
        assert getattr(build({"train": {key: value}}).train, key) == value
    for value in bad:
        with pytest.raises(ConfigError) as info:
            build({"train": {key: value}})
        assert f"config key 'train.{key}' must be one of {', '.join(good)}, got '{value}'" in str(info.value)


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
    cfg = build({"train": {"keep_last": 0, "grad_clip": 0, "seed": 0, "warmup_steps": 0},
                 "data": {"num_workers": 0}, "audio": {"fmax": 11025.0, "win_length": 1024}})
    assert cfg.train.keep_last == 0 and cfg.data.num_workers == 0 and cfg.audio.fmax == 11025.0


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


@pytest.mark.parametrize("tiny", [False, True])
def test_the_shipped_config_json_loads(tiny):
    schemas = {**SHARED_SECTIONS, **{name: spec.config_cls for name, spec in MODELS.items()}}
    cfg = load_config(f"{ROOT}/config.json", schemas, tiny=tiny)
    assert (cfg.train.precision == "fp32") == tiny
    for name in MODELS:
        assert cfg.section(name).batch_size >= 1
