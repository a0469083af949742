"""Tests of ``scripts/make_shards.py``: a corpus written as lhotse Shar shards reads back, with lhotse's own reader, as
the utterances the project's readers give (ids, transcripts, speakers, languages, durations, every sample), and bad
input is one ``ERROR:`` line that leaves no shard behind; and of training from them (``data.format=shar``, from a
folder or from ``s3://`` on an S3-compatible server, moto's, on 127.0.0.1): a resume on as many processes goes on bit
for bit, on another number it is one ``ERROR:`` line; a shard cut short is read again, then skipped in one line.
lhotse takes seconds to import: every test is in the slow tier, the tool loaded when a test first asks for it (not
when the tests are collected)."""

import contextlib
import gzip
import importlib
import io
import json
import logging
import math
import shutil
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import (RECORDED_RANK, TEST_MODEL, bound, demo_corpus, layout_corpus, run_ranks, run_train_main,
                      vocoders_first)

from distributed import DistInfo
from models import MODELS
from parts import DataSettings, config_schemas
from utils.config import load_config
from utils.data import shar, shar_store
from utils.data.corpora import load_splits
from utils.data.sources import header, parse, read_audio, row_bytes

SHARD_MODELS = sorted(name for name, spec in MODELS.items() if spec.training.datasets_of is not None)
"""The project's models that train from shards (their ``Training.datasets_of``; a model of one's own may have none)."""
SHARD_MODEL = TEST_MODEL if TEST_MODEL in SHARD_MODELS else min(SHARD_MODELS, key=vocoders_first, default=None)
"""The model the training tests run: the tests' model where it trains from shards, else the first of those that do
(:func:`conftest.vocoders_first`)."""
pytestmark = pytest.mark.slow
trains = pytest.mark.skipif(SHARD_MODEL is None, reason="no model of this project trains from shards (none gives "
                            "Training.datasets_of)")
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


AWS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
       "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION")


def aws_env(patch: pytest.MonkeyPatch, folder: Path, **given: str) -> None:
    """The S3 settings of the environment: ``given`` alone (the others removed, no AWS config file of this machine
    read, no instance metadata asked for)."""
    for name in AWS:
        patch.delenv(name, raising=False)
    patch.setenv("AWS_CONFIG_FILE", str(folder / "no-aws-config"))
    patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(folder / "no-aws-credentials"))
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name, value in given.items():
        patch.setenv(name, value)


