"""Tests of ``scripts/make_shards.py``: a corpus written as lhotse Shar shards reads back, with lhotse's own reader, as
the utterances the project's readers give (ids, transcripts, speakers, languages, durations, every sample), and bad
input is one ``ERROR:`` line that leaves no shard behind; and of training from them (``data.format=shar``): a resume
on as many processes goes on bit for bit, on another number it is one ``ERROR:`` line. lhotse takes seconds to import: every test is in the slow
tier, the tool loaded when a test first asks for it (not when the tests are collected)."""

import contextlib
import importlib
import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TEST_MODEL, bound, demo_corpus, layout_corpus, run_ranks, run_train_main

from models import MODELS
from parts import config_schemas
from utils.config import load_config
from utils.data import shar
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


SHARD_RANK = """
import json, os, signal, sys
import train
read, seen = train.next_micro_batches, []

def reading(*args, **kwargs):  # the utterance ids of every step, as the loop receives them
    micro = read(*args, **kwargs)
    seen.append(micro[2])
    if len(seen) == STOP_AT and os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGTERM)  # inside step STOP_AT: the run stops after it, on every rank
    return micro

train.next_micro_batches = reading
code = train.main(ARGV)
with open(os.path.join(sys.argv[1], "ids" + os.environ["RANK"] + ".json"), "w") as file:
    json.dump(seen, file)
sys.exit(code)
"""
"""A rank of :func:`test_shards_train_and_resume_bit_exactly_on_as_many_processes_and_refuse_another_number`
(``STOP_AT``, ``ARGV`` put in front): ``train.main(ARGV)`` recording the ids of every step in ``ids<RANK>.json``; rank
0 sends itself SIGTERM while it reads step ``STOP_AT`` (0: never)."""


@pytest.fixture(scope="module")
def shards(tool, tmp_path_factory) -> Path:
    """Shards of the demo corpus of 12 utterances (``ljspeech``, 22050 Hz, 2 to 3.5 s): 11 training cuts, 1 to
    validate. No test may change them."""
    corpus, out = demo_corpus(tmp_path_factory, "ljspeech", speakers=1, n=12), tmp_path_factory.mktemp("s") / "shards"
    assert run_tool(tool, "--dataset-path", corpus, "--output", out)[0] == 0
    return out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_model_makes_the_same_items_of_the_shards_as_of_the_corpus(shards, tmp_path_factory, name):
    """Each model's datasets (``Training.datasets_of``) over the shards' metadata, each item made of its cut's audio
    (``item(index, cut_audio(...))``, training and validation), equal, tensor for tensor, those ``build_datasets``
    reads from the corpus's files: the same utterances in the same order, decoded alike."""
    from lhotse import CutSet  # only these tests' (3 s)

    corpus = demo_corpus(tmp_path_factory, "ljspeech", speakers=1, n=12)
    cfg = load_config(str(PROJECT / "config.json"), config_schemas(), tiny=True)
    cfg.data.dataset_path = str(corpus)
    from_files = MODELS[name].training.build_datasets(cfg)
    from_shards = shar.model_items(MODELS[name], cfg, shar.read_splits(shards))
    for split, files, cuts in zip(("train", "val"), from_files, from_shards):
        cut_of = {cut.id: cut for cut in CutSet.from_shar(in_dir=shards / split)}
        assert len(files) == len(cuts) > 0
        for index in range(len(files)):
            item = cuts.item(index, shar.cut_audio(cut_of[cuts.corpus[index].id], cfg.audio.sampling_rate))
            expected = files[index]
            assert item.keys() == expected.keys()
            assert all(torch.equal(item[key], expected[key]) if torch.is_tensor(item[key]) else
                       item[key] == expected[key] for key in item), (split, index)


