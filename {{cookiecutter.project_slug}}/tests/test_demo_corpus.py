"""Tests of scripts.make_demo_corpus in the core's layouts, LJSpeech's and filelists (a part's are its own tests'):
each tree as its real corpus ships it (names, folders, sampling rates, index files), written as its reader module's
``DEMO`` gives it, speakers in distinct voices, LJSpeech's output as it always was, and bad arguments refused in one
line before any file is written."""

import contextlib
import hashlib
import io
import shutil
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import demo_corpus, read_ljspeech

from scripts import make_demo_corpus as demo
from utils.data.audio import load_wav
from utils.data.corpora import filelist, ljspeech, load_splits
from utils.data.corpus import Corpus, DataConfig
from utils.data.sources import clip_samples, read_audio

SR = 22050


def need_engine():
    if not (shutil.which("flite") or shutil.which("espeak-ng")):
        pytest.skip("neither flite nor espeak-ng is installed, so no demo corpus can be spoken")


def files(root) -> dict[str, bytes]:
    """Every file under ``root``: its path relative to ``root`` -> its bytes' SHA-256."""
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(Path(root).rglob("*")) if path.is_file()}


# --- the layouts (2 speakers, 4 utterances: speaker k speaks utterances k and k + 2) -------------------------------

READERS = (("19", "198"), ("26", "495"))
"""The LibriVox ids of a layout's first 2 speakers, where it names none of its own."""
TREES = {
    "ljspeech": ["metadata.csv"] + [f"wavs/LJ_DEMO_{i:04d}.wav" for i in (1, 2, 3, 4)],
    "filelist": ["filelists/train.txt", "filelists/val.txt"]
                + [f"wavs/{spk}/{spk}_{n:04d}.wav" for spk, _ in READERS for n in (1, 2)],
}
AUDIO = {"ljspeech": ("WAV", 22050), "filelist": ("WAV", 22050)}
"""Each layout's audio files: format and sampling rate (Hz), as its real corpus's."""


def built(tmp_path_factory, layout: str) -> Path:
    """The corpus of ``layout`` these tests share: 2 speakers (LJSpeech: 1), 4 utterances."""
    need_engine()
    return demo_corpus(tmp_path_factory, layout, speakers=1 if layout == "ljspeech" else 2, n=4)


def writes_the_tree(root: Path, tree: list[str], audio: tuple[str, int]) -> None:
    """``root`` holds the files of ``tree`` alone, each audio file speech (not silence) in mono 16-bit PCM of
    ``audio``'s format and rate."""
    assert sorted(files(root)) == sorted(tree)
    for path in (root / name for name in tree if name.endswith((".wav", ".flac"))):
        info = sf.info(str(path))
        assert (info.format, info.samplerate, info.channels, info.subtype) == (*audio, 1, "PCM_16"), path
        assert info.duration > 0.5 and np.abs(sf.read(str(path))[0]).max() > 0.01, path  # speech, not silence


def reads_as_written(root: Path, layout: str, data: DataConfig, names: tuple[str, str], tolerance: int = 0) -> None:
    """The corpus readers of ``data`` (``data.format=auto``; the filelists too, in ``filelists/``), left to find the
    layout of the 4-utterance corpus at ``root``, name ``layout`` and read its utterances, each with its text and
    speaker (``names``: the 2 speakers'), the last validating; every clip decodes, at the model's rate, to the length
    its metadata gives (headers exactly; where it gives seconds, not samples, to ``tolerance`` samples)."""
    notes = []
    train, val = load_splits(data, notes=notes)
    assert notes[0].startswith(f"data.format=auto: found the {layout} layout in {root} (")
    assert (len(train), len(val)) == (3, 1)
    assert sorted((u.text, u.speaker) for u in [*train, *val]) == \
        sorted((demo.DEMO_SENTENCES[i], names[i % 2]) for i in range(4))
    both = Corpus.join([train, val])
    decoded = [len(read_audio(source, SR)) for source in both.audio.tolist()]
    assert np.abs(np.array(decoded) - clip_samples(both, SR)).max() <= tolerance, (decoded, clip_samples(both, SR))


@pytest.mark.parametrize("layout", TREES)
def test_each_layout_writes_the_tree_of_its_corpus(tmp_path_factory, layout):
    writes_the_tree(built(tmp_path_factory, layout), TREES[layout], AUDIO[layout])


@pytest.mark.parametrize("layout", TREES)
def test_data_format_auto_reads_each_layout_as_written(tmp_path_factory, layout):
    root = built(tmp_path_factory, layout)
    reads_as_written(root, layout, DataConfig(dataset_path=str(root)), ("LJ", "LJ") if layout == "ljspeech" else
                     ("19", "26"))


def test_each_layout_is_written_as_its_reader_module_gives_it():
    """The core's layouts are their reader modules' ``DEMO`` (the script names none), at their corpus's rate, which
    ``--help`` names."""
    assert demo.LAYOUTS["ljspeech"] is ljspeech.DEMO and demo.LAYOUTS["filelist"] is filelist.DEMO
    assert list(demo.LAYOUTS)[:2] == ["ljspeech", "filelist"]
    with pytest.raises(SystemExit), contextlib.redirect_stdout(io.StringIO()) as said:
        demo.main(["--help"])
    assert "LJSpeech 22050" in " ".join(said.getvalue().split())


