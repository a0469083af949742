"""Bad input through the real command lines of train.py, inference.py and multiproc.py: one ``ERROR:`` line that
names the culprit, a non-zero exit, and nothing already written lost.

Most cases call ``train.main(argv)`` / ``inference.main(argv)`` in this process (the code ``python train.py``
runs, without paying the interpreter start-up each time); a few run ``python train.py`` / ``python
inference.py`` as real processes to check the exit status, the whole of stderr and a DataLoader worker's
error. Each case checks that exactly one line starts with ``ERROR:``, that no traceback was printed, and
where there was something to lose, that every file of the output folder is byte-for-byte what it was.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import ROOT, TEST_MODEL, OpensAFile, bound, clean_env, made_once, read_ljspeech, synth_corpus
from pydantic import Field

import inference
import multiproc
import train
from model import adam
from models import MODELS
from parts import PARTS, DataSettings
from utils.config import ConfigError
from utils.data import check as data_check
from utils.data.corpora import readers
from utils.data.corpus import DataError
from utils.training.checks import check_settings

MODEL = TEST_MODEL
CONFIG = os.path.join(ROOT, "config.json")
# The tiny config, with a smaller STFT and mel count: WaveGlow's upsampler shrinks from 6.5 M to 0.4 M weights,
# its checkpoints from 80 MB to 6 MB. Nothing here is about the model's size.
BASE = ["--config", CONFIG, "--model", MODEL, "--tiny", "--max-steps", "2", "--set", "data.num_workers=0",
        "--set", "audio.n_fft=256", "--set", "audio.win_length=256", "--set", "audio.n_mels=40"]
# A corpus of 5: the last one validates, the other 4 are every training batch of the tiny configs.
N_UTTERANCES = 5


# --- helpers ----------------------------------------------------------------------------------------------

def run_train(capsys, *argv):
    """``train.main`` in this process; returns (exit code, stdout, stderr). Restores the signal handlers."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        code = train.main([*BASE, *argv])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out, err = capsys.readouterr()
    return code, out, err


