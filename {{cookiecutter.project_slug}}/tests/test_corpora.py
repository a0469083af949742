"""Tests of the corpus readers (utils/data/corpora/), the utterance table (utils/data/corpus.py) and the audio sources
(utils/data/sources.py), on tiny corpora written in each layout as its real corpora ship (conftest's
:func:`layout_corpus`); one tiny training on 2 gloo ranks reads a layout other than LJSpeech's."""

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import LAYOUT_RATES, TEST_MODEL, layout_corpus, run_train_main, train_on_ranks

from utils.data.audio import decoding
from utils.data.corpora import load_splits, nemo, parquet
from utils.data.corpus import Corpus, DataConfig, DataError, Strings, Utterance
from utils.data import speakers
from utils.data.sources import clip_samples, parse, read_audio

SR = 22050
LAYOUTS = ["vctk", "libritts", "nemo", "parquet", "lhotse", "filelist"]
HEAVY = ("parquet", "lhotse")
"""The layouts whose libraries take seconds to import (``datasets``, ``lhotse``): their tests are in the slow tier."""
EACH_LAYOUT = [pytest.param(layout, marks=pytest.mark.slow) if layout in HEAVY else layout for layout in LAYOUTS]
GIVES_DURATIONS = {"nemo", "lhotse"}  # the others' durations come from the headers
NOTES = {"vctk": "not read: the audio of 1 speaker(s) without transcripts (p315", "libritts": "not read: 1 test split",
         "nemo": "not read: 1 test split", "parquet": "", "lhotse": "", "filelist": ""}


def data_section(root: Path, layout: str, **keys) -> DataConfig:
    """The ``data`` section of a corpus written by :func:`layout_corpus` (its filelists named), ``auto`` layout."""
    lists = {"training_files": "train.txt", "validation_files": "val.txt"} if layout == "filelist" else {}
    return DataConfig(dataset_path=str(root), val_size=1, **lists, **keys)


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


@pytest.mark.slow  # the parquet and lhotse layouts (HEAVY)
def test_a_clip_at_another_rate_is_resampled_as_librosa_resamples_it(corpora):
    """A 24 kHz parquet row and a 16 kHz span of a lhotse recording: soxr at HQ, the length librosa's ``resample``
    gives, its samples to the bit (``librosa.resample(res_type="soxr_hq")``, what the project used before)."""
    import librosa

    for layout in ("parquet", "lhotse"):
        source = load_splits(data_section(corpora[layout][0], layout))[0][0].audio
        path, row, span = parse(source)
        raw, rate = sf.read(io.BytesIO(parquet.audio_bytes(path, row)) if row is not None else path, dtype="float32")
        if span is not None:
            raw = raw[round(span[0] * rate):round(span[1] * rate)]
        assert rate == LAYOUT_RATES[layout] != SR
        expected = np.clip(librosa.resample(raw, orig_sr=rate, target_sr=SR, res_type="soxr_hq"), -1, 1)
        assert torch.equal(read_audio(source, SR), torch.from_numpy(expected))
    assert set(decoding()) == {"decoder", "resampler"} and "libsndfile" in decoding()["decoder"]


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


def test_a_named_layout_a_nemo_manifest_as_training_files_and_the_vctk_mic(corpora, tmp_path):
    """``data.format`` names a layout (one the folder is not in: one line); a NeMo manifest given as
    ``data.training_files`` is read as one; ``data.vctk_mic`` picks VCTK's microphone."""
    root, _ = corpora["nemo"]
    with pytest.raises(DataError, match=f"^{root} is not in the vctk layout"):
        load_splits(DataConfig(dataset_path=str(root), format="vctk"))
    named = DataConfig(dataset_path=str(root), training_files="1034_manifest_clean_train.json",
                       validation_files="2911_manifest_clean_dev.json")
    notes = []
    train, val = load_splits(named, notes=notes)
    assert "found the nemo layout" in notes[0] and {u.speaker for u in train} == {"1034"} and len(val) == 3
    train, _ = load_splits(data_section(corpora["vctk"][0], "vctk", vctk_mic="mic2"))
    assert all(u.audio.endswith("_mic2.flac") for u in train)


