"""A test of training Tacotron2 from shards (``data.format=shar``, lhotse Shar shards made by
``scripts/make_shards.py``): a multi-speaker Tacotron2 whose validation speakers none trains validates on training
utterances, their cuts read from the training shards. In projects with Tacotron2 and the shards alike; lhotse takes
seconds to import: the slow tier."""

import importlib
from pathlib import Path

import pytest
import torch
from conftest import layout_corpus
from test_shards import run_tool

from distributed import DistInfo
from models import MODELS
from parts import config_schemas
from utils.config import load_config
from utils.data import shar
from utils.data.speakers import data_speakers

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[1]


def test_a_model_validating_on_training_utterances_reads_their_cuts_from_the_training_shards(tmp_path):
    """Shards of a corpus none of whose validation speakers trains (LibriTTS's ``dev-*``): a two-speaker Tacotron2
    validates on the last training utterance instead (said in one line), its cut read from the train split's shards
    (not in the val split's); the training loader leaves it out."""
    corpus, out = tmp_path / "corpus", tmp_path / "shards"
    layout_corpus(corpus, "libritts", speakers=("1034", "2911", "3000"), per_speaker=3)
    tool = importlib.import_module("scripts.make_shards")  # it imports lhotse
    assert run_tool(tool, "--dataset-path", corpus, "--output", out, "--shard-size", 2)[0] == 0
    cfg = load_config(str(PROJECT / "config.json"), config_schemas(), tiny=True)
    cfg.data.dataset_path, cfg.data.format, cfg.data.max_duration, cfg.data.num_workers = str(out), "shar", 1.0, 0
    cfg.data.speakers = data_speakers(train_split := shar.read_splits(str(out))[0])
    assert cfg.data.speakers == ["1034", "2911"]
    dist = DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend=None)
    with pytest.warns(UserWarning, match=r"\(theirs: 3000\): the last 1 training utterances validate instead"):
        train, val = shar.SHAR_CORPUS.loaders(MODELS["tacotron2"], cfg, dist)
    *others, last = train_split.ids.tolist()
    assert [batch["ids"] for batch in val] == [[last]]
    trained = [utt for batch in train for utt in batch["ids"]]
    assert trained and set(trained) <= set(others), trained
