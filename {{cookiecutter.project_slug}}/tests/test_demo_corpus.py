"""Tests of scripts.make_demo_corpus: each layout's tree as its real corpus ships it (names, folders, sampling rates,
index files), speakers in distinct voices, LJSpeech's output as it always was, and bad arguments refused in one line
before any file is written."""

import gzip
import hashlib
import io
import json
import shutil
from pathlib import Path

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import demo_corpus, read_ljspeech

from scripts import make_demo_corpus as demo
from parts import DataSettings
from utils.data.audio import load_wav
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus
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

SPEAKERS = {"vctk": ("p225", "p226")}
READERS = (("19", "198"), ("26", "495"))
LIBRITTS = [f"{spk}/{chapter}/{spk}_{chapter}_{para:06d}_000000" for spk, chapter in READERS for para in (0, 1)]
NEMO = ["19_manifest_clean_train.json", "26_manifest_clean_train.json", "26_manifest_clean_dev.json"]
"""HiFi-TTS's manifests of the 2 speakers: the last utterance (speaker 26's second) validates."""
TREES = {
    "ljspeech": ["metadata.csv"] + [f"wavs/LJ_DEMO_{i:04d}.wav" for i in (1, 2, 3, 4)],
    "filelist": ["filelists/train.txt", "filelists/val.txt"]
                + [f"wavs/{spk}/{spk}_{n:04d}.wav" for spk, _ in READERS for n in (1, 2)],
    "vctk": ["speaker-info.txt"] + [f"txt/{spk}/{spk}_{n:03d}.txt" for spk in ("p225", "p226") for n in (1, 2)]
            + [f"wav48_silence_trimmed/{spk}/{spk}_{n:03d}_{mic}.flac"
               for spk in ("p225", "p226") for n in (1, 2) for mic in ("mic1", "mic2")],
    "libritts": ["speakers.tsv"] + [f"train-clean-100/{spk}/{chapter}/{spk}_{chapter}.trans.tsv" for spk, chapter in READERS]
                + [f"train-clean-100/{utt}{suffix}" for utt in LIBRITTS
                   for suffix in (".normalized.txt", ".original.txt", ".wav")],
    "nemo": NEMO + [f"audio/{spk}_clean/{chapter}/{spk}_{n:04d}.flac" for spk, chapter in READERS for n in (1, 2)],
    "parquet": ["clean/train.clean.100/0000.parquet"],
    "lhotse": ["cuts.jsonl.gz"] + [f"recordings/{utt.split('/')[0]}/{utt.split('/')[-1]}.wav" for utt in LIBRITTS],
}
AUDIO = {"ljspeech": ("WAV", 22050), "filelist": ("WAV", 22050), "vctk": ("FLAC", 48000), "libritts": ("WAV", 24000),
         "nemo": ("FLAC", 44100), "lhotse": ("WAV", 24000)}
"""Each layout's audio files: format and sampling rate (Hz), as its real corpus's (the parquet's: tested below)."""
EACH_LAYOUT = [pytest.param(layout, marks=pytest.mark.slow) if layout in ("parquet", "lhotse") else layout
               for layout in TREES]
"""Every layout; those whose libraries take seconds to import (``datasets``, ``lhotse``) in the slow tier."""


