"""Tests of ``scripts/make_shards.py``: a corpus written as lhotse Shar shards reads back, with lhotse's own reader, as
the utterances the project's readers give (ids, transcripts, speakers, languages, durations, every sample), and bad
input is one ``ERROR:`` line that leaves no shard behind. lhotse takes seconds to import: every test is in the slow
tier, the tool loaded when a test first asks for it (not when the tests are collected)."""

import contextlib
import importlib
import io
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import demo_corpus, layout_corpus

from utils.data.corpora import load_splits
from utils.data.corpus import DataConfig
from utils.data.sources import header, read_audio

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    """The ``scripts.make_shards`` module (it imports lhotse)."""
    return importlib.import_module("scripts.make_shards")


def run_tool(tool, *argv) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``make_shards.main(argv)`` in this process, without a progress bar."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tool.main([*map(str, argv), "--no-progress"])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``corpora[name]``, made when first asked for: ``vctk``, the demo corpus of 8 utterances of 2 speakers (48 kHz
    FLAC); ``lhotse``, a manifest whose cuts are spans of longer 16 kHz recordings; ``parquet``, rows of encoded audio
    (conftest's :func:`layout_corpus`)."""
    root = tmp_path_factory.mktemp("layouts")

    class Made(dict):
        def __missing__(self, name: str):
            if name == "vctk":
                self[name] = demo_corpus(tmp_path_factory, "vctk", speakers=2, n=8)
            else:
                layout_corpus(root / name, name)
                self[name] = root / name
            return self[name]

    return Made()


@pytest.mark.parametrize("name, audio", [("vctk", "flac"), ("lhotse", "original"), ("parquet", "flac")])
def test_shards_read_back_as_the_corpus_utterances(tool, corpora, tmp_path, name, audio):
    """Each split's cuts, read by ``CutSet.from_shar``, in corpus order: the utterance's id, transcript, speaker,
    language, duration (the manifest's, else the header's) and every sample at the clip's own rate, as the project's
    reader decodes them (a file, a span of a recording, a parquet row's bytes); ``--shard-size 3`` cuts the training
    split into shards of 3. The parquet corpus is read with ``--config`` and ``--format``."""
    from lhotse import CutSet  # only these tests' (3 s)

    root, out = corpora[name], tmp_path / "shards"
    config = ["--config", PROJECT / "config.json", "--format", "parquet"] if name == "parquet" else []
    code, said, errors = run_tool(tool, "--dataset-path", root, "--output", out, "--shard-size", 3, "--audio", audio,
                                  *config)
    assert code == 0, errors
    assert ("found the parquet layout" not in errors) if config else ("data.format=auto: found" in errors)
    splits = dict(zip(("train", "val"), load_splits(DataConfig(dataset_path=str(root)))))
    assert said.startswith(f"train: {len(splits['train'])} cuts in {math.ceil(len(splits['train']) / 3)} shard(s)")
    for split, corpus in splits.items():
        assert sorted(path.name for path in (out / split).glob("cuts.*")) == \
            [f"cuts.{n:06d}.jsonl.gz" for n in range(math.ceil(len(corpus) / 3))]
        cuts = list(CutSet.from_shar(in_dir=out / split))
        assert [cut.id for cut in cuts] == corpus.ids.tolist()
        for utt, cut in zip(corpus, cuts):
            (supervision,) = cut.supervisions
            assert (supervision.text, supervision.speaker, supervision.language or "") == \
                (utt.text, utt.speaker, utt.language)
            frames, rate = header(utt.audio)
            assert cut.sampling_rate == rate
            assert cut.duration == pytest.approx(utt.duration if name == "lhotse" else frames / rate, abs=1 / rate)
            samples = cut.load_audio()
            assert samples.shape[0] == 1
            np.testing.assert_array_equal(samples[0], read_audio(utt.audio, rate).numpy(), err_msg=utt.id)
    assert not list(out.glob(".*")), "a partial folder is left"


def test_a_clip_that_cannot_be_read_is_one_error_line_and_leaves_no_shard(tool, corpora, tmp_path):
    """The 6th utterance's FLAC is not audio: one line naming it and its file, exit status 1, nothing written (the
    output folder the run made is removed)."""
    root, out = tmp_path / "corpus", tmp_path / "shards"
    shutil.copytree(corpora["vctk"], root)
    utt = load_splits(DataConfig(dataset_path=str(root)))[0][5]
    with open(utt.audio, "wb") as broken:
        broken.write(b"not audio")
    code, said, errors = run_tool(tool, "--dataset-path", root, "--output", out)
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and not said and "Traceback" not in errors, errors
    assert len(lines) == 1 and f"'{utt.id}'" in lines[0] and utt.audio in lines[0], errors
    assert not out.exists(), sorted(out.rglob("*"))


@pytest.mark.parametrize("case", ["no corpus", "shards exist", "shard size", "url", "format"])
def test_bad_arguments_are_one_error_line_and_change_nothing(tool, corpora, tmp_path, case):
    """A folder in no layout, an output whose ``train/`` exists (left as it was), ``--shard-size 0``, an ``s3://``
    output, a ``--format`` no reader has: one ``ERROR:`` line naming what is wrong, exit status 1."""
    out = tmp_path / "shards"
    argv = {"no corpus": ["--dataset-path", tmp_path], "url": ["--output", "s3://bucket/prefix"],
            "shard size": ["--shard-size", 0], "format": ["--format", "wav"]}.get(case, [])
    if case == "shards exist":
        (out / "train").mkdir(parents=True)
        (out / "train" / "cuts.000000.jsonl.gz").write_bytes(b"mine")
    code, said, errors = run_tool(tool, "--dataset-path", corpora["vctk"], "--output", out, *argv)
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and not said and "Traceback" not in errors and len(lines) == 1, errors
    named = {"no corpus": str(tmp_path), "shards exist": str(out / "train"), "shard size": "--shard-size",
             "url": "s3://bucket/prefix", "format": "--format wav"}[case]
    assert named in lines[0], lines[0]
    if case == "shards exist":
        assert (out / "train" / "cuts.000000.jsonl.gz").read_bytes() == b"mine" and not (out / "val").exists()
    else:
        assert not out.exists()