def test_filelists_list_path_speaker_and_text(tmp_path_factory):
    root = built(tmp_path_factory, "filelist")
    train, val = ((root / "filelists" / name).read_text().splitlines() for name in ("train.txt", "val.txt"))
    assert train[1] == f"wavs/26/26_0001.wav|26|{demo.DEMO_SENTENCES[1]}" and len(train) == 3
    assert val == [f"wavs/26/26_0002.wav|26|{demo.DEMO_SENTENCES[3]}"]  # the last max(1, 4 // 10)


def test_speakers_speak_in_distinct_voices(tmp_path, monkeypatch):
    """Four speakers each say one sentence twice (at two speeds): each speaker's long-term average spectrum stays
    closer to its own than to any other speaker's."""
    need_engine()
    monkeypatch.setattr(demo, "DEMO_SENTENCES", ("One short sentence.",))
    assert demo.main(["--output", str(tmp_path), "--layout", "filelist", "--speakers", "4", "--num-utterances", "9",
                      "--sampling-rate", "16000"]) == 0
    spectra = {}
    for path in sorted((tmp_path / "wavs").glob("*/*.wav")):
        mel = librosa.feature.melspectrogram(y=load_wav(path, 16000).numpy(), sr=16000, n_mels=40)
        average = np.log(mel[:, mel.sum(0) > 1e-3 * mel.sum(0).max()] + 1e-8).mean(axis=1)
        spectra.setdefault(path.parent.name, []).append(average - average.mean())
    assert sorted(spectra) == ["19", "26", "27", "32"]
    within = max(np.linalg.norm(first - second) for first, second, *_ in spectra.values())
    means = [np.mean(each, axis=0) for each in spectra.values()]
    between = min(np.linalg.norm(a - b) for i, a in enumerate(means) for b in means[i + 1:])
    assert within < between / 2, (within, between)


# --- LJSpeech, as it always was ------------------------------------------------------------------------------------

def test_make_demo_corpus_builds_a_readable_corpus(tmp_path):
    need_engine()
    out = tmp_path / "demo"
    assert demo.main(["--output", str(out), "--num-utterances", "3", "--sampling-rate", str(SR), "--seed", "0"]) == 0
    utts = read_ljspeech(out)
    assert [u.id for u in utts] == ["LJ_DEMO_0001", "LJ_DEMO_0002", "LJ_DEMO_0003"]
    assert [u.text for u in utts] == list(demo.DEMO_SENTENCES[:3])
    for utt in utts:
        info = sf.info(str(utt.audio))
        assert (info.samplerate, info.channels, info.subtype) == (SR, 1, "PCM_16")
        assert info.duration > 0.5
        assert float(load_wav(utt.audio, SR).abs().max()) > 0.01  # speech, not silence


def test_the_ljspeech_layout_of_one_speaker_is_the_default_to_the_byte(tmp_path, tmp_path_factory):
    default = tmp_path / "default"
    assert demo.main(["--output", str(default), "--num-utterances", "4"]) == 0
    assert files(default) == files(built(tmp_path_factory, "ljspeech"))  # --layout ljspeech --speakers 1


def test_make_demo_corpus_varies_repeated_sentences(tmp_path, monkeypatch):
    need_engine()
    monkeypatch.setattr(demo, "DEMO_SENTENCES", ("One short sentence.",))
    out = tmp_path / "demo"
    assert demo.main(["--output", str(out), "--num-utterances", "2", "--sampling-rate", "16000", "--seed", "0"]) == 0
    first, second = (load_wav(u.audio, 16000) for u in read_ljspeech(out))
    assert first.shape != second.shape or not torch.equal(first, second)
    assert {sf.info(str(u.audio)).samplerate for u in read_ljspeech(out)} == {16000}


# --- refusals ------------------------------------------------------------------------------------------------------

def test_make_demo_corpus_refuses_an_existing_corpus(tmp_path, capsys):
    need_engine()
    out = tmp_path / "demo"
    assert demo.main(["--output", str(out), "--num-utterances", "1"]) == 0
    assert demo.main(["--output", str(out), "--num-utterances", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ERROR: ") and "--overwrite" in err[-1]
    assert demo.main(["--output", str(out), "--num-utterances", "2", "--overwrite"]) == 0
    assert len(read_ljspeech(out)) == 2


@pytest.mark.parametrize("args, said", [
    (["--speakers", "2", "--num-utterances", "4"],  # the part's layouts after the core's, where the project has it
     "--layout ljspeech has one speaker (metadata.csv names none); --speakers 2 needs another layout: filelist"),
    (["--layout", "filelist", "--speakers", "3", "--num-utterances", "2"],
     "--speakers must be between 1 and --num-utterances (2), got 3"),
    (["--layout", "filelist", "--speakers", "2", "--num-utterances", "2"],
     "--layout filelist validates on the last max(1, N // 10) utterances: --num-utterances 2 leaves a speaker of 2 "
     "none to train on"),
    (["--layout", "filelist", "--speakers", "13", "--num-utterances", "20"], "--speakers 13: only "),
], ids=["ljspeech-of-2-speakers", "more-speakers-than-utterances", "a-speaker-only-validates", "more-than-the-voices"])
def test_arguments_that_make_no_corpus_are_one_line_before_any_file(tmp_path, capsys, args, said):
    need_engine()
    assert demo.main(["--output", str(tmp_path / "demo"), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ERROR: {said}") and err.count("\n") == 1, err
    assert not (tmp_path / "demo").exists()


def test_make_demo_corpus_without_any_engine(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    assert demo.main(["--output", str(tmp_path / "demo")]) == 1
    assert capsys.readouterr().err.strip() == \
        "ERROR: neither flite nor espeak-ng is installed (apt-get install flite)"
    assert not (tmp_path / "demo").exists()