def test_shards_train_and_resume_bit_exactly_on_as_many_processes_and_refuse_another_number(shards, tmp_path):
    """``data.format=shar`` on 2 gloo ranks: 11 training cuts of 2 to 3.5 s in budgets of 4 s (5 steps an epoch): a run
    stopped by SIGTERM at step 2 resumes on 2 processes to the same batches, losses and weights as the run that went on
    into the second epoch; resumed on 1 process, one ``ERROR:`` line naming ``data.shar_restart_epoch``, exit status
    1, the checkpoints as they were; with it set, the epoch is read again from its start."""
    common = ["--config", str(PROJECT / "config.json"), "--model", TEST_MODEL, "--tiny", "--dataset-path", str(shards),
              "--set", "data.format=shar", "--set", "data.max_duration=4", "--set", "train.log_interval=1",
              "--set", "train.val_interval=100", "--max-steps", "6"]

    def on_two(out, stop_at=0):
        folder = tmp_path / f"{out.name}_ranks"
        folder.mkdir()
        argv = [*common, "--output-dir", str(out)]
        said = run_ranks(f"STOP_AT = {stop_at}\nARGV = {argv!r}\n{SHARD_RANK}", folder, timeout=bound(300))[0]
        ranks = [json.loads((folder / f"ids{rank}.json").read_text()) for rank in (0, 1)]
        losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        return said, [step0 + step1 for step0, step1 in zip(*ranks)], losses

    _, whole_ids, whole_losses = on_two(tmp_path / "whole")
    said, stopped_ids, _ = on_two(tmp_path / "stopped", stop_at=2)
    assert "stopped at step 2 on SIGTERM" in said and stopped_ids == whole_ids[:2], said[-2000:]
    shutil.copytree(tmp_path / "stopped", tmp_path / "resumed", symlinks=True)
    said, resumed_ids, resumed_losses = on_two(tmp_path / "resumed")
    assert resumed_ids == whole_ids[2:] and resumed_losses == whole_losses, said[-2000:]
    assert len({utt for step in whole_ids[:5] for utt in step}) == len([utt for step in whole_ids[:5] for utt in step])
    final = [torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu", weights_only=True)["model"]
             for name in ("whole", "resumed")]
    assert all(torch.equal(final[0][key], final[1][key]) for key in final[0])

    before = {path.name: path.read_bytes() for path in (tmp_path / "stopped").glob("checkpoint_*.pt")}
    code, out, err = run_train_main([*common, "--output-dir", str(tmp_path / "stopped"), "--set",
                                     "data.num_workers=0"])
    lines = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "written by 2 process(es)" in lines[0] and "data.shar_restart_epoch=true" in lines[0], lines[0]
    assert {path.name: path.read_bytes() for path in (tmp_path / "stopped").glob("checkpoint_*.pt")} == before
    code, out, err = run_train_main([*common, "--output-dir", str(tmp_path / "stopped"), "--set",
                                     "data.num_workers=0", "--set", "data.shar_restart_epoch=true", "--max-steps", "3"])
    assert code == 0 and "data.shar_restart_epoch=true reads the epoch again from its start" in err, err[-2000:]
    saved = torch.load(tmp_path / "stopped" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    # the global batch kept: 2 micro-batches a step on 1 process, the epoch's first two
    assert (saved["step"], saved["epoch"], saved["samples_in_epoch"], saved["grad_accumulation"]) == (3, 0, 2, 2)


@pytest.mark.parametrize("case", ["no folder", "a corpus", "no budget", "short budget", "batching"])
def test_bad_shard_settings_are_one_error_line_before_any_work(corpora, shards, tmp_path, case):
    """``data.format=shar`` with a ``--dataset-path`` that does not exist, a corpus folder that holds no shards, no
    ``data.max_duration``, one shorter than the longest training cut, or batches by length (``data.batching``): one
    ``ERROR:`` line naming it, exit status 1, no checkpoint."""
    path = {"no folder": tmp_path / "nowhere", "a corpus": corpora["vctk"]}.get(case, shards)
    budget = {"no budget": "0", "short budget": "1"}.get(case, "4")
    code, out, err = run_train_main(["--config", str(PROJECT / "config.json"), "--model", TEST_MODEL, "--tiny",
                                     "--dataset-path", str(path), "--output-dir", str(tmp_path / "out"), "--set",
                                     "data.format=shar", "--set", f"data.max_duration={budget}",
                                     *(["--set", "data.batching=buckets"] if case == "batching" else [])])
    lines = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    named = {"no folder": str(path), "a corpus": f"{path}/train: no cuts.*.jsonl.gz",
             "short budget": "data.max_duration=1 is shorter than the longest training cut",
             "batching": "data.batching=buckets does not apply"}.get(case, "data.max_duration")
    assert named in lines[0], lines[0]
    assert not list((tmp_path / "out").glob("checkpoint_*"))
