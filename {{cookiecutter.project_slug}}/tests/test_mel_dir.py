"""Tests of utils/data/mel_dir.py (``data.mel_dir``: mels read from a folder) that need no Tacotron2: the crops of
audio and mel together; ``tests/test_gta.py`` tests the folder's checks on Tacotron2's dumped mels."""

import numpy as np
import pytest
import soundfile as sf
import torch

from utils.data.audio import AudioConfig, MelSpectrogram, load_wav
from utils.data.corpus import Corpus, Utterance
from utils.data.datasets import Crop
from utils.data.mel_dir import SILENCE_LOG_MEL, MelDirDataset

SR = 22050


def ramp_wav(path, n):
    """A float wav of an (n,) ramp in [-0.9, 0.9] (every sample differs, so crops can be located); returns the path."""
    sf.write(str(path), np.linspace(-0.9, 0.9, n, dtype=np.float32), SR, subtype="FLOAT")
    return path


@pytest.mark.parametrize("framing", ["nvidia", "jik876"])
def test_every_crop_of_a_mel_dir_clip_is_a_whole_segment_from_its_first_frames_sample(tmp_path, monkeypatch, framing):
    """With ``mel_dir``, every start the crop can draw (each one, not a random few), for clips of every length modulo
    the hop around one segment, gives ``segment_length // hop`` mel frames and ``segment_length`` samples: the audio of
    those frames from sample ``start * hop``, zeros past the clip's end. NVIDIA's ``1 + T // hop`` frames reach past
    the clip's last sample: a crop ending on its last frame used to be short (a batch then fails to collate)."""
    hop, frames = 16, 8  # a small hop: every remainder of a clip's length modulo the hop in a few dozen clips
    cfg, segment = AudioConfig(n_fft=64, hop_length=hop, win_length=64, n_mels=2, mel_framing=framing), frames * hop
    lengths = [k * hop + r for k in (frames - 1, frames, frames + 1) for r in range(hop)]
    utts = Corpus.of(Utterance(f"C{length}", str(ramp_wav(tmp_path / f"C{length}.wav", length)), "a")
                     for length in lengths)
    mel_fn = MelSpectrogram(cfg)
    for utt, length in zip(utts, lengths):  # mel frame f holds f: the crop's frames can be read off it
        count = mel_fn.num_frames(length)
        torch.save(torch.arange(count, dtype=torch.float32).expand(2, count).clone(), tmp_path / f"{utt.id}.pt")
    dataset = MelDirDataset(utts, cfg, Crop(segment), tmp_path)
    for index, (utt, length) in enumerate(zip(utts, lengths)):
        count, drawn = mel_fn.num_frames(length), []
        monkeypatch.setattr(Crop, "start", lambda crop, i, epoch, choices: drawn.append(choices) or 0)
        dataset[index]
        choices = drawn[0] if drawn else 1  # a clip shorter than the crop may take its one crop without a draw
        assert choices == max(count - frames, 0) + 1, (utt.id, drawn)  # the last crop ends on the clip's last frame
        frames_audio = load_wav(utt.audio, SR)[:count * hop]
        for start in range(choices):
            monkeypatch.setattr(Crop, "start", lambda crop, i, epoch, choices, start=start: start)
            item, where = dataset[index], (utt.id, length, start)
            assert item["mel"].shape == (2, frames) and item["audio"].shape == (segment,), where
            assert item["mel"][0].tolist() == [f if f < count else SILENCE_LOG_MEL
                                               for f in range(start, start + frames)], where
            kept = frames_audio[start * hop:start * hop + segment]
            assert torch.equal(item["audio"][:len(kept)], kept) and not item["audio"][len(kept):].any(), where
