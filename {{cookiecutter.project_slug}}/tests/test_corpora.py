"""Tests of the corpus readers' registry (utils/data/corpora/: detection, splits), the utterance table
(utils/data/corpus.py) and the audio sources (utils/data/sources.py), on tiny corpora written in each layout this
project reads as its real corpora ship (conftest's :func:`layout_corpus`). The layouts a part adds have their own
tests in that part's files (the corpora part's: ``test_corpus_layouts.py``)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import LAYOUT_RATES, TEST_MODEL, layout_corpus, run_train_main

from parts import LEFT_OUT, DataSettings
from utils.data import speakers
from utils.data.corpora import READERS, load_splits, readers
from utils.data.corpus import Corpus, DataConfig, DataError, Strings, Utterance
from utils.data.sources import clip_samples, parse, read_audio

SR = 22050
LAYOUTS = [name for name in readers(DataSettings()) if name in LAYOUT_RATES]
"""The layouts this project reads that :func:`layout_corpus` writes (LJSpeech's: ``test_data_utils.py``), in the
order ``auto`` tries them."""
HEAVY = ("parquet", "lhotse")
"""The layouts whose libraries take seconds to import (``datasets``, ``lhotse``): their tests are in the slow tier."""
EACH_LAYOUT = [pytest.param(layout, marks=pytest.mark.slow) if layout in HEAVY else layout for layout in LAYOUTS]
GIVES_DURATIONS = {"nemo", "lhotse"}  # the others' durations come from the headers
NOTES = {"vctk": "not read: the audio of 1 speaker(s) without transcripts (p315", "libritts": "not read: 1 test split",
         "nemo": "not read: 1 test split", "parquet": "", "lhotse": "", "filelist": ""}


def data_section(root: Path, layout: str, **keys) -> DataConfig:
    """The project's ``data`` section (every layout it reads) of a corpus written by :func:`layout_corpus` (its
    filelists named), ``auto`` layout."""
    lists = {"training_files": "train.txt", "validation_files": "val.txt"} if layout == "filelist" else {}
    return DataSettings(dataset_path=str(root), val_size=1, **lists, **keys)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """``corpora[layout]``: the layout's tiny corpus (2 speakers, 3 clips each) and the rows a reader must find, written
    when first asked for (the parquet and lhotse layouts import libraries that take seconds)."""
    root = tmp_path_factory.mktemp("layouts")

    class Written(dict):
        def __missing__(self, layout: str):
            self[layout] = (root / layout, layout_corpus(root / layout, layout))
            return self[layout]

    return Written()


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_each_layout_is_detected_and_read_with_ids_texts_speakers_and_durations(corpora, layout):
    """``data.format=auto`` names the layout it found; every utterance has its id, transcript (the normalized one),
    speaker and language; durations come from the manifests that give them, else the headers (NaN in the table);
    the layouts with a validation split keep it, VCTK's last utterance validates; what is not read is said."""
    root, rows = corpora[layout]
    notes = []
    train, val = load_splits(data_section(root, layout), notes=notes)
    assert notes[0].startswith(f"data.format=auto: found the {layout} layout in {root} (")
    assert NOTES[layout] in " ".join(notes[1:]) and len(notes) == 1 + bool(NOTES[layout])
    expected = [row[1:4] for row in rows]
    assert [(u.id, u.text, u.speaker) for u in [*train, *val]] == expected
    assert [u.id for u in val] == [row[1] for row in rows if row[0] == "val"][-1:] if layout == "vctk" else \
        [row[1] for row in rows if row[0] == "val"]
    durations = np.concatenate([train.duration, val.duration])
    if layout in GIVES_DURATIONS:
        np.testing.assert_allclose(durations, [row[4] for row in rows])
    else:
        assert np.isnan(durations).all()
    assert {u.language for u in [*train, *val]} == ({"English"} if layout == "lhotse" else {""})


@pytest.mark.parametrize("layout", EACH_LAYOUT)
def test_each_layouts_clips_decode_to_the_length_their_metadata_gives(corpora, layout):
    """Every clip decodes (soundfile; FLAC, WAV, a parquet row's bytes, a span of a recording), resampled to the
    model's rate, to the samples ``clip_samples`` gives from headers (exactly) or durations (to the sample)."""
    root, _ = corpora[layout]
    both = Corpus.join(load_splits(data_section(root, layout)))
    samples = clip_samples(both, SR)
    decoded = [read_audio(source, SR) for source in both.audio.tolist()]
    assert all(audio.dtype == torch.float32 and audio.abs().max() > 0.05 for audio in decoded)
    tolerance = 1 if layout in GIVES_DURATIONS else 0
    assert all(abs(len(audio) - int(n)) <= tolerance for audio, n in zip(decoded, samples)), \
        (layout, [len(audio) for audio in decoded], samples.tolist())


def test_the_table_holds_arrays_and_indexes_takes_and_joins_like_a_list():
    """Columns are packed arrays (no Python object per utterance, which forked loader workers would copy); a row is an
    :class:`Utterance`; ``take`` and ``join`` keep the order; an unknown duration is NaN."""
    rows = [Utterance("a", "/x/a.wav", "Hé!", "s1", "en", 1.5), Utterance("bb", "/x/b.flac#t=0.1,0.4", "", "s2"),
            Utterance("c", "/x/c.parquet#row=3", "Ça va.", "s1")]
    corpus = Corpus.of(rows)
    assert list(corpus) == rows and len(corpus) == 3 and corpus[-1] == rows[2]
    assert corpus.text.data.dtype == np.uint8 and corpus.text.offsets.tolist() == [0, 4, 4, 11]
    assert math.isnan(corpus.duration[1]) and corpus.duration.dtype == np.float64
    assert list(corpus.take([2, 0])) == [rows[2], rows[0]] and list(corpus.take([])) == []
    assert list(Corpus.join([corpus.take([1]), corpus.take([0])])) == [rows[1], rows[0]]
    assert Strings(["é", "", "zz"]).take(np.array([2, 0, 0])).tolist() == ["zz", "é", "é"]
    with pytest.raises(IndexError):
        corpus[3]
    assert parse("/x/b.flac#t=0.1,0.4") == (Path("/x/b.flac"), None, (0.1, 0.4))
    assert parse("/x/c.parquet#row=3") == (Path("/x/c.parquet"), 3, None)
    assert parse("/x/odd#name.wav") == (Path("/x/odd#name.wav"), None, None)


