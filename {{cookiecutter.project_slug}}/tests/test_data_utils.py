"""Tests of utils/data_utils.py and scripts/make_demo_corpus.py, on tiny corpora written into tmp_path."""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from utils.config import AudioConfig, DataConfig
from utils.data_utils import (AudioMelDataset, DataError, Utterance, collate_audio_mel, load_splits, load_wav,
                              read_filelist, read_ljspeech)

SR = 22050
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def write_wav(path, audio, sr=SR, subtype="PCM_16"):
    """Write float audio ((T,) or (T, channels)) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.asarray(audio, dtype=np.float32), sr, subtype=subtype)
    return path


def ramp(n):
    """(n,) float32 ramp in [-0.9, 0.9]: every sample differs, so crops can be located."""
    return np.linspace(-0.9, 0.9, n, dtype=np.float32)


def make_ljspeech(root, n, lengths=None):
    """An LJSpeech-layout corpus of n utterances LJ000-0001... with 0.1 s ramps; returns the folder."""
    root = Path(root)
    lines = []
    for i in range(n):
        utt_id = f"LJ000-{i + 1:04d}"
        write_wav(root / "wavs" / f"{utt_id}.wav", ramp(lengths[i] if lengths else 2205))
        lines.append(f"{utt_id}|Raw text {i + 1}.|Normalized text {i + 1}.\n")
    (root / "metadata.csv").write_text("".join(lines), encoding="utf-8")
    return root


# --- read_ljspeech ---------------------------------------------------------------------------------------

def test_read_ljspeech_reads_rows_in_order(tmp_path):
    root = make_ljspeech(tmp_path / "LJ", 3)
    utts = read_ljspeech(root)
    assert [u.id for u in utts] == ["LJ000-0001", "LJ000-0002", "LJ000-0003"]
    assert utts[1] == Utterance("LJ000-0002", root / "wavs" / "LJ000-0002.wav", "Normalized text 2.")


def test_read_ljspeech_falls_back_to_raw_text_and_keeps_quotes(tmp_path):
    root = make_ljspeech(tmp_path, 3)
    (root / "metadata.csv").write_text(
        'LJ000-0001|He said "stop," then left.|\n'
        "LJ000-0002|Only raw text\n"
        '\n'
        'LJ000-0003|raw "1"|normalized "one"\n', encoding="utf-8")
    assert [u.text for u in read_ljspeech(root)] == ['He said "stop," then left.', "Only raw text",
                                                     'normalized "one"']


def test_read_ljspeech_missing_folder_and_metadata(tmp_path):
    with pytest.raises(DataError, match="dataset folder not found.*nowhere"):
        read_ljspeech(tmp_path / "nowhere")
    with pytest.raises(DataError, match="metadata file not found.*metadata.csv"):
        read_ljspeech(tmp_path)
    (tmp_path / "metadata.csv").write_text("\n  \n")
    with pytest.raises(DataError, match="metadata file is empty"):
        read_ljspeech(tmp_path)


def test_read_ljspeech_malformed_line_names_the_line(tmp_path):
    root = make_ljspeech(tmp_path, 2)
    (root / "metadata.csv").write_text("LJ000-0001|a|a\nLJ000-0002 no separator\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"metadata.csv:2: expected 'id\|raw text\|normalized text'"):
        read_ljspeech(root)
    (root / "metadata.csv").write_text("LJ000-0001|a|b|c\n", encoding="utf-8")
    with pytest.raises(DataError, match="metadata.csv:1"):
        read_ljspeech(root)
    (root / "metadata.csv").write_text("LJ000-0001|a|a\nLJ000-0001|b|b\n", encoding="utf-8")
    with pytest.raises(DataError, match="metadata.csv:2: utterance id 'LJ000-0001' appears twice"):
        read_ljspeech(root)


def test_read_ljspeech_missing_wav_names_the_id_and_path(tmp_path):
    root = make_ljspeech(tmp_path, 3)
    (root / "wavs" / "LJ000-0002.wav").unlink()
    with pytest.raises(DataError, match=r"metadata.csv:2: wav of utterance 'LJ000-0002' not found: .*LJ000-0002\.wav"):
        read_ljspeech(root)


# --- read_filelist ---------------------------------------------------------------------------------------

def test_read_filelist_relative_and_absolute_paths(tmp_path):
    root = make_ljspeech(tmp_path / "corpus", 2)
    outside = write_wav(tmp_path / "elsewhere" / "extra.wav", ramp(100))
    filelist = tmp_path / "list.txt"
    filelist.write_text(f"wavs/LJ000-0002.wav|Second one.\n\n{outside}|An absolute path.\n", encoding="utf-8")
    utts = read_filelist(filelist, root)
    assert utts == [Utterance("LJ000-0002", root / "wavs" / "LJ000-0002.wav", "Second one."),
                    Utterance("extra", outside, "An absolute path.")]


def test_read_filelist_errors(tmp_path):
    root = make_ljspeech(tmp_path, 1)
    with pytest.raises(DataError, match="filelist not found.*missing.txt"):
        read_filelist(tmp_path / "missing.txt", root)
    filelist = tmp_path / "list.txt"
    filelist.write_text("wavs/LJ000-0001.wav|ok\nwavs/LJ000-0001.wav\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"list.txt:2: expected 'path\|text'"):
        read_filelist(filelist, root)
    filelist.write_text("wavs/LJ000-0001.wav|ok\nwavs/gone.wav|text\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"list.txt:2: wav of utterance 'gone' not found: .*gone\.wav"):
        read_filelist(filelist, root)


# --- load_splits -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, val_size, n_val", [(25, 100, 2), (25, 1, 1), (2, 100, 1), (40, 3, 3)])
def test_load_splits_holds_out_the_last_utterances(tmp_path, n, val_size, n_val):
    root = make_ljspeech(tmp_path, n)
    train, val = load_splits(DataConfig(dataset_path=str(root), val_size=val_size))
    assert (len(train), len(val)) == (n - n_val, n_val)
    assert train + val == read_ljspeech(root)


def test_load_splits_needs_two_utterances(tmp_path):
    root = make_ljspeech(tmp_path, 1)
    with pytest.raises(DataError, match="at least 2"):
        load_splits(DataConfig(dataset_path=str(root)))


def test_load_splits_rejects_val_size_zero(tmp_path):
    root = make_ljspeech(tmp_path, 5)
    with pytest.raises(DataError, match="val_size"):
        load_splits(DataConfig(dataset_path=str(root), val_size=0))


def test_load_splits_with_filelists_relative_to_the_dataset(tmp_path):
    root = make_ljspeech(tmp_path / "corpus", 4)
    (root / "filelists").mkdir()
    (root / "filelists" / "train.txt").write_text(
        "".join(f"wavs/LJ000-000{i}.wav|text {i}\n" for i in (1, 2, 3)), encoding="utf-8")
    (root / "filelists" / "val.txt").write_text("wavs/LJ000-0004.wav|text 4\n", encoding="utf-8")
    cfg = DataConfig(dataset_path=str(root), training_files="filelists/train.txt",
                     validation_files="filelists/val.txt")
    train, val = load_splits(cfg)
    assert [u.id for u in train] == ["LJ000-0001", "LJ000-0002", "LJ000-0003"]
    assert [u.id for u in val] == ["LJ000-0004"]
    # given as an existing path (absolute here), the filelist is used as is
    cfg.training_files = str(root / "filelists" / "val.txt")
    assert [u.id for u in load_splits(cfg)[0]] == ["LJ000-0004"]


def test_load_splits_filelist_errors(tmp_path):
    root = make_ljspeech(tmp_path, 2)
    with pytest.raises(DataError, match="validation_files is empty"):
        load_splits(DataConfig(dataset_path=str(root), training_files="train.txt"))
    with pytest.raises(DataError, match="data.training_files not found: nope.txt"):
        load_splits(DataConfig(dataset_path=str(root), training_files="nope.txt", validation_files="v.txt"))


# --- load_wav --------------------------------------------------------------------------------------------

def test_load_wav_round_trip_16_bit(tmp_path):
    audio = (np.sin(np.arange(4000) / 7.0) * 0.7).astype(np.float32)
    loaded = load_wav(write_wav(tmp_path / "a.wav", audio), SR)
    assert loaded.dtype == torch.float32 and loaded.shape == (4000,)
    np.testing.assert_allclose(loaded.numpy(), audio, atol=1.0 / 32768 + 1e-7)


def test_load_wav_resamples_16k_to_22050(tmp_path):
    t = np.arange(16000) / 16000
    path = write_wav(tmp_path / "16k.wav", 0.5 * np.sin(2 * np.pi * 440 * t), sr=16000)
    loaded = load_wav(path, SR)
    assert loaded.shape == (22050,)
    assert float(loaded.abs().max()) <= 1.0
    peak_hz = np.argmax(np.abs(np.fft.rfft(loaded.numpy()))) * SR / len(loaded)
    assert abs(peak_hz - 440.0) < 2.0


def test_load_wav_mixes_stereo_down(tmp_path):
    stereo = np.stack([np.full(1000, 0.5), np.full(1000, -0.1)], axis=1)
    loaded = load_wav(write_wav(tmp_path / "stereo.wav", stereo), SR)
    assert loaded.shape == (1000,)
    np.testing.assert_allclose(loaded.numpy(), 0.2, atol=1e-4)


def test_load_wav_bad_files_name_the_file(tmp_path):
    good = write_wav(tmp_path / "good.wav", ramp(22050)).read_bytes()
    cases = {
        "garbage.wav": b"this is not a sound file" * 10,
        "zero_bytes.wav": b"",
        "cut_header.wav": good[:30],
        "cut_data.wav": good[:1000],
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=name):
            load_wav(tmp_path / name, SR)
    with pytest.raises(DataError, match="truncated wav file.*cut_data.wav"):
        load_wav(tmp_path / "cut_data.wav", SR)
    with pytest.raises(DataError, match="not found.*missing.wav"):
        load_wav(tmp_path / "missing.wav", SR)
    with pytest.raises(DataError, match="no samples.*empty.wav"):
        load_wav(write_wav(tmp_path / "empty.wav", np.zeros(0)), SR)


# --- AudioMelDataset and collate_audio_mel ---------------------------------------------------------------

SEGMENT = 4096  # samples; 16 mel frames at hop 256


def test_dataset_item_shapes(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 2, lengths=[10000, 10000]))
    item = AudioMelDataset(utts, AudioConfig(), SEGMENT)[1]
    assert set(item) == {"mel", "audio", "id"}
    assert item["mel"].shape == (80, 16) and item["mel"].dtype == torch.float32
    assert item["audio"].shape == (SEGMENT,) and item["audio"].dtype == torch.float32
    assert item["id"] == "LJ000-0002"


def test_dataset_first_segment_when_not_random(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[10000]))
    dataset = AudioMelDataset(utts, AudioConfig(), SEGMENT, random_crop=False)
    first, again = dataset[0], dataset[0]
    full = load_wav(utts[0].wav_path, SR)
    torch.testing.assert_close(first["audio"], full[:SEGMENT])
    torch.testing.assert_close(first["mel"], dataset.mel(full[:SEGMENT]))
    torch.testing.assert_close(first["mel"], again["mel"])


def test_dataset_random_crop_is_a_slice_fixed_by_seed_epoch_and_index(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[20000]))
    dataset = AudioMelDataset(utts, AudioConfig(), SEGMENT, random_crop=True, seed=7)
    full = load_wav(utts[0].wav_path, SR)
    starts = []
    for epoch in range(6):
        dataset.set_epoch(epoch)
        torch.manual_seed(epoch)  # the global RNG (worker seeds) must not matter
        audio = dataset[0]["audio"]
        start = int(torch.argmin((full - audio[0]).abs()))
        torch.testing.assert_close(audio, full[start:start + SEGMENT])
        starts.append(start)
    assert len(set(starts)) > 1  # the crop moves from epoch to epoch
    dataset.set_epoch(3)
    torch.manual_seed(1000)
    torch.testing.assert_close(dataset[0]["audio"], full[starts[3]:starts[3] + SEGMENT])  # and is reproducible
    other = AudioMelDataset(utts, AudioConfig(), SEGMENT, random_crop=True, seed=8)
    other.set_epoch(3)
    assert not torch.equal(other[0]["audio"], dataset[0]["audio"])  # the seed matters


def test_resumable_sampler_skips_what_was_trained_then_is_whole_again():
    from utils.data_utils import ResumableDistributedSampler
    data = list(range(20))
    full = [list(ResumableDistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=3)) for r in (0, 1)]
    sampler = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(0, start=4)
    assert len(sampler) == 6
    assert list(sampler) == full[1][4:]
    assert list(sampler) == full[1]  # the skip applies to one pass only
    sampler.set_epoch(1)
    assert list(sampler) != full[1]  # another epoch, another order


def test_dataset_pads_short_clips_with_zeros(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[1000]))
    item = AudioMelDataset(utts, AudioConfig(), SEGMENT, random_crop=True)[0]
    full = load_wav(utts[0].wav_path, SR)
    assert item["audio"].shape == (SEGMENT,)
    torch.testing.assert_close(item["audio"][:1000], full)
    assert torch.count_nonzero(item["audio"][1000:]) == 0
    assert item["mel"].shape == (80, 16)


def test_dataset_rejects_empty_list_and_tiny_segments(tmp_path):
    with pytest.raises(DataError, match="no utterances"):
        AudioMelDataset([], AudioConfig(), SEGMENT)
    utts = read_ljspeech(make_ljspeech(tmp_path, 1))
    with pytest.raises(ValueError, match="segment_length=100"):
        AudioMelDataset(utts, AudioConfig(), 100)


def test_dataset_names_a_broken_wav(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 2))
    utts[1].wav_path.write_bytes(b"broken")
    dataset = AudioMelDataset(utts, AudioConfig(), SEGMENT)
    with pytest.raises(DataError, match="LJ000-0002.wav"):
        dataset[1]


def test_collate_audio_mel_through_a_dataloader(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 3, lengths=[5000, 9000, 3000]))
    loader = DataLoader(AudioMelDataset(utts, AudioConfig(), SEGMENT), batch_size=3,
                        collate_fn=collate_audio_mel)
    batch = next(iter(loader))
    assert batch["mel"].shape == (3, 80, 16)
    assert batch["audio"].shape == (3, SEGMENT)
    assert batch["ids"] == ["LJ000-0001", "LJ000-0002", "LJ000-0003"]


def test_collate_audio_mel_rejects_mixed_shapes():
    a = {"mel": torch.zeros(80, 16), "audio": torch.zeros(4096), "id": "a"}
    b = {"mel": torch.zeros(80, 8), "audio": torch.zeros(2048), "id": "b"}
    with pytest.raises(ValueError, match="item 'b'"):
        collate_audio_mel([a, b])
    with pytest.raises(ValueError, match="empty"):
        collate_audio_mel([])


# --- scripts/make_demo_corpus.py -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("make_demo_corpus", PROJECT_ROOT / "scripts" / "make_demo_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def need_engine():
    if not (shutil.which("flite") or shutil.which("espeak-ng")):
        pytest.skip("neither flite nor espeak-ng is installed, so no demo corpus can be spoken")


def test_make_demo_corpus_builds_a_readable_corpus(tmp_path, demo):
    need_engine()
    out = demo.make_corpus(tmp_path / "demo", None, 3, "auto", SR, 0)
    utts = read_ljspeech(out)
    assert [u.id for u in utts] == ["LJ_DEMO_0001", "LJ_DEMO_0002", "LJ_DEMO_0003"]
    assert [u.text for u in utts] == list(demo.DEMO_SENTENCES[:3])
    for utt in utts:
        info = sf.info(str(utt.wav_path))
        assert (info.samplerate, info.channels, info.subtype) == (SR, 1, "PCM_16")
        assert info.duration > 0.5
        assert float(load_wav(utt.wav_path, SR).abs().max()) > 0.01  # speech, not silence


def test_make_demo_corpus_varies_repeated_sentences(tmp_path, demo):
    need_engine()
    out = demo.make_corpus(tmp_path / "demo", ["One short sentence."], 2, "auto", 16000, 0)
    first, second = (load_wav(u.wav_path, 16000) for u in read_ljspeech(out))
    assert first.shape != second.shape or not torch.equal(first, second)


def test_make_demo_corpus_refuses_an_existing_corpus(tmp_path, demo, capsys):
    need_engine()
    out = tmp_path / "demo"
    assert demo.main(["--output", str(out), "--num-utterances", "1"]) == 0
    assert demo.main(["--output", str(out), "--num-utterances", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ERROR: ") and "--overwrite" in err[-1]
    assert demo.main(["--output", str(out), "--num-utterances", "2", "--overwrite"]) == 0
    assert len(read_ljspeech(out)) == 2


def test_make_demo_corpus_without_any_engine(tmp_path, demo, monkeypatch, capsys):
    monkeypatch.setattr(demo.shutil, "which", lambda name: None)
    assert demo.main(["--output", str(tmp_path / "demo")]) == 1
    assert capsys.readouterr().err.strip() == \
        "ERROR: neither flite nor espeak-ng is installed (apt-get install flite)"
    assert not (tmp_path / "demo").exists()