def built(tmp_path_factory, layout: str) -> Path:
    """The corpus of ``layout`` these tests share: 2 speakers (LJSpeech: 1), 4 utterances."""
    need_engine()
    return demo_corpus(tmp_path_factory, layout, speakers=1 if layout == "ljspeech" else 2, n=4)


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_each_layout_writes_the_tree_of_its_corpus(tmp_path_factory, layout):
    root = built(tmp_path_factory, layout)
    assert sorted(files(root)) == sorted(TREES[layout])
    for path in (root / name for name in TREES[layout] if name.endswith((".wav", ".flac"))):
        info = sf.info(str(path))
        assert (info.format, info.samplerate, info.channels, info.subtype) == (*AUDIO[layout], 1, "PCM_16"), path
        assert info.duration > 0.5 and np.abs(sf.read(str(path))[0]).max() > 0.01, path  # speech, not silence


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_data_format_auto_reads_each_layout_as_written(tmp_path_factory, layout):
    """The corpus readers, left to find the layout (``data.format=auto``, the default section: the filelists too, in
    ``filelists/``), name the layout
    written and read its 4 utterances, each with its text and speaker (LJSpeech's one), the last validating; every
    clip decodes, at the model's rate, to the length its metadata gives (headers exactly, manifests to the sample)."""
    root = built(tmp_path_factory, layout)
    notes = []
    train, val = load_splits(DataSettings(dataset_path=str(root)), notes=notes)  # filelists/train.txt and val.txt
    assert notes[0].startswith(f"data.format=auto: found the {layout} layout in {root} (")
    names = {"ljspeech": ("LJ", "LJ"), "vctk": ("p225", "p226")}.get(layout, ("19", "26"))
    assert (len(train), len(val)) == (3, 1)
    assert sorted((u.text, u.speaker) for u in [*train, *val]) == \
        sorted((demo.DEMO_SENTENCES[i], names[i % 2]) for i in range(4))
    both = Corpus.join([train, val])
    decoded = [len(read_audio(source, SR)) for source in both.audio.tolist()]
    tolerance = 1 if layout in ("nemo", "lhotse") else 0  # durations in seconds, not samples
    assert np.abs(np.array(decoded) - clip_samples(both, SR)).max() <= tolerance, (decoded, clip_samples(both, SR))


def test_vctk_has_its_texts_speaker_list_and_second_microphone(tmp_path_factory):
    root = built(tmp_path_factory, "vctk")
    assert (root / "txt/p226/p226_002.txt").read_text() == demo.DEMO_SENTENCES[3] + "\n"
    rows = [line.split() for line in (root / "speaker-info.txt").read_text().splitlines()]
    assert rows[0] == ["ID", "AGE", "GENDER", "ACCENTS", "REGION", "COMMENTS"]
    assert [row[0] for row in rows[1:]] == ["p225", "p226"] and {row[2] for row in rows[1:]} <= {"F", "M"}
    mic1, _ = sf.read(str(root / "wav48_silence_trimmed/p225/p225_001_mic1.flac"))
    mic2, _ = sf.read(str(root / "wav48_silence_trimmed/p225/p225_001_mic2.flac"))
    assert np.abs(mic2 - 0.5 * mic1).max() <= 1 / 32768  # mic2: the same at half the amplitude


def test_libritts_has_its_texts_and_speaker_list(tmp_path_factory):
    root = built(tmp_path_factory, "libritts") / "train-clean-100"
    utt = "26_495_000001_000000"  # speaker 26's second: the corpus's fourth utterance
    for kind in ("normalized", "original"):
        assert (root / f"26/495/{utt}.{kind}.txt").read_text() == demo.DEMO_SENTENCES[3]
    assert (root / "26/495/26_495.trans.tsv").read_text().splitlines()[1] == "\t".join([utt, *[demo.DEMO_SENTENCES[3]] * 2])
    speakers = (root.parent / "speakers.tsv").read_text().splitlines()
    assert speakers[0] == "READER\tGENDER\tSUBSET\tNAME" and [row.split("\t")[0] for row in speakers[1:]] == ["19", "26"]


def test_filelists_and_nemo_manifests_list_path_speaker_and_text(tmp_path_factory):
    root = built(tmp_path_factory, "filelist")
    train, val = ((root / "filelists" / name).read_text().splitlines() for name in ("train.txt", "val.txt"))
    assert train[1] == f"wavs/26/26_0001.wav|26|{demo.DEMO_SENTENCES[1]}" and len(train) == 3
    assert val == [f"wavs/26/26_0002.wav|26|{demo.DEMO_SENTENCES[3]}"]  # the last max(1, 4 // 10)
    root = built(tmp_path_factory, "nemo")
    rows = [json.loads(line) for name in NEMO for line in (root / name).read_text().splitlines()]
    assert [row["speaker"] for row in rows] == [19, 19, 26, 26]
    assert [row["text"] for row in rows] == [demo.DEMO_SENTENCES[i] for i in (0, 2, 1, 3)]
    for row in rows:
        assert set(row) == {"audio_filepath", "duration", "text", "text_normalized", "speaker"}
        assert row["text_normalized"] == row["text"] and row["audio_filepath"].startswith(f"audio/{row['speaker']}_clean/")
        assert row["duration"] == sf.info(str(root / row["audio_filepath"])).duration


