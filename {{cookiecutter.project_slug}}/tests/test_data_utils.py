"""Tests of utils/data (corpus, audio, datasets, samplers, check), on tiny corpora written into tmp_path."""

import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import read_filelist, read_ljspeech
from torch.utils.data import DataLoader

from utils.data.audio import AudioConfig, MelSpectrogram, load_wav
from utils.data.corpora import load_splits
from utils.data.corpus import Corpus, DataConfig, DataError, Utterance
from utils.data.datasets import AudioMelDataset, Crop, collate_audio_mel
from utils.data.samplers import FrameBudgetSampler
from utils.run import end_dataloader_workers

SR = 22050


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
    assert utts[1] == Utterance("LJ000-0002", str(root / "wavs" / "LJ000-0002.wav"), "Normalized text 2.")


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
    assert utts == [Utterance("LJ000-0002", str(root / "wavs" / "LJ000-0002.wav"), "Second one."),
                    Utterance("extra", str(outside), "An absolute path.")]


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
    assert list(train) + list(val) == read_ljspeech(root)


def test_load_splits_needs_two_utterances(tmp_path):
    root = make_ljspeech(tmp_path, 1)
    with pytest.raises(DataError, match="at least 2"):
        load_splits(DataConfig(dataset_path=str(root)))


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
    item = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT))[1]
    assert set(item) == {"mel", "audio", "id"}
    assert item["mel"].shape == (80, 16) and item["mel"].dtype == torch.float32
    assert item["audio"].shape == (SEGMENT,) and item["audio"].dtype == torch.float32
    assert item["id"] == "LJ000-0002"


def test_dataset_first_segment_when_not_random(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[10000]))
    dataset = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT, random=False))
    first, again = dataset[0], dataset[0]
    full = load_wav(utts[0].audio, SR)
    torch.testing.assert_close(first["audio"], full[:SEGMENT])
    torch.testing.assert_close(first["mel"], dataset.mel(full[:SEGMENT]))
    torch.testing.assert_close(first["mel"], again["mel"])


def test_dataset_peak_scales_each_clip_before_its_crop_and_mel(tmp_path):
    """HiFi-GAN's recipe (jik876's ``normalize(audio) * 0.95``): the whole clip scaled to the peak in float64, then
    cropped."""
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[10000]))
    full = load_wav(utts[0].audio, SR)
    dataset = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT, random=False), peak=0.5)
    item, scaled = dataset[0], (full.double() / full.double().abs().max() * 0.5).float()
    assert abs(float(full.abs().max()) - 0.5) > 0.1  # the clip's own peak is another
    torch.testing.assert_close(item["audio"], scaled[:SEGMENT])
    torch.testing.assert_close(item["mel"], dataset.mel(scaled[:SEGMENT]))


def test_dataset_random_crop_is_a_slice_fixed_by_seed_epoch_and_index(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[20000]))
    dataset = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT, seed=7))
    full = load_wav(utts[0].audio, SR)
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
    other = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT, seed=8))
    other.set_epoch(3)
    assert not torch.equal(other[0]["audio"], dataset[0]["audio"])  # the seed matters


def test_resumable_sampler_skips_what_was_trained_then_is_whole_again():
    from utils.data.samplers import ResumableDistributedSampler
    data = list(range(20))
    full = [list(ResumableDistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=3)) for r in (0, 1)]
    sampler = ResumableDistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(0, start=8)  # 8 samples of the epoch read by the 2 ranks together: 4 each
    assert len(sampler) == 6
    assert list(sampler) == full[1][4:]
    assert list(sampler) == full[1]  # the skip applies to one pass only
    sampler.set_epoch(1)
    assert list(sampler) != full[1]  # another epoch, another order


def ljspeech_like_lengths(count: int, seed: int = 0) -> list[int]:
    """Mel frames of ``count`` clips spread as LJSpeech's are (1 to 10 s, most 5-9 s, at 86 frames a second)."""
    rng = np.random.default_rng(seed)
    seconds = np.clip(rng.normal(6.6, 2.2, count), 1.0, 10.1)
    return [int(s * 86) for s in seconds]