def train_error(*argv) -> str:
    """The one ``ERROR:`` line of ``train.py``'s run on ``argv`` (in this process), which must fail before any work:
    no traceback, no output folder."""
    code, out, err = run_train_main(["--config", "config.json", "--model", TEST_MODEL, "--tiny", *argv])
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in out + err, err
    return errors[0]


def test_the_core_reads_ljspeech_and_filelists_and_refuses_a_folder_in_a_layout_of_no_reader_in_one_line(tmp_path):
    """The core's ``data`` section reads the core's layouts alone (:data:`READERS`): a VCTK-layout folder under
    ``auto`` is in no layout it knows, one line listing those it reads; the project's section reads the parts'
    layouts too. In a project without the corpora part, ``train.py`` says the same line before any work, and
    refuses ``data.vctk_mic`` naming the part."""
    vctk = tmp_path / "vctk"
    layout_corpus(vctk, "vctk", per_speaker=1)
    assert list(readers(DataConfig())) == list(READERS) == ["ljspeech", "filelist"]
    assert list(readers(DataSettings()))[0] == "ljspeech" and list(readers(DataSettings()))[-1] == "filelist"
    said = (f"{vctk} is in no layout data.format=auto knows (ljspeech: {READERS['ljspeech'].TREE}; filelist: "
            f"{READERS['filelist'].TREE}); point --dataset-path at the corpus's root, or set data.format")
    with pytest.raises(DataError) as refused:
        load_splits(DataConfig(dataset_path=str(vctk)))
    assert str(refused.value) == said
    if "corpora" in LEFT_OUT:
        out = tmp_path / "out"
        assert train_error("--dataset-path", str(vctk), "--output-dir", str(out)) == f"ERROR: rank 0: {said}"
        assert "data.vctk_mic (corpora)" in train_error("--dataset-path", str(vctk), "--output-dir", str(out),
                                                        "--set", "data.vctk_mic=mic2")
        assert not out.exists()
    else:
        assert sum(map(len, load_splits(DataSettings(dataset_path=str(vctk), val_size=1)))) == 2


def test_a_corpus_in_no_layout_is_one_line_naming_the_layouts_read(tmp_path):
    """A folder that matches no layout: one line before any work (nothing written), the layouts named."""
    out = tmp_path / "out"
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a corpus")
    assert train_error("--dataset-path", str(stray), "--output-dir", str(out)).startswith(
        f"ERROR: rank 0: {stray} is in no layout data.format=auto knows (ljspeech: metadata.csv + wavs/<id>.wav;")
    assert not out.exists()


def test_the_speaker_map_is_the_training_splits_sorted_verified_on_resume_and_extended_from_init():
    """``utils.data.speakers``: the training split's speakers sorted; a resume keeps the saved map when the split
    makes it again (an ``--init-from`` run's too: its inherited names first), else one DataError line naming the
    first difference; ``--init-from`` keeps its map and appends the split's new names, said in one line; a
    checkpoint without a map (an earlier version's) gives the split's; a malformed entry is refused."""
    corpus = Corpus.of(Utterance(f"u{i}", f"u{i}.wav", "Hi.", speaker) for i, speaker in enumerate("CABCA"))
    made = speakers.data_speakers(corpus)
    assert made == ["A", "B", "C"]
    entry = {speakers.ENTRY: speakers.as_entry(made), speakers.INHERITED: 0}
    assert speakers.settle(made, speakers.saved_map(entry, "ck.pt"), "ck.pt", resume=True) == (made, 0, None)
    with pytest.raises(DataError, match=r"not the one ck.pt was trained with \(3\): index 1 is 'B' there, 'C' here"):
        speakers.settle(["A", "C", "D"], speakers.saved_map(entry, "ck.pt"), "ck.pt", resume=True)
    with pytest.raises(DataError, match="index 3 is 'D' here only"):
        speakers.settle(["A", "B", "C", "D"], speakers.saved_map(entry, "ck.pt"), "ck.pt", resume=True)
    names, inherited, line = speakers.settle(["A", "D", "E"], speakers.saved_map(entry, "ck.pt"), "ck.pt",
                                             resume=False)
    assert (names, inherited) == (["A", "B", "C", "D", "E"], 3)
    assert line == "--init-from ck.pt: 2 new speaker(s) appended to its map of 3: D, E"
    grown = {speakers.ENTRY: speakers.as_entry(names), speakers.INHERITED: inherited}
    assert speakers.settle(["A", "D", "E"], speakers.saved_map(grown, "g.pt"), "g.pt", resume=True)[0] == names
    assert speakers.settle(made, speakers.saved_map({}, "old.pt"), "old.pt", resume=True) == (made, 0, None)
    with pytest.raises(DataError, match="bad.pt: its 'speakers' entry is not a speaker map"):
        speakers.saved_map({speakers.ENTRY: {"A": 0, "B": 5}}, "bad.pt")