def train_error(*argv) -> str:
    """The one ``ERROR:`` line of ``train.py``'s run on ``argv`` (in this process), which must fail before any work:
    no traceback, no output folder."""
    code, out, err = run_train_main(["--config", "config.json", "--model", TEST_MODEL, "--tiny", *argv])
    errors = [line for line in err.splitlines() if line.startswith("ERROR:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in out + err, err
    return errors[0]


def test_a_corpus_in_no_layout_a_speaker_without_transcripts_and_a_parquet_without_audio_are_one_line(tmp_path):
    """Each is named in one line before any work (nothing written): a folder that matches no layout, a LibriTTS
    speaker folder with audio and no transcript, a VCTK ``txt/`` speaker folder with none, a parquet file with no audio
    column (its columns named)."""
    out = tmp_path / "out"
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a corpus")
    assert train_error("--dataset-path", str(stray), "--output-dir", str(out)).startswith(
        f"ERROR: rank 0: {stray} is in no layout data.format=auto knows (ljspeech: metadata.csv + wavs/<id>.wav;")
    libritts = tmp_path / "libritts"
    layout_corpus(libritts, "libritts", per_speaker=1)
    (libritts / "train-clean-100" / "77" / "100").mkdir(parents=True)
    sf.write(libritts / "train-clean-100" / "77" / "100" / "77_100_000001_000000.wav", np.zeros(2400), 24000)
    assert train_error("--dataset-path", str(libritts), "--output-dir", str(out)) == (
        f"ERROR: rank 0: LibriTTS speaker folder {libritts / 'train-clean-100' / '77'} holds no transcript "
        "(<chapter>/<id>.normalized.txt); remove the folder, or give its speaker's transcripts")
    vctk = tmp_path / "vctk"
    layout_corpus(vctk, "vctk", per_speaker=1)
    (vctk / "txt" / "p0000").mkdir()
    assert "VCTK speaker folder" in train_error("--dataset-path", str(vctk), "--output-dir", str(out))
    corpus = tmp_path / "pq"
    corpus.mkdir()
    import pyarrow
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.table({"text": ["Hello."], "speaker_id": ["1"]}), corpus / "train-0.parquet")
    assert train_error("--dataset-path", str(corpus), "--output-dir", str(out)) == (
        f"ERROR: rank 0: {corpus / 'train-0.parquet'} has no audio column (a Hugging Face Audio feature, or a column "
        "named 'audio'); its columns: text, speaker_id")
    assert not out.exists()


def test_bad_lines_of_a_manifest_are_bad_clips_named_or_skipped(tmp_path):
    """A NeMo line that is not JSON, one without text, one whose audio is missing and one repeating an id: each a
    :class:`BadClip` (``data.on_bad_clip=skip`` trains without them), or the first one raised in one line."""
    root = tmp_path / "nemo"
    layout_corpus(root, "nemo", per_speaker=2)
    manifest = root / "1034_manifest_clean_train.json"
    good = manifest.read_text().splitlines()
    manifest.write_text("\n".join([good[0], "{not json", '{"audio_filepath": "audio/x.flac", "text": ""}',
                                   '{"audio_filepath": "audio/gone.flac", "text": "Gone."}', good[0], good[1]]) + "\n")
    bad = []
    train, _ = load_splits(DataConfig(dataset_path=str(root)), bad=bad)
    assert [u.id for u in train] == ["audio_1034_clean_10425_1034_0001", "audio_1034_clean_10425_1034_0002"]
    assert [clip.reason.split(" (")[0] for clip in bad] == [
        "malformed line: not JSON", "empty transcript", "wav not found", "utterance id "
        "'audio_1034_clean_10425_1034_0001' appears twice"]
    with pytest.raises(DataError, match=rf"^{manifest}:2: not JSON .*\(and 3 more bad line\(s\)\)$"):
        load_splits(DataConfig(dataset_path=str(root)))


def test_a_nemo_manifest_of_good_lines_is_read_at_once_into_the_utterances_read_line_by_line(tmp_path, monkeypatch):
    """A manifest whose lines are all good is read by Arrow at once, as columns (a million lines in seconds): the same
    utterances in the same order as line by line (integer speakers, a language, the speaker from the manifest's name,
    several transcript keys, the first a line gives taken); an id given again in the validation manifest is named."""
    for speaker in (92, 6097):
        (tmp_path / "audio" / str(speaker)).mkdir(parents=True)
    lines = {"92_manifest_clean_train.json": [{"audio_filepath": f"audio/92/a.{i}.flac", "duration": 1 + i / 10,
                                                "text": f" Line {i}. ", "speaker": 92, "lang": "en"} for i in range(4)],
             "6097_manifest_clean_train.json": [{"audio_filepath": f"audio/6097/b{i}.flac", "duration": 2,
                                                 "text": "Raw.", "text_normalized": f"Line {i}." if i else None} for i in range(3)],
             "92_manifest_clean_dev.json": [{"audio_filepath": f"audio/6097/v{i}.flac", "duration": 1.5,
                                             "text": "Held out."} for i in range(2)]}
    for name, entries in lines.items():
        (tmp_path / name).write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        for entry in entries:
            (tmp_path / entry["audio_filepath"]).touch()  # never decoded: the durations are given
    assert all(nemo._table(tmp_path / name, {}) is not None for name in lines)  # each read at once
    at_once = load_splits(DataConfig(dataset_path=str(tmp_path)))
    monkeypatch.setattr(nemo, "_table", lambda manifest, first: None)
    assert at_once == load_splits(DataConfig(dataset_path=str(tmp_path)))  # as read line by line
    train, val = at_once
    assert [u.speaker for u in train] == ["6097"] * 3 + ["92"] * 4 and {u.language for u in train} == {"", "en"}
    assert [train[0].text, train[1].text] == ["Raw.", "Line 1."]
    assert train[3] == Utterance("audio_92_a.0", str(tmp_path / "audio/92/a.0.flac"), "Line 0.", "92", "en", 1.0)
    assert [u.id for u in val] == ["audio_6097_v0", "audio_6097_v1"]
    monkeypatch.undo()
    dev = tmp_path / "92_manifest_clean_dev.json"
    dev.write_text(dev.read_text() + json.dumps(lines["92_manifest_clean_train.json"][1]) + "\n")
    with pytest.raises(DataError, match=r"dev.json:3: utterance id 'audio_92_a.1' appears twice$"):
        load_splits(DataConfig(dataset_path=str(tmp_path)))


@pytest.mark.slow
def test_a_tiny_training_on_two_ranks_reads_a_vctk_layout_and_records_its_decoder(tmp_path):
    """2 gloo ranks train 2 steps on a VCTK-layout corpus (48 kHz FLAC, resampled in 1 loader worker each): the run
    says the layout it found and the speaker it did not read, and its checkpoint records the decoder."""
    root = tmp_path / "vctk"
    layout_corpus(root, "vctk", per_speaker=3, seconds=0.5)
    out = tmp_path / "out"
    said = train_on_ranks(["--config", "config.json", "--model", TEST_MODEL, "--tiny", "--max-steps", "2",
                           "--dataset-path", str(root), "--output-dir", str(out), "--set", "data.num_workers=1",
                           "--set", "data.val_size=1", "--set", f"{TEST_MODEL}.batch_size=2"], tmp_path / "ranks")
    assert f"note: data.format=auto: found the vctk layout in {root}" in said[0]
    assert "(p315: VCTK 0.92 ships p315 so)" in said[0]
    saved = torch.load(out / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["audio_decoding"] == decoding() and saved["train_utterances"] == 5


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