def bucket_pass(lengths, batch_size, world_size, epoch=0, start=0, pool=8, seed=5):
    """Every rank's micro-batches of one pass, ``[rank][batch] -> indices``."""
    from utils.data.samplers import LengthBucketSampler
    ranks = []
    for rank in range(world_size):
        sampler = LengthBucketSampler(lengths, batch_size, world_size, rank, seed=seed, pool=pool)
        sampler.set_epoch(epoch, start=start)
        assert len(sampler) == len(batches := list(sampler))
        ranks.append(batches)
    return ranks


def steps_of(ranks):
    """The global steps of a pass: ``[step] -> [rank's micro-batch]``."""
    assert len({len(batches) for batches in ranks}) == 1, "every rank takes as many steps"
    return [list(step) for step in zip(*ranks)]


@pytest.mark.parametrize("count, batch_size, world_size", [(203, 4, 3), (64, 8, 2), (37, 5, 1)])
def test_length_buckets_read_every_utterance_at_most_once_and_leave_out_less_than_one_step(count, batch_size,
                                                                                           world_size):
    lengths = ljspeech_like_lengths(count)
    epochs = []
    for epoch in range(3):
        ranks = bucket_pass(lengths, batch_size, world_size, epoch)
        read = [i for batches in ranks for batch in batches for i in batch]
        assert len(read) == len(set(read)), "an utterance read twice in one epoch"
        assert all(len(batch) == batch_size for batches in ranks for batch in batches)
        assert count - batch_size * world_size < len(read) <= count  # the left-out share is less than one step
        epochs.append(ranks)
    assert epochs[0] != epochs[1] != epochs[2], "every epoch has its own batches"
    assert bucket_pass(lengths, batch_size, world_size, 1) == epochs[1], "an epoch's batches follow from the seed"


def test_length_buckets_pad_far_less_than_random_batches():
    from utils.data.samplers import LengthBucketSampler, padding_fraction, random_batches
    lengths = ljspeech_like_lengths(2000)
    shuffled = padding_fraction(random_batches(len(lengths), 32, seed=1), lengths)
    bucketed = padding_fraction(LengthBucketSampler(lengths, 32, seed=1, pool=64).epoch_batches(), lengths)
    assert 0.25 < shuffled < 0.5, shuffled  # what a random batch of LJSpeech-like clips wastes
    assert bucketed < 0.02, bucketed
    # and a batch's lengths are close: its shortest is within a few percent of its longest
    batches = LengthBucketSampler(lengths, 32, seed=1, pool=64).epoch_batches()
    assert np.median([min(lengths[i] for i in b) / max(lengths[i] for i in b) for b in batches]) > 0.95
    # not a sorted curriculum: long and short batches alternate over the epoch
    means = [np.mean([lengths[i] for i in b]) for b in batches]
    assert abs(np.corrcoef(np.arange(len(means)), means)[0, 1]) < 0.2


def test_padding_fraction_counts_the_padded_positions():
    from utils.data.samplers import padding_fraction
    assert padding_fraction([[0, 1], [2]], [10, 6, 3]) == pytest.approx(4 / 23)
    assert padding_fraction([], [1]) == 0.0


