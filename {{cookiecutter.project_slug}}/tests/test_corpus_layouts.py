"""Tests of the corpora part's layouts (utils/data/corpora/: VCTK, LibriTTS, NeMo manifests, parquet, lhotse
manifests; their settings in ``utils.data.shar.SharSettings``): what each reads beside what every layout is tested
for in ``test_corpora.py``, on tiny corpora written as its real corpora ship (conftest's :func:`layout_corpus`); one
tiny training on 2 gloo ranks reads a VCTK-layout corpus."""

import io
import json

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import LAYOUT_RATES, TEST_MODEL, layout_corpus, train_on_ranks
from test_corpora import SR, corpora, data_section, train_error

from parts import DataSettings
from utils.data.audio import decoding
from utils.data.corpora import load_splits, nemo, readers
from utils.data.corpus import DataError, Utterance
from utils.data.sources import parse, read_audio, row_bytes

__all__ = ["corpora"]  # the fixture, shared with test_corpora.py


def test_the_part_adds_its_layouts_to_the_readers_in_the_order_auto_tries_them():
    """``DataSettings.layouts``: the part's readers between LJSpeech's and filelists, as ``auto`` tries them."""
    assert list(readers(DataSettings())) == ["ljspeech", "vctk", "nemo", "lhotse", "libritts", "parquet", "filelist"]


@pytest.mark.slow  # the parquet and lhotse layouts (HEAVY)
def test_a_clip_at_another_rate_is_resampled_as_librosa_resamples_it(corpora):
    """A 24 kHz parquet row and a 16 kHz span of a lhotse recording: soxr at HQ, the length librosa's ``resample``
    gives, its samples to the bit (``librosa.resample(res_type="soxr_hq")``, what the project used before)."""
    import librosa

    for layout in ("parquet", "lhotse"):
        source = load_splits(data_section(corpora[layout][0], layout))[0][0].audio
        path, row, span = parse(source)
        raw, rate = sf.read(io.BytesIO(row_bytes(path, row)) if row is not None else path, dtype="float32")
        if span is not None:
            raw = raw[round(span[0] * rate):round(span[1] * rate)]
        assert rate == LAYOUT_RATES[layout] != SR
        expected = np.clip(librosa.resample(raw, orig_sr=rate, target_sr=SR, res_type="soxr_hq"), -1, 1)
        assert torch.equal(read_audio(source, SR), torch.from_numpy(expected))
    assert set(decoding()) == {"decoder", "resampler"} and "libsndfile" in decoding()["decoder"]


def test_a_named_layout_a_nemo_manifest_as_training_files_and_the_vctk_mic(corpora, tmp_path):
    """``data.format`` names a layout (one the folder is not in: one line); a NeMo manifest given as
    ``data.training_files`` is read as one; ``data.vctk_mic`` picks VCTK's microphone."""
    root, _ = corpora["nemo"]
    with pytest.raises(DataError, match=f"^{root} is not in the vctk layout"):
        load_splits(DataSettings(dataset_path=str(root), format="vctk"))
    named = DataSettings(dataset_path=str(root), training_files="1034_manifest_clean_train.json",
                       validation_files="2911_manifest_clean_dev.json")
    notes = []
    train, val = load_splits(named, notes=notes)
    assert "found the nemo layout" in notes[0] and {u.speaker for u in train} == {"1034"} and len(val) == 3
    train, _ = load_splits(data_section(corpora["vctk"][0], "vctk", vctk_mic="mic2"))
    assert all(u.audio.endswith("_mic2.flac") for u in train)


def test_a_speaker_without_transcripts_and_a_parquet_without_audio_are_one_line(tmp_path):
    """Each is named in one line before any work (nothing written): a LibriTTS speaker folder with audio and no
    transcript, a VCTK ``txt/`` speaker folder with none, a parquet file with no audio column (its columns named)."""
    out = tmp_path / "out"
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
    train, _ = load_splits(DataSettings(dataset_path=str(root)), bad=bad)
    assert [u.id for u in train] == ["audio_1034_clean_10425_1034_0001", "audio_1034_clean_10425_1034_0002"]
    assert [clip.reason.split(" (")[0] for clip in bad] == [
        "malformed line: not JSON", "empty transcript", "wav not found", "utterance id "
        "'audio_1034_clean_10425_1034_0001' appears twice"]
    with pytest.raises(DataError, match=rf"^{manifest}:2: not JSON .*\(and 3 more bad line\(s\)\)$"):
        load_splits(DataSettings(dataset_path=str(root)))


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
    at_once = load_splits(DataSettings(dataset_path=str(tmp_path)))
    monkeypatch.setattr(nemo, "_table", lambda manifest, first: None)
    assert at_once == load_splits(DataSettings(dataset_path=str(tmp_path)))  # as read line by line
    train, val = at_once
    assert [u.speaker for u in train] == ["6097"] * 3 + ["92"] * 4 and {u.language for u in train} == {"", "en"}
    assert [train[0].text, train[1].text] == ["Raw.", "Line 1."]
    assert train[3] == Utterance("audio_92_a.0", str(tmp_path / "audio/92/a.0.flac"), "Line 0.", "92", "en", 1.0)
    assert [u.id for u in val] == ["audio_6097_v0", "audio_6097_v1"]
    monkeypatch.undo()
    dev = tmp_path / "92_manifest_clean_dev.json"
    dev.write_text(dev.read_text() + json.dumps(lines["92_manifest_clean_train.json"][1]) + "\n")
    with pytest.raises(DataError, match=r"dev.json:3: utterance id 'audio_92_a.1' appears twice$"):
        load_splits(DataSettings(dataset_path=str(tmp_path)))


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