def the_error(code, err, out=""):
    """The one ``ERROR:`` line of a failed run (asserting there is exactly one and no traceback)."""
    assert code != 0, f"exit code {code}\n{out}\n{err}"
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err + out, err
    return errors[0]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` -> sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def rewrite_wav(path: Path, sampling_rate: int, channels: int) -> None:
    """Replace a 22.05 kHz mono wav by the same sound at another rate and/or in stereo."""
    import librosa
    audio, rate = sf.read(path, dtype="float32")
    if sampling_rate != rate:
        audio = librosa.resample(audio, orig_sr=rate, target_sr=sampling_rate)
    if channels == 2:
        audio = np.stack([audio, 0.5 * audio], axis=1)
    sf.write(path, audio, sampling_rate, subtype="PCM_16")


def wav_of(corpus: Path, index: int) -> Path:
    return corpus / "wavs" / f"SYN-{index:04d}.wav"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return synth_corpus(tmp_path_factory.mktemp("corpus"), n=N_UTTERANCES)


@pytest.fixture
def own_corpus(corpus, tmp_path):
    """A copy of the corpus that a test may damage."""
    return Path(shutil.copytree(corpus, tmp_path / "corpus"))


@pytest.fixture
def precious(tmp_path):
    """An output folder holding an earlier run's files (their content is never read by a run that fails
    before resuming)."""
    out = tmp_path / "precious"
    (out / "tensorboard").mkdir(parents=True)
    (out / "checkpoint_last.pt").write_bytes(os.urandom(4096))
    (out / "checkpoint_7.pt").write_bytes(os.urandom(4096))
    (out / "metrics.jsonl").write_text('{"step": 7, "loss": 1.0}\n')
    (out / "config.json").write_text("{}")
    (out / "tensorboard" / "events.out.tfevents.1").write_bytes(b"events")
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real 2-step run whose corpus mixes 16 kHz, 44.1 kHz and stereo wavs (resampled and down-mixed on
    the fly): it must succeed. Returns (output folder, snapshot of it), once per session (:func:`conftest.made_once`)."""
    def run(root):
        corpus = synth_corpus(root / "corpus", n=N_UTTERANCES)
        for index, (rate, channels) in {1: (16000, 1), 2: (22050, 2), 3: (44100, 2), 5: (16000, 2)}.items():
            rewrite_wav(wav_of(corpus, index), rate, channels)
        assert sf.info(str(wav_of(corpus, 2))).channels == 2 and sf.info(str(wav_of(corpus, 1))).samplerate == 16000
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
        try:
            code = train.main([*BASE, "--dataset-path", str(corpus), "--output-dir", str(root / "out")])
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        assert code == 0
        return snapshot(root / "out")
    root, before = made_once(tmp_path_factory, "finished", run)
    return root / "out", before


def linked_copy(folder: Path, dest: Path) -> Path:
    """A copy of ``folder``; checkpoints are hard links (instant; they are only ever replaced, which breaks the
    link, never rewritten in place), the other files real copies (train.py rewrites config.json in place)."""
    def copy(src, dst):
        return os.link(src, dst) if src.endswith(".pt") else shutil.copy2(src, dst)
    return Path(shutil.copytree(folder, dest, copy_function=copy))


# --- the good-but-unusual input: other sampling rates and stereo ------------------------------------------

def test_other_sampling_rates_and_stereo_are_resampled_and_mixed_down(finished):
    out, files = finished
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and np.isfinite(rows[-1]["loss"])
    assert {"checkpoint_last.pt", "checkpoint_2.pt", "metrics.jsonl"} <= set(files)


# --- config -----------------------------------------------------------------------------------------------

def write_config(tmp_path, edit) -> str:
    config = json.loads(Path(CONFIG).read_text())
    edit(config)
    path = tmp_path / "my_config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["train"].update(max_step=5),
     "unknown key 'train.max_step' (keys of 'train': seed, precision, max_steps"),
    (lambda c: c["train"].update(max_steps="many"), "config key 'train.max_steps' must be int, got str 'many'"),
    (lambda c: c["train"].update(cudnn_benchmark="yes"),
     "config key 'train.cudnn_benchmark' must be bool or None, got str 'yes'"),
    (lambda c: c.update(trian={}), "unknown section 'trian'"),
    (lambda c: c["tiny"]["train"].update(precision="fp64"),
     "(tiny block): config key 'train.precision' must be one of fp32, tf32, bf16, fp16, got 'fp64'"),
])
def test_a_bad_config_file_names_the_file_and_the_key(capsys, tmp_path, precious, corpus, edit, message):
    before = snapshot(precious)
    config = write_config(tmp_path, edit)
    code, out, err = run_train(capsys, "--config", config, "--dataset-path", str(corpus),
                               "--output-dir", str(precious))
    line = the_error(code, err, out)
    assert line.startswith(f"ERROR: {config}") and message in line, line
    assert snapshot(precious) == before


@pytest.mark.parametrize("setting, message", [
    ("train.max_stepz=3", "--set train.max_stepz=3: unknown key 'train.max_stepz' (keys of 'train': seed,"),
    ("nosection.key=3", "--set nosection.key=3: unknown section 'nosection' (known: audio, data, train,"),
    ("train.log_interval=abc", "--set train.log_interval=abc: config key 'train.log_interval' must be int, got str 'abc'"),
    ("data.num_workers=1.5", "config key 'data.num_workers' must be int, got float 1.5"),
    ("train.keep_last=-1", "--set train.keep_last=-1: config key 'train.keep_last' must be >= 0, got -1"),
    ("train.dist_timeout_s=0", "config key 'train.dist_timeout_s' must be > 0, got 0.0"),
    ("train.on_nonfinite=ignore", "config key 'train.on_nonfinite' must be one of skip, stop, got 'ignore'"),
    (f"{MODEL}.batch_size=0", f"config key '{MODEL}.batch_size' must be >= 1, got 0"),
    ("train.max_steps", "--set expects section.key=value, got 'train.max_steps'"),
    # a project generated without sharded training refuses its keys naming the part (with it, its own tests check them)
    *([] if PARTS.run.sharding is not None else
      [("train.parallelism=fsdp", "--set train.parallelism=fsdp: keys of parts this project was generated without: "
                                  "train.parallelism (sharding); leave them out, or bring the parts back with cruft "
                                  """update --variables-to-update '{"sharding": "yes"}'""")]),
])
def test_a_bad_set_is_named(capsys, precious, corpus, setting, message):
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--set", setting, "--dataset-path", str(corpus), "--output-dir", str(precious))
    line = the_error(code, err, out)
    assert message in line, line
    assert snapshot(precious) == before


def test_a_missing_config_file_is_named(capsys, tmp_path):
    code, out, err = run_train(capsys, "--config", str(tmp_path / "nope.json"))
    assert the_error(code, err, out) == f"ERROR: config file not found: {tmp_path / 'nope.json'}"


def with_hook(spec, hook: str, function):
    """``spec`` with its ``build_model`` or its ``training.build_datasets`` (``hook``) replaced by ``function``."""
    if hook == "build_model":
        return dataclasses.replace(spec, build_model=function)
    return dataclasses.replace(spec, training=dataclasses.replace(spec.training, **{hook: function}))


@pytest.mark.parametrize("hook", ["build_model", "build_datasets"])
def test_a_value_the_model_refuses_is_one_line_naming_its_section(capsys, corpus, tmp_path, monkeypatch, hook):
    """A model's builder raising ValueError (what a model does with a value its config type allows but it
    cannot use) is a config error of the model's section."""
    def refuse(cfg):
        raise ValueError("width must be even, got 7")
    monkeypatch.setitem(MODELS, MODEL, with_hook(MODELS[MODEL], hook, refuse))
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"))
    assert the_error(code, err, out) == f"ERROR: rank 0: {MODEL} config: width must be even, got 7"


@pytest.mark.parametrize("batching", ["buckets", "frames"])
@pytest.mark.parametrize("variable_length", [False, True])
def test_batches_by_length_for_a_model_of_fixed_length_items_are_refused(variable_length, batching):
    cfg = train.load_run_config(train.parse_args(["--set", f"data.batching={batching}", "--set", "data.max_frames=9"]))
    spec = MODELS[MODEL]
    spec = dataclasses.replace(spec, training=dataclasses.replace(spec.training, variable_length=variable_length))
    if variable_length:
        check_settings(spec, cfg, PARTS.checks)
        return
    with pytest.raises(ConfigError, match=f"data.batching={batching}: model '{MODEL}' trains on items of one length"):
        check_settings(spec, cfg, PARTS.checks)  # before any model, process group or data


def test_frame_budgets_without_a_budget_are_one_line_before_any_work(capsys, tmp_path):
    code, out, err = run_train(capsys, "--set", "data.batching=frames", "--output-dir", str(tmp_path / "out"))
    assert the_error(code, err, out) == (
        "ERROR: --set data.batching=frames: config key 'data.max_frames' must be > 0 with data.batching=frames: the "
        "padded mel frames a GPU takes per micro-batch (the manual's \"Frame budgets\" says how to choose them)")
    assert not (tmp_path / "out").exists()


def test_a_model_section_declaring_its_own_rate_for_the_default_optimizer_is_refused():
    """A model of one's own written before the ``optimizer`` section declares ``learning_rate`` in its section: the
    default Adam, which reads ``optimizer.lr``, would leave it unread, so it is one line before any work."""
    spec = MODELS[MODEL]

    class Older(spec.config_cls):
        learning_rate: float = Field(3e-3, gt=0)
    older = dataclasses.replace(spec, config_cls=Older,
                                training=dataclasses.replace(spec.training, build_optimizer=adam))
    cfg = train.load_run_config(train.parse_args([]))
    with pytest.raises(ConfigError) as info:
        check_settings(older, cfg, PARTS.checks)
    assert str(info.value) == (f"{MODEL}.learning_rate (now optimizer.lr): model '{MODEL}' declares it in its section, "
                               "which the default optimizer does not read since it moved (see CHANGELOG); take it out "
                               "of the section and give the model's own value in its ModelSpec.recipe")
    check_settings(spec, cfg, PARTS.checks)


def test_a_bad_launcher_environment_is_one_line(capsys, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")  # without WORLD_SIZE
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"))
    assert "WORLD_SIZE is not set although RANK is" in the_error(code, err, out)


# --- data -------------------------------------------------------------------------------------------------

def test_a_missing_dataset_folder_is_named(capsys, tmp_path, precious):
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--dataset-path", str(tmp_path / "no_corpus"), "--output-dir", str(precious))
    assert the_error(code, err, out) == f"ERROR: rank 0: dataset folder not found: {tmp_path / 'no_corpus'} (get " \
                                        "LJSpeech with scripts/dataset.sh data, or a small demo corpus with python -m " \
                                        "scripts.make_demo_corpus --output data/demo, or point --dataset-path at " \
                                        "a corpus's root folder: data.format names its layout)"
    assert snapshot(precious) == before


def test_a_run_that_fails_before_writing_leaves_no_empty_output_folder(capsys, tmp_path):
    out = tmp_path / "new_out"
    code, out_text, err = run_train(capsys, "--dataset-path", str(tmp_path / "no_corpus"), "--output-dir", str(out))
    assert "dataset folder not found" in the_error(code, err, out_text) and not out.exists()


def test_a_bad_argument_of_train_py_is_one_line_and_exit_2(capsys):
    code, out, err = run_train(capsys, "--max-steps", "many")
    assert code == 2 and err.splitlines() == ["ERROR: argument --max-steps: invalid int value: 'many' (python "
                                              "train.py --help lists the options)"], err


def test_an_empty_dataset_folder_names_the_layouts_it_is_not_in(capsys, tmp_path, precious):
    """A folder in no layout ``data.format=auto`` knows (here an empty one) is one line naming each layout the project
    reads, in the order ``auto`` tries them; a ``metadata.csv`` makes it LJSpeech's, whose reader names what is wrong
    with it."""
    empty = tmp_path / "empty_corpus"
    empty.mkdir()
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--dataset-path", str(empty), "--output-dir", str(precious))
    trees = "; ".join(f"{name}: {reader.TREE}" for name, reader in readers(DataSettings()).items())
    assert trees.startswith("ljspeech: metadata.csv + wavs/<id>.wav; ") and "; filelist: " in trees
    assert the_error(code, err, out).startswith(f"ERROR: rank 0: {empty} is in no layout data.format=auto knows "
                                                f"({trees}); ")
    code, out, err = run_train(capsys, "--dataset-path", str(empty), "--output-dir", str(precious), "--set",
                               "data.format=ljspeech")
    assert the_error(code, err, out) == f"ERROR: rank 0: metadata file not found: {empty / 'metadata.csv'}"
    (empty / "metadata.csv").write_text("\n\n")
    code, out, err = run_train(capsys, "--dataset-path", str(empty), "--output-dir", str(precious))
    assert the_error(code, err, out) == f"ERROR: rank 0: metadata file is empty: {empty / 'metadata.csv'}"
    assert snapshot(precious) == before


def test_a_row_whose_wav_is_missing_names_the_utterance_and_path(capsys, own_corpus, precious):
    wav_of(own_corpus, 3).unlink()
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--dataset-path", str(own_corpus), "--output-dir", str(precious))
    assert the_error(code, err, out) == (f"ERROR: rank 0: 1 bad clip(s): 'SYN-0003' ({wav_of(own_corpus, 3)}): wav "
                                         f"not found (metadata.csv line 3) (in {own_corpus}); fix or remove them, "
                                         "or set data.on_bad_clip=skip to train without them")
    assert snapshot(precious) == before


@pytest.mark.parametrize("row", ["SYN-0002||", "SYN-0002|   |  "])
def test_an_empty_transcript_names_the_utterance(capsys, own_corpus, precious, row):
    lines = (own_corpus / "metadata.csv").read_text().splitlines()
    lines[1] = row
    (own_corpus / "metadata.csv").write_text("\n".join(lines) + "\n")
    before = snapshot(precious)
    code, out, err = run_train(capsys, "--dataset-path", str(own_corpus), "--output-dir", str(precious))
    assert the_error(code, err, out).startswith(f"ERROR: rank 0: 1 bad clip(s): 'SYN-0002' ({wav_of(own_corpus, 2)}): "
                                                "empty transcript (metadata.csv line 2)")
    assert snapshot(precious) == before


def test_unicode_line_separators_inside_a_transcript_do_not_split_the_row(capsys, own_corpus, tmp_path):
    """Rows end at a newline only: U+2028 or U+0085 inside a transcript stay part of it."""
    lines = (own_corpus / "metadata.csv").read_text().splitlines()
    lines[0] = "SYN-0001|Line\u2028separator and next\x85line.|Line separator and next line."
    lines[1] = lines[1] + "\r"  # a Windows line end on one row
    (own_corpus / "metadata.csv").write_text("\n".join(lines) + "\n")
    utterances = read_ljspeech(own_corpus)
    assert [u.id for u in utterances] == [f"SYN-{i:04d}" for i in range(1, N_UTTERANCES + 1)]
    assert utterances[0].text == "Line separator and next line." and not utterances[1].text.endswith("\r")


def test_an_unreadable_wav_is_named_when_it_is_loaded(capsys, own_corpus, tmp_path):
    wav_of(own_corpus, 2).write_bytes(b"RIFF, but not really a wav file at all" * 20)
    code, out, err = run_train(capsys, "--dataset-path", str(own_corpus), "--output-dir", str(tmp_path / "out"))
    line = the_error(code, err, out)
    assert str(wav_of(own_corpus, 2)) in line and ("cannot read" in line or "header" in line), line
    assert not (tmp_path / "out" / "checkpoint_last.pt").exists()


def test_a_truncated_wav_is_named_at_start_up_and_an_earlier_run_is_kept(real_runs, finished):
    """A real process, about to resume the finished run, finds a wav cut short before training."""
    (code, out, err), (bad, output) = real_runs["truncated"]
    line = the_error(code, err, out)
    assert code == 1
    assert line.startswith(f"ERROR: rank 0: 1 bad clip(s): 'SYN-0004' ({bad}): truncated wav file (data chunk "
                           "declares "), line
    assert "data.on_bad_clip=skip" in line and "resumed from" not in out
    after = snapshot(output)
    for name in ("checkpoint_last.pt", "checkpoint_2.pt", "metrics.jsonl", "val_metrics.jsonl"):
        assert after[name] == finished[1][name], f"{name} changed"
    assert set(finished[1]) <= set(after), "a file of the earlier run is gone"


BAD_CLIPS = {"SYN-0002": "too short: 100 samples", "SYN-0004": "truncated wav file",
             "SYN-0006": "transcript '\U0001F389\U0001F389 \U0001F680' has no letter or digit"}


@pytest.fixture(scope="module")
def bad_corpus(tmp_path_factory):
    """8 clips, 3 of them bad (:data:`BAD_CLIPS`): a 100-sample clip, a wav cut short (its header declares
    more data than the file holds), an emoji-only transcript."""
    corpus = synth_corpus(tmp_path_factory.mktemp("bad_corpus"), n=8)
    sf.write(wav_of(corpus, 2), np.full(100, 0.1, np.float32), 22050, subtype="PCM_16")
    whole = wav_of(corpus, 4).read_bytes()
    wav_of(corpus, 4).write_bytes(whole[:len(whole) // 2])
    metadata = corpus / "metadata.csv"
    metadata.write_text("".join("SYN-0006|\U0001F389\U0001F389 \U0001F680|\U0001F389\U0001F389 \U0001F680\n"
                                if line.startswith("SYN-0006|") else line + "\n"
                                for line in metadata.read_text().splitlines()))
    return corpus


@pytest.mark.parametrize("model", sorted(MODELS))
def test_bad_clips_are_all_named_at_start_up(capsys, bad_corpus, tmp_path, model):
    code, out, err = run_train(capsys, "--model", model, "--dataset-path", str(bad_corpus),
                               "--output-dir", str(tmp_path / "out"))
    line = the_error(code, err, out)
    assert line.startswith("ERROR: rank 0: 3 bad clip(s): "), line
    for clip, reason in BAD_CLIPS.items():
        assert f"'{clip}' ({bad_corpus / 'wavs' / clip}.wav): {reason}" in line, line
    assert "data.on_bad_clip=skip" in line
    assert not (tmp_path / "out" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.slow
def test_bad_clips_are_skipped_and_listed_with_on_bad_clip_skip(capsys, bad_corpus, tmp_path, model):
    code, out, err = run_train(capsys, "--model", model, "--dataset-path", str(bad_corpus),
                               "--output-dir", str(tmp_path / "out"), "--set", "data.on_bad_clip=skip")
    assert code == 0 and "Traceback" not in err, err
    listing = tmp_path / "out" / "skipped_clips.txt"
    assert f"leaving out 3 bad clip(s), listed in {listing}" in err
    rows = [line.split("\t") for line in listing.read_text().splitlines()]
    assert [row[0] for row in rows] == list(BAD_CLIPS)
    assert all(reason in row[2] for row, reason in zip(rows, BAD_CLIPS.values()))
    assert torch.load(tmp_path / "out" / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == 2


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_clip_damaged_after_the_start_up_check_is_one_error_line(capsys, own_corpus, tmp_path, model,
                                                                 monkeypatch):
    """A wav that goes bad while the run is on (the start-up check passed it): one line naming it."""
    monkeypatch.setattr(data_check, "check_corpus", lambda *args, **kwargs: [])
    for index in range(1, N_UTTERANCES + 1):  # whichever clip is drawn first
        wav_of(own_corpus, index).write_bytes(b"RIFF, but not really a wav file at all" * 20)
    code, out, err = run_train(capsys, "--model", model, "--dataset-path", str(own_corpus),
                               "--output-dir", str(tmp_path / "out"))
    line = the_error(code, err, out)
    assert str(own_corpus / "wavs") in line and "SYN-000" in line, line


# --- checkpoints ------------------------------------------------------------------------------------------

def test_resume_from_a_path_that_does_not_exist(capsys, corpus, tmp_path):
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                               "--resume", str(tmp_path / "nope.pt"))
    assert the_error(code, err, out) == f"ERROR: rank 0: --resume {tmp_path / 'nope.pt'}: no such checkpoint"


def test_resume_none_refuses_to_overwrite_an_earlier_run(capsys, finished, corpus, tmp_path):
    out = linked_copy(finished[0], tmp_path / "out")
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out),
                                    "--resume", "none")
    line = the_error(code, err, out_text)
    assert "already holds checkpoints" in line and "--resume auto" in line, line
    assert snapshot(out) == finished[1]


def test_a_checkpoint_of_another_config_names_the_keys_and_shapes(capsys, finished, corpus, tmp_path):
    out = linked_copy(finished[0], tmp_path / "out")
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out),
                                    "--set", "audio.n_mels=20")
    line = the_error(code, err, out_text)
    assert line.startswith(f"ERROR: rank 0: {out / 'checkpoint_last.pt'} does not fit this model: "), line
    assert "shape mismatch: " in line and re.search(r"[(, ]40[,)]", line) and re.search(r"[(, ]20[,)]", line), line
    assert snapshot(out) == finished[1]


def test_a_checkpoint_of_another_model_is_named(capsys, finished, corpus, tmp_path):
    state = torch.load(finished[0] / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    state["model_name"] = "another_model"
    other = tmp_path / "other.pt"
    torch.save(state, other)
    before = other.read_bytes()
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                               "--resume", str(other))
    assert the_error(code, err, out) == f"ERROR: rank 0: {other} holds a 'another_model' model, not '{MODEL}'"
    assert other.read_bytes() == before


def test_a_state_dict_of_another_network_names_missing_and_unexpected_keys(capsys, corpus, tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "model_name": MODEL}, foreign)
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                               "--resume", str(foreign))
    line = the_error(code, err, out)
    assert f"{foreign} does not fit this model: missing: " in line and "unexpected: bias, weight" in line, line


def test_a_weights_only_checkpoint_is_refused_for_resuming(capsys, finished, corpus, tmp_path):
    state = torch.load(finished[0] / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    weights = tmp_path / "weights.pt"
    torch.save({"model": state["model"], "model_name": MODEL}, weights)
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                               "--resume", str(weights))
    assert "optimizer" in the_error(code, err, out)


def evil_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"model": {}, "model_name": MODEL, "step": 1, "payload": OpensAFile(marker)}, path)
    return path


def test_a_pickled_payload_in_checkpoint_last_is_refused_and_kept(capsys, corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    marker = tmp_path / "pwned"
    evil_checkpoint(out / "checkpoint_last.pt", marker)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    before = snapshot(out)
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out))
    line = the_error(code, err, out_text)
    assert line.startswith(f"ERROR: rank 0: cannot load checkpoint {out / 'checkpoint_last.pt'} safely: refused "
                           "by weights_only=True"), line
    assert not marker.exists(), "the payload ran"
    assert snapshot(out) == before


def test_a_truncated_checkpoint_last_is_named_and_kept(capsys, finished, corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint_last.pt").write_bytes((finished[0] / "checkpoint_last.pt").read_bytes()[:100_000])
    before = snapshot(out)
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out))
    line = the_error(code, err, out_text)
    assert line.startswith(f"ERROR: rank 0: every checkpoint in {out} is damaged or unsafe "), line
    assert f"{out / 'checkpoint_last.pt'} is damaged" in line and "nothing was overwritten" in line, line
    assert snapshot(out) == before


@pytest.mark.slow
def test_a_damaged_checkpoint_last_resumes_from_the_newest_intact_numbered_one(capsys, finished, corpus, tmp_path):
    out = linked_copy(finished[0], tmp_path / "out")
    numbered = sorted(out.glob("checkpoint_[0-9]*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    newest = numbered[-1]
    data = bytearray((out / "checkpoint_last.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle: a CRC mismatch
    (out / "checkpoint_last.pt").unlink()
    (out / "checkpoint_last.pt").write_bytes(bytes(data))
    step = torch.load(newest, weights_only=True)["step"]
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out),
                                    "--max-steps", str(step + 1))
    assert code == 0, err
    assert f"{out / 'checkpoint_last.pt'} is damaged" in err and f"resuming from {newest}" in err, err
    assert f"resumed from {newest} at step {step}" in out_text, out_text
    assert torch.load(out / "checkpoint_last.pt", weights_only=True)["step"] == step + 1


def test_a_missing_checkpoint_last_resumes_from_the_numbered_one_and_overwrites_nothing(capsys, finished, corpus,
                                                                                         tmp_path):
    out = linked_copy(finished[0], tmp_path / "out")
    (out / "checkpoint_last.pt").unlink()
    numbered = sorted(out.glob("checkpoint_[0-9]*.pt"), key=lambda p: int(p.stem.split("_")[1]))
    step = torch.load(numbered[-1], weights_only=True)["step"]
    kept = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in numbered}
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out))
    assert code == 0, err
    assert f"resumed from {numbered[-1]} at step {step}" in out_text, out_text
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in numbered} == kept


# --- the output folder ------------------------------------------------------------------------------------

def test_an_output_folder_that_cannot_be_created_is_named(capsys, corpus, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("mine")
    for output in (blocker / "out", blocker):  # below a file; a file itself
        code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(output))
        line = the_error(code, err, out)
        assert line.startswith(f"ERROR: rank 0: output folder {output} is not writable: "), line
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_a_read_only_output_folder_is_named(capsys, corpus, tmp_path):
    out = tmp_path / "read_only"
    out.mkdir()
    out.chmod(0o500)
    try:
        code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out))
    finally:
        out.chmod(0o700)
    assert the_error(code, err, out_text).startswith(f"ERROR: rank 0: output folder {out} is not writable: ")


# --- processes and GPUs -----------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: without GPUs, processes run on the CPU")
def test_more_processes_than_gpus_is_one_line(corpus, tmp_path):
    n = torch.cuda.device_count() + 1
    proc = subprocess.run([sys.executable, "multiproc.py", "--nproc-per-node", str(n), "train.py", *BASE,
                           "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"multiproc: ERROR: --nproc-per-node {n} but only {n - 1} GPU(s) are visible"]
    assert not (tmp_path / "out").exists()


# --- real processes: the whole of stderr and the exit status ----------------------------------------------

@pytest.fixture(scope="module")
def real_runs(finished, corpus, tmp_path_factory):
    """``python train.py`` / ``python inference.py`` runs, started together (they mostly import), once per session
    (:func:`conftest.made_once`): name -> ((exit code, stdout, stderr), what the test needs to know: paths, a
    port)."""
    def run(root):
        runs = {}
        # A wav cut short, found by the start-up check of a run that would resume the finished one.
        corpus_copy = Path(shutil.copytree(corpus, root / "corpus"))
        bad = wav_of(corpus_copy, 4)
        bad.write_bytes(bad.read_bytes()[:3000])
        output = linked_copy(finished[0], root / "out")
        runs["truncated"] = (["train.py", *BASE, "--set", "data.num_workers=1", "--max-steps", "6", "--dataset-path",
                              str(corpus_copy), "--output-dir", str(output)], (bad, output))
        runs["bad_set"] = (["train.py", *BASE, "--set", "train.log_interval=abc", "--dataset-path", str(corpus),
                            "--output-dir", str(root / "never")], root / "never")
        marker = root / "pwned"
        evil = evil_checkpoint(root / "evil.pt", marker)
        runs["evil"] = (["inference.py", "--checkpoint", str(evil), "--output", str(root / "x.wav")],
                        (evil, marker, root / "x.wav"))
        taken = socket.socket()  # a port some other job listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runs["port_taken"] = (["multiproc.py", "--nproc-per-node", "2", "--master-port", str(port), "--log-dir",
                               str(root / "logs"), "train.py", *BASE, "--dataset-path", str(corpus), "--output-dir",
                               str(root / "never2")], (port, root / "never2"))
        procs = {name: subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=clean_env(2))
                 for name, (argv, _) in runs.items()}
        results = {}
        try:
            for name, proc in procs.items():
                out, err = proc.communicate(timeout=300)
                results[name] = ((proc.returncode, out, err), runs[name][1])
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            taken.close()
        return results

    def paths(info):  # back from JSON: the paths were written as strings
        return [Path(x) if isinstance(x, str) else x for x in info] if isinstance(info, list) else Path(info)
    _, results = made_once(tmp_path_factory, "real_runs", run)
    return {name: (outcome, paths(info)) for name, (outcome, info) in results.items()}


@pytest.mark.slow
def test_python_train_py_bad_set_is_exactly_one_line_and_exit_1(real_runs):
    (code, out, err), never = real_runs["bad_set"]
    assert code == 1
    assert err.splitlines() == ["ERROR: --set train.log_interval=abc: config key 'train.log_interval' must be int, "
                                "got str 'abc'"]
    assert out == "" and not never.exists()


@pytest.mark.slow
def test_python_inference_py_refuses_a_pickled_payload(real_runs):
    (code, out, err), (evil, marker, wav) = real_runs["evil"]
    assert code == 1
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"ERROR: cannot load checkpoint {evil} safely: refused by weights_only=True")
    assert not marker.exists() and not wav.exists()


@pytest.mark.slow
def test_multiproc_names_a_master_port_already_in_use(real_runs):
    (code, out, err), (port, never) = real_runs["port_taken"]
    assert code == 1
    assert err.splitlines() == [f"multiproc: ERROR: --master-port {port} is in use on 127.0.0.1 (another job listens "
                                "there); leave --master-port out to take a free port, or choose another one"], err
    assert not never.exists()


# --- inference.py -----------------------------------------------------------------------------------------

def run_inference(capsys, *argv):
    code = inference.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inference_names_a_checkpoint_of_an_unknown_model(capsys, finished, tmp_path):
    state = torch.load(finished[0] / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    state["model_name"] = "another_model"
    other = tmp_path / "other.pt"
    torch.save(state, other)
    code, out, err = run_inference(capsys, "--checkpoint", str(other), "--output", str(tmp_path / "x.wav"))
    assert the_error(code, err, out).startswith(f"ERROR: {other} holds a model 'another_model' that "
                                                "models/__init__.py does not register")


def test_inference_names_a_checkpoint_whose_config_has_an_unknown_key(capsys, finished, tmp_path):
    state = torch.load(finished[0] / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    state["config"]["train"]["from_a_newer_version"] = 1
    other = tmp_path / "newer.pt"
    torch.save(state, other)
    code, out, err = run_inference(capsys, "--checkpoint", str(other), "--output", str(tmp_path / "x.wav"))
    assert "checkpoint config: unknown key 'train.from_a_newer_version'" in the_error(code, err, out)


@pytest.mark.parametrize("device, message", [
    ("gpu0", "--device gpu0: not a device name; use cpu, cuda or cuda:N"),
    ("cuda:99", "--device cuda:99: "),
])
def test_inference_names_a_device_it_cannot_use(capsys, finished, tmp_path, device, message):
    code, out, err = run_inference(capsys, "--checkpoint", str(finished[0] / "checkpoint_last.pt"), "--output",
                                   str(tmp_path / "x.wav"), "--device", device)
    assert the_error(code, err, out).startswith(f"ERROR: {message}")
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is valid here")
def test_inference_names_cuda_on_a_machine_without_it(capsys, finished, tmp_path):
    code, out, err = run_inference(capsys, "--checkpoint", str(finished[0] / "checkpoint_last.pt"), "--output",
                                   str(tmp_path / "x.wav"), "--device", "cuda")
    assert the_error(code, err, out) == ("ERROR: --device cuda: CUDA is not available here (this torch build or "
                                         "machine has no GPU); use --device cpu")


def test_inference_names_an_option_the_checkpoints_model_does_not_take(capsys, finished, tmp_path):
    checkpoint = finished[0] / "checkpoint_last.pt"
    code, out, err = run_inference(capsys, "--checkpoint", str(checkpoint), "--output", str(tmp_path / "x.wav"),
                                   "--no-such-option", "3")
    line = the_error(code, err, out)
    assert line.startswith(f"ERROR: --no-such-option: not an option of {checkpoint}, a {MODEL} checkpoint; it takes "), line
    assert f"(python inference.py --checkpoint {checkpoint} --help)" in line
    others = {name: spec for name, spec in MODELS.items() if name != MODEL and spec.inference is not None
              and (spec.inference.add_args is not None or spec.inference.takes_vocoder)}
    for name, spec in others.items():  # another model's option, given to this model's checkpoint, is named so
        parser = inference.build_parser([name])
        own = inference.build_parser([MODEL])
        flag = next((a.option_strings[0] for a in parser._actions if a.option_strings and not any(
            a.option_strings[0] in b.option_strings for b in own._actions)), None)
        if flag is None:
            continue
        code, out, err = run_inference(capsys, "--checkpoint", str(checkpoint), "--output", str(tmp_path / "x.wav"),
                                       flag, "x")
        assert f"{flag}: not an option of {checkpoint}, a {MODEL} checkpoint (an option of " in the_error(code, err)
    assert not (tmp_path / "x.wav").exists()


def test_inference_names_an_output_folder_that_does_not_exist(capsys, finished, tmp_path):
    target = tmp_path / "missing" / "x.wav"
    code, out, err = run_inference(capsys, "--checkpoint", str(finished[0] / "checkpoint_last.pt"), "--output",
                                   str(target))
    assert the_error(code, err, out) == f"ERROR: --output {target}: the folder {target.parent} does not exist"


def test_resume_from_a_file_that_is_no_checkpoint_says_so(capsys, corpus, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("step 20 looked fine\n")
    code, out, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "out"),
                               "--resume", str(text))
    line = the_error(code, err, out)
    assert line == (f"ERROR: rank 0: --resume {text}: the file is not a checkpoint: a text file: neither a file "
                    "torch.save writes (a zip archive) nor a pickle"), line


# --- every kind of bad clip, in error and skip mode -------------------------------------------------------

def set_row(corpus: Path, index: int, row: str) -> None:
    """Replace row ``index`` (1-based) of metadata.csv."""
    lines = (corpus / "metadata.csv").read_text().splitlines()
    lines[index - 1] = row
    (corpus / "metadata.csv").write_text("\n".join(lines) + "\n")


def _malformed_line(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    set_row(corpus, index, f"{utt} no separator")
    return (f"metadata.csv:{index}", f"{corpus / 'metadata.csv'}:{index}", "malformed line: expected "
            f"'id|raw text|normalized text', got '{utt} no separator'")


def _repeated_id(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    with open(corpus / "metadata.csv", "a") as metadata:
        metadata.write(f"{utt}|Once more.|Once more.\n")
    line = len((corpus / "metadata.csv").read_text().splitlines())
    return f"metadata.csv:{line}", str(wav), f"utterance id '{utt}' appears twice (first on line {index}"


def _empty_transcript(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    set_row(corpus, index, f"{utt}||")
    return utt, str(wav), f"empty transcript (metadata.csv line {index})"


def _emoji_transcript(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    set_row(corpus, index, f"{utt}|\U0001F389 \U0001F680|\U0001F389 \U0001F680")
    return utt, str(wav), "transcript '\U0001F389 \U0001F680' has no letter or digit"


def _missing_wav(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    wav.unlink()
    return utt, str(wav), f"wav not found (metadata.csv line {index})"


def _folder(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    wav.unlink()
    wav.mkdir()
    return utt, str(wav), f"is a folder, not a wav file (metadata.csv line {index})"


def _silent(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    sf.write(wav, np.zeros(13000, np.float32), 22050, subtype="PCM_16")
    return utt, str(wav), "silent: every sample is zero"


def _too_short(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    sf.write(wav, np.full(100, 0.1, np.float32), 22050, subtype="PCM_16")
    return utt, str(wav), "too short: 100 samples"


def _truncated(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    wav.write_bytes(wav.read_bytes()[:3000])
    return utt, str(wav), "truncated wav file (data chunk declares"


def _not_a_sound_file(corpus: Path, index: int, wav: Path, utt: str) -> tuple[str, str, str]:
    wav.write_bytes(b"RIFF, but not really a wav file at all" * 20)
    return utt, str(wav), "unreadable header ("


def _eight_bit(corpus: Path, index: int, wav: Path, utt: str) -> None:
    audio, rate = sf.read(wav, dtype="float32")
    sf.write(wav, audio, rate, subtype="PCM_U8")
    return None


DAMAGES = {"malformed line": _malformed_line, "repeated id": _repeated_id, "empty transcript": _empty_transcript,
           "emoji transcript": _emoji_transcript, "missing wav": _missing_wav, "folder": _folder,
           "silent": _silent, "too short": _too_short, "truncated": _truncated,
           "not a sound file": _not_a_sound_file, "8-bit": _eight_bit}
"""Kind of bad clip -> ``(corpus, index, wav path, utterance id) -> (id, path, reason) | None``: what :func:`damage`
does to the utterance."""


def damage(corpus: Path, index: int, kind: str) -> tuple[str, str, str]:
    """Make utterance ``index`` of ``corpus`` bad in the way ``kind`` says; returns the (id, path, reason) its
    bad clip is listed with (``None`` for the 8-bit clip, which is not bad: soundfile reads it as float).

    Raises:
        ValueError: ``kind`` is not one of :data:`DAMAGES`.
    """
    if kind not in DAMAGES:
        raise ValueError(kind)
    return DAMAGES[kind](corpus, index, wav_of(corpus, index), f"SYN-{index:04d}")


KINDS = ["malformed line", "repeated id", "empty transcript", "emoji transcript", "missing wav", "folder", "silent",
         "too short", "truncated", "not a sound file", "8-bit"]


def tiny_config(corpus: Path, mode: str):
    from parts import config_schemas
    from utils.config import load_config

    return load_config(CONFIG, config_schemas(), tiny=True, overrides=[
        f"data.dataset_path={corpus}", f"data.on_bad_clip={mode}", "data.num_workers=0", "data.val_size=1"])


@pytest.mark.parametrize("mode", ["error", "skip"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_bad_clip_is_named_or_skipped_at_start_up(capsys, own_corpus, tmp_path, monkeypatch, kind, mode):
    """``utils.data.check.prepare_run``, rank 0's start-up check: ``error`` names the clip in one message (a DataError);
    ``skip`` lists it in skipped_clips.txt and a warning line and returns its id, which (in ``data.exclude``) leaves it
    out of both datasets. An 8-bit clip is no bad clip: it is read as float, and it stays in the datasets."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = damage(own_corpus, 3, kind)
    cfg = tiny_config(own_corpus, mode)
    spec = MODELS[MODEL]
    listing = tmp_path / "out" / "skipped_clips.txt"
    if expected is not None and mode == "error":
        clip_id, path, reason = expected
        with pytest.raises(DataError) as refused:
            data_check.prepare_run(cfg, spec, tmp_path / "out")
        found = str(refused.value)
        assert found.startswith(f"1 bad clip(s): '{clip_id}' ({path}): {reason}"), found
        assert found.endswith("fix or remove them, or set data.on_bad_clip=skip to train without them")
        assert not listing.exists()
        return
    found = data_check.prepare_run(cfg, spec, tmp_path / "out")
    err = capsys.readouterr().err
    if expected is None:  # the 8-bit clip
        assert found == [] and not listing.exists() and "warning" not in err
    else:
        clip_id, path, reason = expected
        assert found == [clip_id]
        [row] = [line.split("\t") for line in listing.read_text().splitlines()]
        assert row[:2] == [clip_id, path] and row[2].startswith(reason), row
        assert f"warning: leaving out 1 bad clip(s), listed in {listing} (1 bad clip(s): '{clip_id}' ({path}): " \
               f"{reason}" in err, err
        cfg.data.exclude = found  # what train.py does with the outcome
    datasets = spec.training.build_datasets(cfg)
    ids = [utt.id for dataset in datasets for utt in dataset.corpus]
    if expected is None:
        assert "SYN-0003" in ids
        item = datasets[0][[utt.id for utt in datasets[0].corpus].index("SYN-0003")]
        assert item["id"] == "SYN-0003"
    else:
        assert "SYN-0003" not in ids or kind == "repeated id"  # a repeated id: its first row is fine
    assert len(ids) == N_UTTERANCES - (expected is not None and kind != "repeated id")


ALL_KINDS = {2: "too short", 3: "malformed line", 4: "truncated", 5: "missing wav", 6: "emoji transcript",
             7: "folder", 8: "empty transcript", 9: "silent", 10: "8-bit", 11: "not a sound file", 1: "repeated id"}


@pytest.fixture(scope="module")
def every_bad_clip(tmp_path_factory):
    """16 clips: one of each kind of bad clip (10, and a line repeating SYN-0001's id), an 8-bit clip, 6 fine
    clips. Returns (corpus, the bad clips' (id, path, reason) in the order they are listed: the corpus lines
    (malformed, missing or folder wav, empty transcript, repeated id) in file order, then the clips)."""
    corpus = synth_corpus(tmp_path_factory.mktemp("every_bad_clip"), n=16)
    found = {index: damage(corpus, index, kind) for index, kind in ALL_KINDS.items()}
    lines = [found[i] for i in (3, 5, 7, 8, 1)]
    clips = [found[i] for i in (2, 4, 6, 9, 11)]
    return corpus, lines + clips


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.slow
def test_every_kind_of_bad_clip_at_once_is_skipped_and_the_rest_trains(capsys, every_bad_clip, tmp_path, model):
    corpus, expected = every_bad_clip
    code, out, err = run_train(capsys, "--model", model, "--dataset-path", str(corpus),
                               "--output-dir", str(tmp_path / "out"), "--set", "data.on_bad_clip=skip")
    assert code == 0 and "Traceback" not in err, err
    rows = [line.split("\t") for line in (tmp_path / "out" / "skipped_clips.txt").read_text().splitlines()]
    assert [row[:2] for row in rows] == [[clip_id, path] for clip_id, path, _ in expected]
    assert all(row[2].startswith(reason) for row, (_, _, reason) in zip(rows, expected)), rows
    assert "warning: leaving out 10 bad clip(s)" in err
    # 16 rows and one repeated row, 10 bad: 7 left (the 8-bit clip among them), the last one validates.
    assert "6 train / 1 val utterances" in out
    assert torch.load(tmp_path / "out" / "checkpoint_last.pt", map_location="cpu", weights_only=True)["step"] == 2


@pytest.mark.slow
def test_python_train_py_skips_or_names_every_kind_of_bad_clip(capsys, every_bad_clip, tmp_path):
    """A real ``python train.py --tiny`` process with ``skip`` trains without the 10 bad clips, lists them all and
    exits 0; with ``error`` (``train.main`` in this process: a real process refusing a bad clip with exit status 1 and
    one line is :func:`test_a_truncated_wav_is_named_at_start_up_and_an_earlier_run_is_kept`'s) the run exits 1 with
    one ERROR line naming all 10, and writes no checkpoint."""
    corpus, expected = every_bad_clip
    proc = subprocess.run([sys.executable, "train.py", *BASE, "--dataset-path", str(corpus), "--output-dir",
                           str(tmp_path / "skip"), "--set", "data.on_bad_clip=skip"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=clean_env(1, XDG_CACHE_HOME=str(tmp_path / "cache")))
    runs = {"skip": (proc.returncode, proc.stdout, proc.stderr),
            "error": run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(tmp_path / "error"), "--set",
                               "data.on_bad_clip=error")}
    code, out, err = runs["skip"]
    assert code == 0 and "Traceback" not in err and "ERROR" not in err, err
    listing = tmp_path / "skip" / "skipped_clips.txt"
    assert [line.split("\t")[0] for line in listing.read_text().splitlines()] == [clip[0] for clip in expected]
    [warning] = [line for line in err.splitlines() if line.startswith("warning: leaving out")]
    assert warning.startswith(f"warning: leaving out 10 bad clip(s), listed in {listing} (10 bad clip(s): ")
    assert all(f"'{clip_id}' ({path}): {reason}" in warning for clip_id, path, reason in expected), warning
    assert (tmp_path / "skip" / "checkpoint_last.pt").is_file()
    code, out, err = runs["error"]
    line = the_error(code, err, out)
    assert code == 1 and line.startswith("ERROR: rank 0: 10 bad clip(s): "), line
    assert all(f"'{clip_id}' ({path}): {reason}" in line for clip_id, path, reason in expected), line
    assert "data.on_bad_clip=skip" in line and not (tmp_path / "error" / "checkpoint_last.pt").exists()


# --- what changed between a run and its resume ------------------------------------------------------------

def test_a_config_changed_since_the_checkpoint_is_named_on_resume(capsys, finished, corpus, tmp_path):
    out = linked_copy(finished[0], tmp_path / "out")
    code, out_text, err = run_train(capsys, "--dataset-path", str(corpus), "--output-dir", str(out),
                                    "--max-steps", "3", "--set", "train.grad_clip=0.25")
    assert code == 0, err
    trained = torch.load(finished[0] / "checkpoint_last.pt", weights_only=True)["config"]["train"]["grad_clip"]
    line = next(line for line in err.splitlines() if "the config differs" in line)
    assert f"train.grad_clip: {trained} -> 0.25" in line and "max_steps" not in line, line


def test_a_corpus_changed_since_the_checkpoint_is_named_on_resume(capsys, finished, tmp_path):
    bigger = synth_corpus(tmp_path / "bigger", n=N_UTTERANCES + 4)
    out = linked_copy(finished[0], tmp_path / "out")
    code, out_text, err = run_train(capsys, "--dataset-path", str(bigger), "--output-dir", str(out),
                                    "--max-steps", "3")
    assert code == 0, err
    assert f"the corpus changed since {out / 'checkpoint_last.pt'} ({N_UTTERANCES - 1} -> {N_UTTERANCES + 3} " \
           "training utterances)" in err, err


def test_a_checkpoint_of_an_earlier_version_resumes_and_loads_with_its_optimizer_settings(capsys, finished, tmp_path):
    """A checkpoint written before the ``optimizer`` section recorded the rate and weight decay in every model's
    section and the schedule in ``train``: resumed, it names no change of settings (its model's values are read as the
    ``optimizer`` section's, the other models' left out), and ``inference.py`` loads it with them."""
    saved = torch.load(finished[0] / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    config, optimizer = saved["config"], saved["config"].pop("optimizer")
    config["train"].update(lr_schedule=optimizer["schedule"], warmup_steps=optimizer["warmup_steps"])
    for name in MODELS:  # as the earlier version wrote them
        config[name].update(learning_rate=optimizer["lr"] if name == MODEL else 0.5,
                            weight_decay=optimizer["weight_decay"] if name == MODEL else 0.25)
    torch.save(saved, tmp_path / "old.pt")
    code, out, err = run_train(capsys, "--dataset-path", config["data"]["dataset_path"], "--output-dir",
                               str(tmp_path / "out"), "--resume", str(tmp_path / "old.pt"), "--max-steps", "3")
    assert code == 0 and f"resumed from {tmp_path / 'old.pt'} at step 2" in out, err
    assert "the config differs" not in err, err
    _, _, cfg = inference.load_trained(tmp_path / "old.pt", torch.device("cpu"))
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay) == (optimizer["lr"], optimizer["weight_decay"])


@pytest.mark.parametrize("args, message", [
    (["--dataset-path", "no_corpus_here"], "dataset folder not found: no_corpus_here (get LJSpeech with "
                                           "scripts/dataset.sh data, or a small demo corpus with python -m "
                                           "scripts.make_demo_corpus --output data/demo"),
    (["--set", "train.max_steps=abc"], "--set train.max_steps=abc: config key 'train.max_steps' must be int"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option (python train.py --help lists the options)"),
], ids=["missing-corpus", "bad-set", "bad-option"])
def test_a_bad_training_command_is_one_line_before_any_rank_starts(tmp_path, monkeypatch, capsys, args, message):
    """multiproc asks train.py's check_command_line first: one line, said once, in seconds, no rank started
    (multiproc's main in this process, in the project's folder: the check imports train.py, it starts nothing)."""
    monkeypatch.chdir(ROOT)
    start = time.monotonic()
    code = multiproc.main(["--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), "train.py", "--config",
                           "config.json", "--tiny", "--output-dir", str(tmp_path / "out"), *args])
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    assert code == 1 and out == "", (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("multiproc: ERROR: ") and message in lines[0], err
    assert took < bound(10, 0), (took, err)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "out").exists()


def test_multiproc_inside_a_launcher_that_started_the_processes_is_one_error_line():
    """``multiproc.py`` where ``LOCAL_RANK`` is set (inside the processes torchrun or a platform started) would start a
    second world: refused before anything starts (``utils.launch.check_not_launched``)."""
    env = clean_env(2, RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    done = subprocess.run([sys.executable, "multiproc.py", "train.py", "--config", "config.json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=bound(60, 1))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("multiproc: ERROR: LOCAL_RANK=0 is set") and "train.py itself" in done.stderr