def test_length_buckets_resume_mid_epoch_exactly_and_on_another_world_size():
    lengths, batch_size = ljspeech_like_lengths(150), 4
    whole = steps_of(bucket_pass(lengths, batch_size, 2, epoch=2))
    done = 5  # steps of 2 ranks read before the stop
    start = done * batch_size * 2
    assert steps_of(bucket_pass(lengths, batch_size, 2, epoch=2, start=start)) == whole[done:]  # the same ranks
    # Three ranks take the rest of the same order: nothing read twice, nothing of the epoch's order lost but the
    # tail that does not fill a step of three.
    read_before = {i for step in whole[:done] for batch in step for i in batch}
    order = bucket_pass(lengths, batch_size, 1, epoch=2)[0]  # the epoch's micro-batches, whatever the world size
    assert [batch for step in whole for batch in step] == order[:2 * len(whole)]
    on_three = steps_of(bucket_pass(lengths, batch_size, 3, epoch=2, start=start))
    read_after = [i for step in on_three for batch in step for i in batch]
    assert len(read_after) == len(set(read_after)) and not read_before & set(read_after)
    rest = order[2 * done:]
    assert [batch for step in on_three for batch in step] == rest[:3 * (len(rest) // 3)]
    # the skip is for one pass only
    sampler_batches = bucket_pass(lengths, batch_size, 2, epoch=2)
    assert steps_of(sampler_batches) == whole


def test_length_buckets_give_the_same_batches_whatever_the_number_of_workers():
    from utils.data.samplers import LengthBucketSampler

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, index):
            return index

    lengths = ljspeech_like_lengths(40)
    seen = {}
    for workers in (0, 2):
        sampler = LengthBucketSampler(lengths, 3, num_replicas=2, rank=1, seed=9, pool=4)
        sampler.set_epoch(1)
        loader = DataLoader(Items(), batch_sampler=sampler, num_workers=workers)
        seen[workers] = [batch.tolist() for batch in loader]
    assert seen[0] == seen[2] and len(seen[0]) == 6
    # a skip at a resume reaches the batches a DataLoader reads (it makes and drops an iterator before that one)
    sampler.set_epoch(1, start=2 * 3 * 2)
    assert [batch.tolist() for batch in DataLoader(Items(), batch_sampler=sampler, num_workers=2)] == seen[0][2:]


def test_length_buckets_refuse_bad_arguments():
    from utils.data.samplers import LengthBucketSampler
    with pytest.raises(ValueError, match="item 1 has length 0"):
        LengthBucketSampler([5, 0], 1)
    with pytest.raises(ValueError, match="start=3 is not a multiple of batch_size=2"):
        LengthBucketSampler([5, 6, 7, 8], 2).set_epoch(0, start=3)


def frame_steps(lengths, world_size, epoch=0, start=0, **budget):
    """The global steps of a frame-budget pass from ``start`` (``[step][rank] -> indices``); every rank takes as many
    batches as its ``len`` said."""
    ranks = []
    for rank in range(world_size):
        sampler = FrameBudgetSampler(lengths, num_replicas=world_size, rank=rank, **{"seed": 5, **budget})
        sampler.set_epoch(epoch, start=start)
        promised = len(sampler)
        ranks.append(list(sampler))
        assert len(ranks[-1]) == promised
    return steps_of(ranks)


def read_in(steps):
    return [i for step in steps for batch in step for i in batch]


@pytest.mark.parametrize("count, world_size, budget", [
    (203, 3, dict(max_frames=3000)),
    (97, 2, dict(max_frames=2600, max_items=3)),  # as many items as possible, not more than 3
    (64, 4, dict(max_frames=5000, quadratic=400)),  # a long item costs more than its length
    (11, 4, dict(max_frames=4000)),  # fewer batches than ranks: split
])
def test_frame_budgets_keep_every_batch_within_budget_read_every_utterance_once_and_give_every_rank_as_many(
        count, world_size, budget):
    lengths = ljspeech_like_lengths(count)  # 86 to 868 frames, uneven, no world size dividing the count
    quadratic = budget.get("quadratic", 0)
    cost = [length + length ** 2 / quadratic if quadratic else length for length in lengths]
    epochs = []
    for epoch in range(2):
        steps = frame_steps(lengths, world_size, epoch, **budget)
        assert sorted(read_in(steps)) == list(range(count)), "every utterance once in the epoch, across the ranks"
        for batch in (batch for step in steps for batch in step):
            assert len(batch) * max(cost[i] for i in batch) <= budget["max_frames"]
            assert len(batch) <= (budget.get("max_items") or count)
        epochs.append(steps)
    assert epochs[0] != epochs[1], "every epoch has its own batches"
    assert frame_steps(lengths, world_size, 1, **budget) == epochs[1], "an epoch's batches follow from the seed"


def test_frame_budgets_pad_far_less_than_random_batches_and_hold_more_short_utterances():
    from utils.data.samplers import padding_fraction, random_batches
    lengths = ljspeech_like_lengths(2000)
    sampler = FrameBudgetSampler(lengths, 32 * 870, seed=1)
    batches = sampler.epoch_batches()
    assert padding_fraction(batches, lengths) < 0.03 < 0.25 < padding_fraction(random_batches(2000, 32, 1), lengths)
    means = [np.mean([lengths[i] for i in batch]) for batch in batches]
    assert np.corrcoef(means, [len(batch) for batch in batches])[0, 1] < -0.8, "short utterances, more of them"
    assert abs(np.corrcoef(np.arange(len(means)), means)[0, 1]) < 0.2, "long and short batches alternate"


@pytest.mark.parametrize("before, after", [(2, 2), (2, 1), (1, 2), (2, 3)])
def test_frame_budgets_resume_exactly_on_as_many_ranks_and_read_the_rest_once_on_another_number(before, after):
    """What all ranks have read after a step is a prefix of the epoch's order, whatever the number of ranks: a resume
    at any step goes on as the uninterrupted pass, on another number of ranks it reads what is left, once; 2 -> 1 -> 2
    as well."""
    lengths, budget = ljspeech_like_lengths(151), dict(max_frames=2000)
    order = FrameBudgetSampler(lengths, seed=5, **budget)
    order.set_epoch(2)
    order = order.plan()[0].tolist()
    whole = frame_steps(lengths, before, 2, **budget)
    if before == 1:
        assert read_in(whole) == order
    for done in range(len(whole) + 1):  # the steps read before the stop
        start = len(read_in(whole[:done]))
        assert sorted(read_in(whole[:done])) == sorted(order[:start]), "a prefix of the order"
        rest = frame_steps(lengths, after, 2, start, **budget)
        if after == before:
            assert rest == whole[done:]
        assert sorted(read_in(whole[:done]) + read_in(rest)) == list(range(151))
        if 0 < done < len(whole) and after != before:  # and back to the first number of ranks
            middle = rest[:len(rest) // 2]
            again = frame_steps(lengths, before, 2, start + len(read_in(middle)), **budget)
            assert sorted(read_in(whole[:done]) + read_in(middle) + read_in(again)) == list(range(151))


def test_frame_budgets_give_the_same_batches_whatever_the_number_of_workers():
    lengths = ljspeech_like_lengths(40)
    seen = {}
    for workers in (0, 2):
        sampler = FrameBudgetSampler(lengths, 1800, num_replicas=2, rank=1, seed=9)
        sampler.set_epoch(1)
        seen[workers] = [batch.tolist() for batch in DataLoader(range(40), batch_sampler=sampler, num_workers=workers)]
    assert seen[0] == seen[2]
    # a skip at a resume reaches the batches a DataLoader reads (it makes and drops an iterator before that one)
    sampler.set_epoch(1, start=sum(sampler.step_items()[:2]))
    assert [batch.tolist() for batch in DataLoader(range(40), batch_sampler=sampler, num_workers=2)] == seen[0][2:]


def test_frame_budgets_split_halves_again_and_leave_out_only_single_utterances_that_cannot_fill_a_step():
    """8 utterances in one batch on 4 ranks: halves, then halves of those; on 3 ranks: 4, 2 and 2. One utterance a
    batch on 2 ranks: 5 utterances are 2 steps, and one is left for the next epoch."""
    for world_size, sizes in ((4, [2, 2, 2, 2]), (3, [4, 2, 2])):
        steps = frame_steps([10] * 8, world_size, max_frames=80)
        assert [list(map(len, step)) for step in steps] == [sizes] and sorted(read_in(steps)) == list(range(8))
    steps = frame_steps([100] * 5, 2, max_frames=100)
    assert len(steps) == 2 and len(set(read_in(steps))) == 4


def test_frame_budgets_refuse_bad_arguments():
    with pytest.raises(ValueError, match="item 1 costs 500 frames, more than max_frames=400"):
        FrameBudgetSampler([300, 500, 200], 400)
    with pytest.raises(ValueError, match="item 0 costs 400 frames"):
        FrameBudgetSampler([200, 100], 300, quadratic=200)  # 200 + 200**2 / 200
    with pytest.raises(ValueError, match="item 1 has length 0"):
        FrameBudgetSampler([5, 0], 10)


DIFFERENT_LENGTHS_RANK = """
from distributed import init_distributed
from utils.data.corpus import DataError
from utils.data.loader import BatchingConfig, frame_budgets

dist = init_distributed()
lengths = [100, 300, 200, 200] if dist.rank == 0 else [100, 300, 200, 250]  # rank 1 read another header
try:
    frame_budgets(lengths, BatchingConfig(batching="frames", max_frames=600), 0, dist)
except DataError as err:
    print("refused:", err)
"""


@pytest.mark.slow  # two ranks started
def test_frame_budgets_of_ranks_that_read_different_lengths_are_refused_on_every_rank_not_a_hang(tmp_path):
    from conftest import run_ranks
    said = run_ranks(DIFFERENT_LENGTHS_RANK, tmp_path)
    refusal = [line for line in said[0].splitlines() if line.startswith("refused:")]
    assert len(refusal) == 1 and refusal[0] == [line for line in said[1].splitlines() if "refused:" in line][0]
    assert refusal[0].startswith("refused: data.batching=frames: the ranks read different training utterance lengths "
                                 "(rank 0: 4 (checksum ") and refusal[0].endswith("); each rank must read the same corpus")


def test_dataset_pads_short_clips_with_zeros(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 1, lengths=[1000]))
    item = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT))[0]
    full = load_wav(utts[0].audio, SR)
    assert item["audio"].shape == (SEGMENT,)
    torch.testing.assert_close(item["audio"][:1000], full)
    assert torch.count_nonzero(item["audio"][1000:]) == 0
    assert item["mel"].shape == (80, 16)


