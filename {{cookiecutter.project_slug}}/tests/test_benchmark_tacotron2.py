"""Tacotron2's rows of ``python -m scripts.benchmark --loader``: what the cached mels of ``scripts.preprocess`` buy (a
file of the Tacotron2 model and of the benchmarks part: it goes with either)."""

import json
from pathlib import Path

import pytest
from conftest import ROOT, synth_corpus

from scripts import benchmark


@pytest.mark.slow
def test_loader_benchmark_reads_cached_mels(tmp_path):
    from scripts import preprocess

    corpus = synth_corpus(tmp_path / "corpus", n=8)
    config = Path(ROOT) / "config.json"
    assert preprocess.main(["--config", str(config), "--tiny", "--dataset-path", str(corpus), "--workers", "1"]) == 0
    out = tmp_path / "loader.json"
    assert benchmark.main(["--loader", "--tiny", "--device", "cpu", "--dataset-path", str(corpus), "--model",
                           "tacotron2", "--steps", "3", "--workers", "0", "--json", str(out)]) == 0
    rows = {row["case"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"train_tacotron2", "loader_tacotron2_wav", "loader_tacotron2_cached_mels"}
