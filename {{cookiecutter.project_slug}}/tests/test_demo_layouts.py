"""Tests of scripts.make_demo_corpus in the corpora part's layouts (VCTK 0.92, LibriTTS, HiFi-TTS's NeMo manifests, a
Hugging Face parquet, a lhotse CutSet): each written as its reader module's ``DEMO`` gives it, its tree as its real
corpus ships it, read back by the project's readers; the part's layouts on the demo corpus's command line."""

import gzip
import io
import json

import pytest
import soundfile as sf
from test_demo_corpus import built, files, need_engine, reads_as_written, writes_the_tree

from parts import DataSettings
from scripts import make_demo_corpus as demo

READERS = (("19", "198"), ("26", "495"))
"""The LibriVox ids of the 2 speakers, as the layouts but VCTK's name them."""
LIBRITTS = [f"{spk}/{chapter}/{spk}_{chapter}_{para:06d}_000000" for spk, chapter in READERS for para in (0, 1)]
NEMO = ["19_manifest_clean_train.json", "26_manifest_clean_train.json", "26_manifest_clean_dev.json"]
"""HiFi-TTS's manifests of the 2 speakers: the last utterance (speaker 26's second) validates."""
TREES = {
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
AUDIO = {"vctk": ("FLAC", 48000), "libritts": ("WAV", 24000), "nemo": ("FLAC", 44100), "parquet": ("WAV", 24000),
         "lhotse": ("WAV", 24000)}
"""Each layout's audio files: format and sampling rate (Hz), as its real corpus's (the parquet's: tested below)."""
EACH_LAYOUT = [pytest.param(layout, marks=pytest.mark.slow) if layout in ("parquet", "lhotse") else layout
               for layout in TREES]
"""Every layout of the part; those whose libraries take seconds to import (``datasets``, ``lhotse``) in the slow
tier."""


def test_the_part_adds_its_layouts_as_their_reader_modules_give_them():
    """``--layout`` offers the part's layouts after the core's, each its reader module's ``DEMO``, in the order
    ``data.format=auto`` tries them; ``--help`` names the rate of each one's corpus."""
    assert list(demo.LAYOUTS) == ["ljspeech", "filelist", "vctk", "nemo", "lhotse", "libritts", "parquet"]
    assert all(demo.LAYOUTS[name] is reader.DEMO for name, reader in DataSettings.layouts.items())
    assert [demo.LAYOUTS[name].rate for name in TREES] == [rate for _, rate in AUDIO.values()]


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_each_layout_writes_the_tree_of_its_corpus(tmp_path_factory, layout):
    writes_the_tree(built(tmp_path_factory, layout), TREES[layout], AUDIO[layout])


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_data_format_auto_reads_each_layout_as_written(tmp_path_factory, layout):
    """As the core's layouts, read by the project's ``data`` section (every layout it reads)."""
    root = built(tmp_path_factory, layout)
    reads_as_written(root, layout, DataSettings(dataset_path=str(root)), ("p225", "p226") if layout == "vctk" else
                     ("19", "26"), tolerance=1 if layout in ("nemo", "lhotse") else 0)


def test_vctk_has_its_texts_speaker_list_and_second_microphone(tmp_path_factory):
    root = built(tmp_path_factory, "vctk")
    assert (root / "txt/p226/p226_002.txt").read_text() == demo.DEMO_SENTENCES[3] + "\n"
    rows = [line.split() for line in (root / "speaker-info.txt").read_text().splitlines()]
    assert rows[0] == ["ID", "AGE", "GENDER", "ACCENTS", "REGION", "COMMENTS"]
    assert [row[0] for row in rows[1:]] == ["p225", "p226"] and {row[2] for row in rows[1:]} <= {"F", "M"}
    mic1, _ = sf.read(str(root / "wav48_silence_trimmed/p225/p225_001_mic1.flac"))
    mic2, _ = sf.read(str(root / "wav48_silence_trimmed/p225/p225_001_mic2.flac"))
    assert abs(mic2 - 0.5 * mic1).max() <= 1 / 32768  # mic2: the same at half the amplitude


def test_libritts_has_its_texts_and_speaker_list(tmp_path_factory):
    root = built(tmp_path_factory, "libritts") / "train-clean-100"
    utt = "26_495_000001_000000"  # speaker 26's second: the corpus's fourth utterance
    for kind in ("normalized", "original"):
        assert (root / f"26/495/{utt}.{kind}.txt").read_text() == demo.DEMO_SENTENCES[3]
    assert (root / "26/495/26_495.trans.tsv").read_text().splitlines()[1] == "\t".join([utt, *[demo.DEMO_SENTENCES[3]] * 2])
    speakers = (root.parent / "speakers.tsv").read_text().splitlines()
    assert speakers[0] == "READER\tGENDER\tSUBSET\tNAME" and [row.split("\t")[0] for row in speakers[1:]] == ["19", "26"]


def test_nemo_manifests_list_path_speaker_and_text(tmp_path_factory):
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


def test_overwrite_leaves_no_speaker_of_the_corpus_replaced(tmp_path, capsys):
    """VCTK's tree rebuilt with fewer speakers keeps no folder of the others, of audio or of text (a reader would take
    an empty one for a speaker without text)."""
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
     "nemo, lhotse, libritts, parquet"),
    (["--layout", "nemo", "--speakers", "2", "--num-utterances", "2"],
     "--layout nemo validates on the last max(1, N // 10) utterances: --num-utterances 2 leaves a speaker of 2 none "
     "to train on"),
], ids=["ljspeech-of-2-speakers", "a-speaker-only-validates"])
def test_arguments_that_make_no_corpus_of_the_parts_layouts_are_one_line_before_any_file(tmp_path, capsys, args, said):
    need_engine()
    assert demo.main(["--output", str(tmp_path / "demo"), *args]) == 1
    assert capsys.readouterr().err == f"ERROR: {said}\n"
    assert not (tmp_path / "demo").exists()
