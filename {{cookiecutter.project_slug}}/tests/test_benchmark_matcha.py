"""Matcha-TTS's synthetic batches and case of ``python -m scripts.benchmark`` (a file of the Matcha-TTS model and of
the benchmarks part: it goes with either)."""

import os

import pytest
import torch
from conftest import ROOT

from models import MODELS
from models.matcha.benchmark import synthetic_batch
from models.matcha.data import MatchaCollate
from parts import PARTS, config_schemas
from scripts import benchmark_step
from utils.config import load_config


def tiny_config(*overrides: str):
    return load_config(os.path.join(ROOT, "config.json"), config_schemas(), tiny=True, overrides=list(overrides))


def test_a_synthetic_batch_is_laid_out_as_the_collate_lays_out_its_items_and_trains():
    """The batch equals :class:`MatchaCollate`'s of items cut from it at its lengths (the same padding, the mel's frames
    rounded up as the U-Net needs); a multi-speaker config's carries speaker indices; the tiny model's losses on it are
    finite and reach the decoder."""
    cfg = tiny_config('data.speakers=["a","b","c"]')
    batch = synthetic_batch(cfg, 3, torch.Generator().manual_seed(0), text_lengths=(6, 16), mel_lengths=(20, 40),
                            longest_mel=37)
    items = [{"text": batch["text"][i, :int(batch["text_lengths"][i])], "id": batch["ids"][i],
              "mel": batch["mel"][i, :, :int(batch["mel_lengths"][i])], "speaker": int(batch["speaker"][i])}
             for i in range(3)]
    collated = MatchaCollate()(items)
    assert batch["mel"].shape == (3, cfg.audio.n_mels, 40) and int(batch["mel_lengths"][0]) == 37
    assert batch.keys() == collated.keys()
    for key in ("text", "text_lengths", "mel", "mel_lengths", "speaker"):
        assert torch.equal(batch[key], collated[key]), key
    assert ((0 <= batch["speaker"]) & (batch["speaker"] < 3)).all()
    assert "speaker" not in synthetic_batch(tiny_config(), 2, torch.Generator().manual_seed(0), (6, 16), (20, 40), 40)
    torch.manual_seed(0)
    outputs = MODELS["matcha"].build_model(cfg)(batch)
    assert all(torch.isfinite(outputs[key]) for key in ("duration", "prior", "flow"))


@pytest.mark.parametrize("shape", [{"batch_size": 0}, {"text_lengths": (6, 6)}, {"mel_lengths": (10, 40)},
                                   {"longest_mel": 12}])
def test_a_shape_it_cannot_draw_is_a_value_error(shape):
    """An empty range, or mels shorter than texts (monotonic alignment gives every token a frame)."""
    kwargs = {"batch_size": 2, "text_lengths": (6, 16), "mel_lengths": (20, 40), "longest_mel": 40, **shape}
    with pytest.raises(ValueError, match="matcha synthetic_batch"):
        synthetic_batch(tiny_config(), generator=torch.Generator(), **kwargs)


def test_the_benchmark_times_the_authors_ljspeech_shape_and_a_tiny_one():
    """``scripts.benchmark``'s case of Matcha-TTS: the authors' LJSpeech model at batch 32, its tiny row's name."""
    (name, case), = benchmark_step.cases_for(["matcha"])
    assert PARTS.benchmarks["matcha"].cases == (case,) and case.name == "matcha_ljspeech_b32" and case.batch_size == 32
    assert benchmark_step.case_name(name, case, case.tiny, tiny=True) == "tiny_matcha_b2_l40"