@pytest.mark.slow  # datasets and lhotse take seconds to import
def test_the_parquet_loads_with_datasets_as_libritts_r_on_the_hub(tmp_path_factory, tmp_path):
    from datasets import Audio, Dataset

    table = Dataset.from_parquet(str(built(tmp_path_factory, "parquet") / "clean/train.clean.100/0000.parquet"),
                                 cache_dir=str(tmp_path))
    assert table.column_names == ["audio", "text_normalized", "text_original", "speaker_id", "path", "chapter_id", "id"]
    assert table.features["audio"] == Audio(sampling_rate=24000)
    rows = table.cast_column("audio", Audio(decode=False))
    assert rows["speaker_id"] == ["19", "26", "19", "26"] and rows["chapter_id"] == ["198", "495", "198", "495"]
    assert rows["id"][3] == "26_495_000001_000000" and rows["text_normalized"][3] == demo.DEMO_SENTENCES[3]
    for row in rows:
        assert row["audio"]["path"] == row["path"] == f"{row['id']}.wav"
        info = sf.info(io.BytesIO(row["audio"]["bytes"]))
        assert (info.format, info.samplerate, info.channels) == ("WAV", 24000, 1) and info.duration > 0.5


@pytest.mark.slow  # datasets and lhotse take seconds to import
def test_the_lhotse_cutset_loads_with_lhotse(tmp_path_factory):
    from lhotse import load_manifest_lazy

    root = built(tmp_path_factory, "lhotse")
    with gzip.open(root / "cuts.jsonl.gz", "rt") as file:
        assert len(file.read().splitlines()) == 4
    cuts = list(load_manifest_lazy(root / "cuts.jsonl.gz"))
    assert [cut.supervisions[0].speaker for cut in cuts] == ["19", "26", "19", "26"]
    for cut, text in zip(cuts, demo.DEMO_SENTENCES):
        (supervision,), (source,) = cut.supervisions, cut.recording.sources
        assert (supervision.text, supervision.language, supervision.recording_id) == (text, "English", cut.recording.id)
        assert source.type == "file" and source.source == f"recordings/{supervision.speaker}/{cut.recording.id}.wav"
        assert cut.sampling_rate == 24000 and cut.duration == sf.info(str(root / source.source)).duration


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


def test_overwrite_leaves_no_speaker_of_the_corpus_replaced(tmp_path, capsys):
    """A folder-per-speaker layout rebuilt with fewer speakers keeps no folder of the others (a reader would take an
    empty one for a speaker without text)."""
    need_engine()
    vctk = ["--output", str(tmp_path), "--layout", "vctk", "--sampling-rate", "16000"]
    assert demo.main([*vctk, "--speakers", "3", "--num-utterances", "3"]) == 0
    assert demo.main([*vctk, "--speakers", "2", "--num-utterances", "2"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (f"ERROR: {tmp_path} already holds a corpus "
                                                                "(speaker-info.txt); pass --overwrite to replace it")
    assert demo.main([*vctk, "--speakers", "2", "--num-utterances", "2", "--overwrite"]) == 0
    assert sorted(files(tmp_path)) == ["speaker-info.txt", "txt/p225/p225_001.txt", "txt/p226/p226_001.txt",
                                       "wav48_silence_trimmed/p225/p225_001_mic1.flac",
                                       "wav48_silence_trimmed/p225/p225_001_mic2.flac",
                                       "wav48_silence_trimmed/p226/p226_001_mic1.flac",
                                       "wav48_silence_trimmed/p226/p226_001_mic2.flac"]
    assert sorted(path.name for path in (tmp_path / "txt").iterdir()) == ["p225", "p226"]


@pytest.mark.parametrize("args, said", [
    (["--speakers", "2", "--num-utterances", "4"],
     "--layout ljspeech has one speaker (metadata.csv names none); --speakers 2 needs another layout: filelist, vctk, "
     "libritts, nemo, parquet, lhotse"),
    (["--layout", "vctk", "--speakers", "3", "--num-utterances", "2"],
     "--speakers must be between 1 and --num-utterances (2), got 3"),
    (["--layout", "nemo", "--speakers", "2", "--num-utterances", "2"],
     "--layout nemo validates on the last max(1, N // 10) utterances: --num-utterances 2 leaves a speaker of 2 none "
     "to train on"),
    (["--layout", "libritts", "--speakers", "13", "--num-utterances", "13"], "--speakers 13: only "),
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
