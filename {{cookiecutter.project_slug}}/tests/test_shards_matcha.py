"""A test of training Matcha-TTS from shards (``data.format=shar``, lhotse Shar shards made by
``scripts/make_shards.py``): its mel statistics are given, not computed, there. In projects with Matcha-TTS and the
shards alike; lhotse takes seconds to import: the slow tier."""

import importlib
import os

import pytest
import torch
from conftest import ROOT, demo_corpus, run_train_main
from test_shards import run_tool

pytestmark = pytest.mark.slow


def test_training_from_shards_takes_the_mel_statistics_given_and_names_them_when_null(tmp_path_factory, tmp_path):
    """Shards of a 4-utterance corpus: ``matcha.mel_mean`` and ``matcha.mel_std`` left null (a corpus of shards is not
    read whole at the start) is one ``ERROR:`` line naming them and the tool that prints them, before any work; given,
    a step trains and the checkpoint's config records them."""
    corpus, shards = demo_corpus(tmp_path_factory, "vctk", speakers=2, n=4), tmp_path / "shards"
    tool = importlib.import_module("scripts.make_shards")  # it imports lhotse
    assert run_tool(tool, "--dataset-path", corpus, "--output", shards)[0] == 0
    argv = ["--config", os.path.join(ROOT, "config.json"), "--model", "matcha", "--tiny", "--dataset-path", str(shards),
            "--set", "data.format=shar", "--set", "data.max_duration=4", "--set", "data.num_workers=0",
            "--max-steps", "1"]
    code, out, err = run_train_main([*argv, "--output-dir", str(tmp_path / "null")])
    lines = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "matcha.mel_mean and matcha.mel_std must be set" in lines[0] and "scripts.mel_statistics" in lines[0], lines
    assert not list((tmp_path / "null").glob("checkpoint_*"))
    code, out, err = run_train_main([*argv, "--output-dir", str(tmp_path / "given"), "--set", "matcha.mel_mean=-6.0",
                                     "--set", "matcha.mel_std=2.5"])
    assert code == 0 and "Traceback" not in err, err[-2000:]
    saved = torch.load(tmp_path / "given" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["step"] == 1 and (saved["config"]["matcha"]["mel_mean"], saved["config"]["matcha"]["mel_std"]) == \
        (-6.0, 2.5)