def test_dataset_rejects_empty_list_and_tiny_segments(tmp_path):
    with pytest.raises(DataError, match="no utterances"):
        AudioMelDataset(Corpus.of([]), AudioConfig(), Crop(SEGMENT))
    utts = read_ljspeech(make_ljspeech(tmp_path, 1))
    with pytest.raises(ValueError, match="segment_length=100"):
        AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(100))


def test_dataset_names_a_broken_wav(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 2))
    Path(utts[1].audio).write_bytes(b"broken")
    dataset = AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT))
    with pytest.raises(DataError, match="LJ000-0002.wav"):
        dataset[1]


def test_collate_audio_mel_through_a_dataloader(tmp_path):
    utts = read_ljspeech(make_ljspeech(tmp_path, 3, lengths=[5000, 9000, 3000]))
    loader = DataLoader(AudioMelDataset(Corpus.of(utts), AudioConfig(), Crop(SEGMENT)), batch_size=3,
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


# --- bad corpus lines as bad clips (read_ljspeech / read_filelist / load_splits with a ``bad`` list) ---------

def bad_rows_corpus(root):
    """7 rows of which 5 are bad, one of each kind a corpus line can be: a malformed line (no separator), an id
    used twice, an empty transcript, a missing wav, a folder named like a wav."""
    root = make_ljspeech(root, 6)
    (root / "wavs" / "LJ000-0004.wav").unlink()
    (root / "wavs" / "LJ000-0005.wav").unlink()
    (root / "wavs" / "LJ000-0005.wav").mkdir()
    (root / "metadata.csv").write_text("LJ000-0001|One.|One.\n"
                                       "LJ000-0002 no separator\n"
                                       "LJ000-0003||\n"
                                       "LJ000-0004|Four.|Four.\n"
                                       "LJ000-0005|Five.|Five.\n"
                                       "LJ000-0001|One again.|One again.\n"
                                       "LJ000-0006|Six.|Six.\n", encoding="utf-8")
    return root


BAD_ROWS = [("metadata.csv:2", "metadata.csv:2", "malformed line: expected 'id|raw text|normalized text', got "
             "'LJ000-0002 no separator'"),
            ("LJ000-0003", "wavs/LJ000-0003.wav", "empty transcript (metadata.csv line 3)"),
            ("LJ000-0004", "wavs/LJ000-0004.wav", "wav not found (metadata.csv line 4)"),
            ("LJ000-0005", "wavs/LJ000-0005.wav", "is a folder, not a wav file (metadata.csv line 5)"),
            ("metadata.csv:6", "wavs/LJ000-0001.wav", "utterance id 'LJ000-0001' appears twice (first on line 1; "
             "metadata.csv line 6)")]


def test_read_ljspeech_collects_each_kind_of_bad_row_as_one_clip(tmp_path):
    from utils.data.corpus import BadClip

    root = bad_rows_corpus(tmp_path)
    bad = []
    assert [u.id for u in read_ljspeech(root, bad)] == ["LJ000-0001", "LJ000-0006"]
    assert bad == [BadClip(utt_id, str(root / path), reason) for utt_id, path, reason in BAD_ROWS]
    # Without a list the first bad row raises, naming its line; the count of the others follows.
    with pytest.raises(DataError, match=r"metadata.csv:2: expected 'id\|raw text\|normalized text', got "
                                        r"'LJ000-0002 no separator' \(and 4 more bad line\(s\)\)"):
        read_ljspeech(root)


def test_a_folder_named_like_a_wav_is_called_a_folder(tmp_path):
    root = make_ljspeech(tmp_path, 2)
    (root / "wavs" / "LJ000-0002.wav").unlink()
    (root / "wavs" / "LJ000-0002.wav").mkdir()
    with pytest.raises(DataError, match=r"metadata.csv:2: wav of utterance 'LJ000-0002' is a folder, not a wav "
                                        r"file: .*LJ000-0002\.wav$"):
        read_ljspeech(root)


def test_read_filelist_collects_bad_lines_as_clips(tmp_path):
    from utils.data.corpus import BadClip

    root = make_ljspeech(tmp_path / "corpus", 2)
    (root / "wavs" / "folder.wav").mkdir()
    filelist = tmp_path / "train.txt"
    filelist.write_text("wavs/LJ000-0001.wav|ok\nwavs/LJ000-0002.wav\nwavs/gone.wav|text\nwavs/folder.wav|text\n",
                        encoding="utf-8")
    bad = []
    assert [u.id for u in read_filelist(filelist, root, bad)] == ["LJ000-0001"]
    assert bad == [BadClip("train.txt:2", f"{filelist}:2", "malformed line: expected 'path|text' or "
                           "'path|speaker|text', got "
                           "'wavs/LJ000-0002.wav'"),
                   BadClip("gone", str(root / "wavs" / "gone.wav"), "wav not found (train.txt line 3)"),
                   BadClip("folder", str(root / "wavs" / "folder.wav"), "is a folder, not a wav file (train.txt line 4)")]


def test_load_splits_leaves_out_the_bad_rows_data_exclude_lists(tmp_path):
    """train.py with data.on_bad_clip=skip puts the bad rows' ids (metadata.csv:2 for a malformed line) in
    data.exclude: load_splits then reads the corpus without them, and without complaint."""
    root = bad_rows_corpus(tmp_path)
    cfg = DataConfig(dataset_path=str(root), val_size=1)
    bad = []
    train, val = load_splits(cfg, bad)
    assert [clip.id for clip in bad] == [row[0] for row in BAD_ROWS]
    assert ([u.id for u in train], [u.id for u in val]) == (["LJ000-0001"], ["LJ000-0006"])
    with pytest.raises(DataError, match="metadata.csv:2: expected"):  # nothing excluded, no list: raises
        load_splits(cfg)
    cfg.exclude = [row[0] for row in BAD_ROWS]
    assert load_splits(cfg) == (train, val)
    cfg.exclude = [row[0] for row in BAD_ROWS if row[0] != "LJ000-0004"]  # one bad row not excluded
    with pytest.raises(DataError, match=r"^.*metadata.csv:4: wav of utterance 'LJ000-0004' not found: .*\.wav$"):
        load_splits(cfg)
    bad = []
    load_splits(cfg, bad)
    assert [clip.id for clip in bad] == ["LJ000-0004"]


def test_load_splits_says_when_bad_rows_leave_too_few_utterances(tmp_path):
    root = bad_rows_corpus(tmp_path)
    cfg = DataConfig(dataset_path=str(root), exclude=[row[0] for row in BAD_ROWS] + ["LJ000-0006"])
    with pytest.raises(DataError, match=r"lists 1 usable utterance\(s\) \(6 bad or excluded line\(s\) left out\); "
                                        "at least 2 are needed"):
        load_splits(cfg)


def test_load_splits_names_a_validation_filelist_that_data_exclude_empties(tmp_path):
    root = make_ljspeech(tmp_path / "corpus", 3)
    (root / "train.txt").write_text("wavs/LJ000-0001.wav|a\nwavs/LJ000-0002.wav|b\n", encoding="utf-8")
    (root / "val.txt").write_text("wavs/LJ000-0003.wav|c\n", encoding="utf-8")
    cfg = DataConfig(dataset_path=str(root), training_files="train.txt", validation_files="val.txt",
                     exclude=["LJ000-0003"])
    with pytest.raises(DataError, match=r"no validation utterance left in .*val.txt: all 1 of its utterances are in "
                                        r"data.exclude \(where data.on_bad_clip=skip adds the bad clips\)"):
        load_splits(cfg)


# --- 8-bit clips and the start-up check (utils/data/check.py) ---------------------------------------------

def test_load_wav_reads_unsigned_8_bit_pcm_as_float(tmp_path):
    """Unsigned 8-bit PCM (silence is 128) reads as float in [-1, 1) like 16-bit PCM: 8-bit clips train."""
    audio = (0.6 * np.sin(np.arange(4000) / 9.0)).astype(np.float32)
    path = write_wav(tmp_path / "u8.wav", audio, subtype="PCM_U8")
    assert sf.info(str(path)).subtype == "PCM_U8"
    loaded = load_wav(path, SR)
    assert loaded.shape == (4000,)
    np.testing.assert_allclose(loaded.numpy(), audio, atol=1 / 128)  # one 8-bit step
    assert abs(float(loaded.mean())) < 0.01  # no offset of +128 left in


def check(utterances, cache_file=None):
    from utils.data.check import check_corpus

    return check_corpus(utterances, AudioConfig(sampling_rate=SR), cache_file=cache_file, workers=2)


def test_check_corpus_finds_silent_clips_and_passes_8_bit_and_late_sound(tmp_path):
    """Silent: all-zero (16-bit, float or 8-bit), or no sample above -80 dBFS. Not silent: a clip whose sound
    starts after 3 s of digital silence (the check reads on past the first blocks), an 8-bit clip. A NaN among
    the samples is named with its position, also after the sound began (a float wav is read to its end)."""
    quiet = np.full(8000, 5e-5, np.float32)
    quiet[::2] *= -1
    late = np.concatenate([np.zeros(3 * SR, np.float32), ramp(4000)])
    clips = {"zeros16": (np.zeros(8000), "PCM_16"), "zeros_float": (np.zeros(8000), "FLOAT"),
             "zeros8": (np.zeros(8000), "PCM_U8"), "quiet": (quiet, "FLOAT"), "late": (late, "PCM_16"),
             "eight_bit": (0.5 * ramp(8000), "PCM_U8"), "normal": (ramp(8000), "PCM_16"),
             "nan": (np.where(np.arange(8000) == 700, np.nan, 0.0), "FLOAT"),
             "late_nan": (np.concatenate([ramp(4000), np.full(70000, np.nan)]), "FLOAT")}  # NaN past the sound
    utts = [Utterance(name, str(write_wav(tmp_path / f"{name}.wav", audio, subtype=subtype)), "Some text.")
            for name, (audio, subtype) in clips.items()]
    found = {clip.id: clip.reason for clip in check(utts)}
    assert found == {"zeros16": "silent: every sample is zero", "zeros_float": "silent: every sample is zero",
                     "zeros8": "silent: every sample is zero",
                     "quiet": "silent: its loudest sample is 5.0e-05 of full scale, at most 1e-04",
                     "nan": "holds NaN or infinite samples (the first at sample 700)",
                     "late_nan": "holds NaN or infinite samples (the first at sample 4000)"}


def test_check_corpus_names_a_missing_wav_a_folder_and_a_clip_shorter_than_one_stft_window(tmp_path):
    """A clip needs the STFT window of the audio settings: ``MelSpectrogram.min_samples`` samples at their rate (a
    clip of another rate counts its resampled length)."""
    (tmp_path / "folder.wav").mkdir()
    shortest = MelSpectrogram(AudioConfig(sampling_rate=SR)).min_samples
    utts = [Utterance("gone", str(tmp_path / "gone.wav"), "Text."),
            Utterance("folder", str(tmp_path / "folder.wav"), "Text."),
            Utterance("fine", str(write_wav(tmp_path / "fine.wav", ramp(4000))), "Text."),
            Utterance("just_long_enough", str(write_wav(tmp_path / "enough.wav", ramp(shortest))), "Text."),
            Utterance("short", str(write_wav(tmp_path / "short.wav", ramp(2 * shortest - 2), sr=2 * SR)), "Text.")]
    assert [(clip.id, clip.reason) for clip in check(utts)] == [
        ("gone", "wav not found"), ("folder", "is a folder, not a wav file"),
        ("short", f"too short: {shortest - 1} samples at {SR} Hz, fewer than {shortest} (one STFT window)")]


def test_check_corpus_cache_reads_each_clip_once_until_it_changes(tmp_path, monkeypatch):
    """The cache (keyed by path, size, modification time and the check's version) spares a second run the
    reading; a rewritten clip, and an entry of an older check without the silence test, are read again."""
    import json
    import os

    from utils.data import check as data_check

    utts = [Utterance(name, str(write_wav(tmp_path / f"{name}.wav", audio)), "Text.")
            for name, audio in (("loud", ramp(4000)), ("silent", np.zeros(4000)))]
    cache_file = tmp_path / "cache" / "headers.json"
    read = []
    inspect = data_check._inspect
    monkeypatch.setattr(data_check, "_inspect", lambda source: read.append(Path(source).stem) or inspect(source))
    assert [clip.id for clip in check(utts, cache_file)] == ["silent"]
    assert sorted(read) == ["loud", "silent"]
    read.clear()
    assert [clip.id for clip in check(utts, cache_file)] == ["silent"] and read == []
    write_wav(tmp_path / "silent.wav", ramp(4100))  # fixed: another size
    assert check(utts, cache_file) == [] and read == ["silent"]
    read.clear()
    cache = json.loads(cache_file.read_text())
    entry = cache[str(tmp_path / "loud.wav")]
    stat = os.stat(tmp_path / "loud.wav")
    assert entry["key"] == f"v3:{stat.st_size}:{stat.st_mtime_ns}"
    entry["key"] = f"{stat.st_size}:{stat.st_mtime_ns}"  # as the header-only check wrote it
    del entry["silent_peak"]
    cache_file.write_text(json.dumps(cache))
    assert check(utts, cache_file) == [] and read == ["loud"]


@pytest.mark.slow  # PyTorch takes 5 s to shut down a worker of an iterator that a garbage collection frees
def test_the_workers_of_a_loader_held_only_by_a_reference_cycle_end_at_the_runs_end():
    """What a failed run can leave (a loader's iterator held by a reference cycle): its worker still runs until
    ``end_dataloader_workers`` collects the garbage and PyTorch shuts it down, none killed; with none left, it returns
    at once."""
    end_dataloader_workers()  # workers other tests left in this process
    batches = iter(DataLoader(list(range(8)), batch_size=2, num_workers=1))
    assert next(batches).tolist() == [0, 1]
    held = {"batches": batches}
    held["itself"] = held  # only a garbage collection frees it
    del batches, held
    assert len(multiprocessing.active_children()) == 1
    assert end_dataloader_workers() == []
    assert multiprocessing.active_children() == []
    assert end_dataloader_workers() == []