@pytest.fixture(scope="module")
def s3(tool, tmp_path_factory):
    """``s3://shards/demo``: the shards of :func:`shards`' corpus, written there by the tool, on an S3-compatible
    server (moto's, a thread of this process) on 127.0.0.1 at a port the OS chose; its endpoint and credentials in the
    environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...) while this module's tests run, which the ranks
    inherit. moto keeps its buckets in the process, not in the server: a store left by an earlier set-up in this
    process (pytest sets a module's fixture up again when another module's tests came between, as under xdist) is
    emptied first through moto's reset endpoint."""
    import boto3  # only these tests'
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).close()
        with pytest.MonkeyPatch.context() as patch:
            aws_env(patch, tmp_path_factory.mktemp("aws"), AWS_ENDPOINT_URL=f"http://{host}:{port}",
                    AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
            boto3.client("s3").create_bucket(Bucket="shards")
            corpus = demo_corpus(tmp_path_factory, "ljspeech", speakers=1, n=12)
            code, said, errors = run_tool(tool, "--dataset-path", corpus, "--output", "s3://shards/demo",
                                          "--shard-size", 4)
            assert code == 0 and said.endswith("written to s3://shards/demo (flac)\n"), errors
            yield "s3://shards/demo"
    finally:
        server.stop()


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
    splits = dict(zip(("train", "val"), load_splits(DataSettings(dataset_path=str(root)))))
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
    utt = load_splits(DataSettings(dataset_path=str(root)))[0][5]
    with open(utt.audio, "wb") as broken:
        broken.write(b"not audio")
    code, said, errors = run_tool(tool, "--dataset-path", root, "--output", out)
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and not said and "Traceback" not in errors, errors
    assert len(lines) == 1 and f"'{utt.id}'" in lines[0] and utt.audio in lines[0], errors
    assert not out.exists(), sorted(out.rglob("*"))


def test_each_clip_header_is_read_once_and_the_shards_are_those_of_lhotses_own_reading(tool, corpora, tmp_path,
                                                                                       monkeypatch):
    """A clip's cut opens it once (libsndfile's ``SoundFile``: a file, a span of a longer recording, a parquet row's
    bytes), and the shards of the recordings made of that header (cuts' metadata, decompressed, and recording tars)
    are byte for byte those of lhotse's ``Recording.from_file`` and ``from_bytes``, which read the header again."""
    from lhotse import Recording  # only these tests' (3 s)

    opens, opening = [], sf.SoundFile.__init__

    def counted(clip, file, *args, **kwargs):
        opens.append(file)
        opening(clip, file, *args, **kwargs)

    monkeypatch.setattr(sf.SoundFile, "__init__", counted)

    def by_lhotse(utt):  # the recording as the tool made it before: lhotse reads the header itself
        path, row, _ = parse(utt.audio)
        return Recording.from_bytes(row_bytes(path, row), utt.id) if row is not None else \
            Recording.from_file(path, recording_id=utt.id)

    for name in ("vctk", "lhotse", "parquet"):
        data = DataSettings(dataset_path=str(corpora[name]))
        for utt in load_splits(data)[0]:
            opens.clear()
            tool.utterance_cut(utt)
            assert len(opens) == 1, (utt.audio, opens)
        written = {}
        for way in ("header", "lhotse"):
            with monkeypatch.context() as patch:
                if way == "lhotse":
                    patch.setattr(tool, "recording_of", by_lhotse)
                tool.make_shards(data, tmp_path / name / way, shard_size=3, progress=False)
            written[way] = {path.relative_to(tmp_path / name / way): gzip.decompress(path.read_bytes())
                            if path.name.endswith(".gz") else path.read_bytes()
                            for path in sorted((tmp_path / name / way).rglob("*.*"))}
        assert written["header"] == written["lhotse"] and len(written["header"]) >= 4, name


@pytest.mark.parametrize("case", ["no corpus", "shards exist", "shard size", "url", "no credentials", "no bucket",
                                  "s3 shards exist", "format"])
def test_bad_arguments_are_one_error_line_and_change_nothing(tool, corpora, tmp_path, case, request, monkeypatch):
    """A folder in no layout, an output whose ``train/`` exists (left as it was), ``--shard-size 0``, a URL S3 does
    not serve, an ``s3://`` output without credentials in the environment, in a bucket that does not exist, or where
    shards are already, a ``--format`` no reader has: one ``ERROR:`` line naming what is wrong, exit status 1."""
    out = tmp_path / "shards"
    if case in ("no bucket", "s3 shards exist"):
        request.getfixturevalue("s3")
    if case == "no credentials":
        aws_env(monkeypatch, tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:9")
    argv = {"no corpus": ["--dataset-path", tmp_path], "url": ["--output", "gs://bucket/prefix"],
            "no credentials": ["--output", "s3://bucket/prefix"], "no bucket": ["--output", "s3://nobucket/prefix"],
            "s3 shards exist": ["--output", "s3://shards/demo"],
            "shard size": ["--shard-size", 0], "format": ["--format", "wav"]}.get(case, [])
    if case == "shards exist":
        (out / "train").mkdir(parents=True)
        (out / "train" / "cuts.000000.jsonl.gz").write_bytes(b"mine")
    code, said, errors = run_tool(tool, "--dataset-path", corpora["vctk"], "--output", out, *argv)
    lines = [line for line in errors.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and not said and "Traceback" not in errors and len(lines) == 1, errors
    named = {"no corpus": str(tmp_path), "shards exist": str(out / "train"), "shard size": "--shard-size",
             "url": "gs://bucket/prefix", "no credentials": "s3://bucket/prefix: no S3 credentials",
             "no bucket": "the bucket 'nobucket' does not exist", "s3 shards exist": "s3://shards/demo/train holds",
             "format": "--format wav"}[case]
    assert named in lines[0], lines[0]
    if case == "shards exist":
        assert (out / "train" / "cuts.000000.jsonl.gz").read_bytes() == b"mine" and not (out / "val").exists()
    else:
        assert not out.exists()


@pytest.fixture(scope="module")
def shards(tool, tmp_path_factory) -> Path:
    """Shards of the demo corpus of 12 utterances (``ljspeech``, 22050 Hz, 2 to 3.5 s): 11 training cuts in 3 shards
    of 4, 1 to validate. No test may change them."""
    corpus, out = demo_corpus(tmp_path_factory, "ljspeech", speakers=1, n=12), tmp_path_factory.mktemp("s") / "shards"
    assert run_tool(tool, "--dataset-path", corpus, "--output", out, "--shard-size", 4)[0] == 0
    return out


@pytest.mark.parametrize("name", SHARD_MODELS)
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


@trains
def test_shards_train_and_resume_bit_exactly_on_as_many_processes_and_refuse_another_number(s3, tmp_path):
    """``data.format=shar`` from ``s3://`` (moto's server) on 2 gloo ranks: 11 training cuts of 2 to 3.5 s in budgets of 4 s (5 steps an epoch): a run
    stopped by SIGTERM at step 2 resumes on 2 processes to the same batches, losses and weights as the run that went on
    into the second epoch; resumed on 1 process, one ``ERROR:`` line naming ``data.shar_restart_epoch``, exit status
    1, the checkpoints as they were; with it set, the epoch is read again from its start."""
    common = ["--config", str(PROJECT / "config.json"), "--model", SHARD_MODEL, "--tiny", "--dataset-path", s3,
              "--set", "data.format=shar", "--set", "data.max_duration=4", "--set", "train.log_interval=1",
              "--set", "train.val_interval=100", "--max-steps", "6"]

    def on_two(out, stop_at=0):
        folder = tmp_path / f"{out.name}_ranks"
        folder.mkdir()
        argv = [*common, "--output-dir", str(out)]
        said = run_ranks(f"STOP_AT = {stop_at}\nARGV = {argv!r}\n{RECORDED_RANK}", folder, timeout=bound(300))[0]
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


def test_shards_on_s3_read_back_as_in_a_folder(shards, s3):
    """The tool's upload under ``s3://shards/demo``: each split's shards (3 and 1), their cuts' metadata and audio,
    read through lhotse's readers from the URLs, equal those of the same corpus written to a folder."""
    from lhotse import CutSet  # only these tests' (3 s)

    for split, count in (("train", 3), ("val", 1)):
        remote, local = (shar_store.split_shards(f"{root}/{split}") for root in (s3, shards))
        assert [tuple(name.rsplit("/", 1)[1] for name in pair) for pair in remote] == \
            [tuple(Path(name).name for name in pair) for pair in local] and len(remote) == count
        assert remote[0][0] == f"{s3}/{split}/cuts.000000.jsonl.gz"
        read = [list(shar_store.ReadShards(pairs, shar.KeptIds(set(shar.split_corpus(f"{root}/{split}").ids.tolist())),
                                           CutSet.from_shar)) for root, pairs in ((s3, remote), (shards, local))]
        assert [cut.id for cut in read[0]] == [cut.id for cut in read[1]] and read[0]
        assert all(a.recording.sources[0].source == b.recording.sources[0].source and a.supervisions == b.supervisions
                   for a, b in zip(*read))


def test_the_duration_bins_are_lhotses_estimate_of_the_kept_cuts_from_their_durations_the_shards_not_read(shards,
                                                                                                          monkeypatch):
    """``ShardOrder``'s duration bins, of the training split less its 3rd and 8th cut (9 kept: 9 buckets), equal lhotse's
    ``estimate_duration_buckets`` of the cuts kept; made of the kept durations, no ``CutSet.from_shar`` asked."""
    from lhotse import CutSet  # only these tests' (3 s)
    from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

    folder = str(shards / "train")
    split = shar.split_corpus(folder)
    kept = split.take([i for i in range(len(split)) if i not in (2, 7)])
    cuts = CutSet.from_shar(fields={"cuts": [cuts for cuts, _ in shar_store.split_shards(folder)]})
    expected = estimate_duration_buckets(cuts.filter(shar.KeptIds(set(kept.ids.tolist()))), len(kept))
    reads, reader = [], CutSet.from_shar
    monkeypatch.setattr(CutSet, "from_shar", staticmethod(lambda **fields: reads.append(fields) or reader(**fields)))
    order = shar.ShardOrder(folder, kept, 4.0, DistInfo(0, 0, 1, torch.device("cpu"), None), seed=0)
    assert order.bins == expected and len(expected) > 1 and not reads, (order.bins, expected, reads)


def test_the_shards_are_read_by_a_thread_a_bounded_number_of_batches_ahead_its_error_raised_in_order():
    """``read_ahead``: the items are drawn in a thread other than the caller's, at most ``size`` waiting (plus the one
    the thread holds), in their order; an error of the items is raised in its place; closing stops the thread."""
    drawn: list[bool] = []  # per item drawn: whether it was drawn in the caller's thread

    def batches():
        for i in range(8):
            drawn.append(threading.current_thread() is threading.main_thread())
            yield i
        raise OSError("shard 8 cannot be read")

    ahead = shar_store.read_ahead(batches(), 3)
    assert next(ahead) == 0
    deadline = time.monotonic() + 120  # generous: a busy machine
    while len(drawn) < 5 and time.monotonic() < deadline:  # 3 waiting, the thread holding a 5th
        time.sleep(0.01)
    time.sleep(0.2)  # time to draw more, were it unbounded
    assert len(drawn) == 5 and not any(drawn), drawn
    assert [next(ahead) for _ in range(7)] == list(range(1, 8))
    with pytest.raises(OSError, match="shard 8"):
        next(ahead)
    endless = shar_store.read_ahead(iter(int, 1), 2)  # zeros, for ever
    assert next(endless) == 0
    endless.close()
    deadline = time.monotonic() + 120  # generous: a busy machine
    while any(t.name == "shard-read-ahead" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "shard-read-ahead" for t in threading.enumerate())


@trains
def test_a_shard_cut_short_is_read_again_then_skipped_in_one_line(shards, tmp_path, monkeypatch):
    """The second training shard's tar cut in half: lhotse's reader is asked for it 3 times, then its cuts are left
    out, one line naming it and the count (the others' cuts given in order); training goes on with the rest, that line
    once in its log."""
    from lhotse import CutSet  # only these tests' (3 s)

    root = tmp_path / "shards"
    shutil.copytree(shards, root)
    tar = root / "train" / "recording.000001.tar"
    tar.write_bytes(tar.read_bytes()[:tar.stat().st_size // 2])
    monkeypatch.setattr(shar_store, "PAUSE_S", 0.0)
    asked, said = [], []

    def from_shar(**fields):
        asked.append(fields["fields"]["recording"][0])
        return CutSet.from_shar(**fields)

    pairs = shar_store.split_shards(str(root / "train"))
    ids = shar.split_corpus(str(root / "train")).ids.tolist()
    cuts = list(shar_store.ReadShards(pairs, shar.KeptIds(set(ids)), from_shar, said.append))
    assert [cut.id for cut in cuts] == ids[:4] + ids[8:] and asked.count(str(tar)) == 3, asked
    assert said == [said[0]] and said[0].startswith(f"warning: shard {tar} could not be read in 3 tries (") and \
        said[0].endswith("its cuts skipped (1 shard(s) skipped so far)"), said
    code, out, err = run_train_main(["--config", str(PROJECT / "config.json"), "--model", SHARD_MODEL, "--tiny",
                                     "--dataset-path", str(root), "--output-dir", str(tmp_path / "out"), "--set",
                                     "data.format=shar", "--set", "data.max_duration=4", "--set", "data.num_workers=0",
                                     "--max-steps", "1"])
    lines = [line for line in err.splitlines() if str(tar) in line]
    assert code == 0 and "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith("warning: shard") and "(1 shard(s) skipped so far)" in lines[0], lines[0]


@pytest.mark.parametrize("case", ["no folder", "a corpus", "no budget", "short budget", "batching", "no credentials",
                                  "no endpoint", "no bucket", "empty prefix"])
@trains
def test_bad_shard_settings_are_one_error_line_before_any_work(corpora, shards, tmp_path, case, request, monkeypatch):
    """``data.format=shar`` with a ``--dataset-path`` that does not exist, a corpus folder that holds no shards, no
    ``data.max_duration``, one shorter than the longest training cut, or batches by length (``data.batching``); an
    ``s3://`` path without credentials or endpoint in the environment, in a bucket that does not exist, or a prefix
    without shards: one ``ERROR:`` line naming it, exit status 1, no checkpoint."""
    path = {"no folder": tmp_path / "nowhere", "a corpus": corpora["vctk"]}.get(case, shards)
    if case in ("no credentials", "no endpoint", "no bucket", "empty prefix"):
        path = {"no bucket": "s3://nobucket/demo", "empty prefix": "s3://shards/nothing"}.get(
            case, request.getfixturevalue("s3"))
        for name in {"no credentials": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
                     "no endpoint": ["AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"]}.get(case, []):
            monkeypatch.delenv(name)
    budget = {"no budget": "0", "short budget": "1"}.get(case, "4")
    code, out, err = run_train_main(["--config", str(PROJECT / "config.json"), "--model", SHARD_MODEL, "--tiny",
                                     "--dataset-path", str(path), "--output-dir", str(tmp_path / "out"), "--set",
                                     "data.format=shar", "--set", f"data.max_duration={budget}",
                                     *(["--set", "data.batching=buckets"] if case == "batching" else [])])
    lines = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    named = {"no folder": str(path), "a corpus": f"{path}/train: no cuts.*.jsonl.gz",
             "short budget": "data.max_duration=1 is shorter than the longest training cut",
             "batching": "data.batching=buckets does not apply", "no credentials": f"{path}/train: no S3 credentials",
             "no endpoint": f"{path}/train: no S3 endpoint", "no bucket": "the bucket 'nobucket' does not exist",
             "empty prefix": "s3://shards/nothing/train: no cuts.*.jsonl.gz"}.get(case, "data.max_duration")
    assert named in lines[0], lines[0]
    assert not list((tmp_path / "out").glob("checkpoint_*"))


@pytest.mark.parametrize("name", [name for name in sorted(MODELS) if name not in SHARD_MODELS])
def test_a_model_that_makes_no_items_of_given_audio_is_one_error_line_with_shards(shards, tmp_path, name):
    """A model of one's own whose ``Training`` gives no ``datasets_of``: ``data.format=shar`` is one ``ERROR:`` line
    naming it and what to give, before any work (its corpus layouts still train it)."""
    code, out, err = run_train_main(["--config", str(PROJECT / "config.json"), "--model", name, "--tiny",
                                     "--dataset-path", str(shards), "--output-dir", str(tmp_path / "out"), "--set",
                                     "data.format=shar", "--set", "data.max_duration=4"])
    lines = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert f"model '{name}' gives no Training.datasets_of" in lines[0], lines[0]
    assert not list((tmp_path / "out").glob("checkpoint_*"))


@trains
def test_benchmark_data_puts_the_folder_the_local_shards_and_the_s3_shards_side_by_side(shards, s3, tmp_path_factory,
                                                                                         capsys):
    """``python -m scripts.benchmark_data --sources`` (the benchmarks part, where the project has it): the training
    loader from the corpus folder, its shards in a folder and on S3, each feeding 2 train steps: a row each
    (utterances/s, the data wait a step and its share, the step) and a table of the three side by side."""
    benchmark_data = pytest.importorskip("scripts.benchmark_data", reason="the project has no benchmarks part")
    corpus = demo_corpus(tmp_path_factory, "ljspeech", speakers=1, n=12)
    code = benchmark_data.main(["--sources", "--dataset-path", str(corpus), "--shards", str(shards), s3, "--model",
                                SHARD_MODEL, "--device", "cpu", "--steps", "2", "--set", "data.max_duration=4", "--set",
                                "data.num_workers=0", "--no-progress"])
    said = capsys.readouterr()
    assert code == 0, said.err[-2000:]
    rows = [json.loads(line) for line in said.out.splitlines() if line.startswith("{")]
    assert [(row["case"], row["source"]) for row in rows] == [(f"source_{SHARD_MODEL}_{kind}", str(where)) for kind, where
                                                            in (("folder", corpus), ("shards", shards), ("s3", s3))]
    assert all(row["utterances_per_s"] > 0 and 0 <= row["data_wait_share"] < 1 and row["steps"] == 2 for row in rows)
    assert "| source | folder | shards | s3 |" in said.out and "| utterances/s |" in said.out, said.out
