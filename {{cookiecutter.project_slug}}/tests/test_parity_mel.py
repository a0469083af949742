"""The project's log-mel against the references' own, run on the same signal (``tests/data/reference``: NVIDIA's
``TacotronSTFT.mel_spectrogram`` and jik876's ``mel_spectrogram``; ``README.md`` there says how they were made): each
framing of :class:`utils.data.audio.MelSpectrogram` gives its reference's frame count and values."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from utils.data.audio import AudioConfig, MelSpectrogram

REFERENCE = Path(__file__).parent / "data" / "reference"
MAX_ABS, MEAN_ABS = 2e-2, 1e-3
"""Log-mel tolerances: the STFTs differ in float32 rounding, and jik876's magnitude is ``sqrt(|X|^2 + 1e-9)``."""


def reference(name: str) -> tuple[dict, dict]:
    """The fixture's arrays and its ``meta`` (JSON: the signal's formula and the reference's call)."""
    with np.load(REFERENCE / name, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    return arrays, json.loads(str(arrays.pop("meta")))


def signal(spec: dict) -> torch.Tensor:
    """The fixtures' input from the formula in their ``meta["signal"]``: a chirp from ``f0`` to ``f1`` Hz plus a sine
    at ``f2`` Hz, ``D`` seconds at ``sr`` Hz, in float64, then float32 ``(1, N)``."""
    t = np.arange(round(spec["D"] * spec["sr"])) / spec["sr"]
    x = 0.5 * np.sin(2 * np.pi * (spec["f0"] * t + (spec["f1"] - spec["f0"]) * t ** 2 / (2 * spec["D"])))
    return torch.from_numpy((x + 0.1 * np.sin(2 * np.pi * spec["f2"] * t)).astype(np.float32))[None]


def ours(framing: str, fmax) -> MelSpectrogram:
    """The project's mel front end with the fixtures' settings (22050 Hz, n_fft 1024, hop 256, 80 mels, fmin 0)."""
    return MelSpectrogram.from_config(AudioConfig(mel_framing=framing, fmax=fmax or 11025.0))


@pytest.mark.parametrize("fixture, key, framing, fmax", [
    ("mel_nvidia.npz", "log_mel", "nvidia", 8000.0),  # Tacotron2's and WaveGlow's TacotronSTFT
    ("mel_hifigan.npz", "log_mel", "jik876", 8000.0),  # HiFi-GAN's input mel
    ("mel_hifigan.npz", "log_mel_loss", "jik876", None),  # HiFi-GAN's loss mel (fmax_for_loss null: Nyquist)
])
def test_each_framing_matches_its_reference(fixture, key, framing, fmax):
    arrays, meta = reference(fixture)
    audio = signal(meta["signal"])
    assert tuple(audio.shape) == tuple(meta["input_shape"])
    expected = arrays[key]
    mel_fn = ours(framing, fmax)
    got = mel_fn(audio).numpy()
    assert got.shape == expected.shape == (1, 80, meta["frames"])
    assert mel_fn.num_frames(audio.shape[1]) == meta["frames"]
    diff = np.abs(got - expected)
    assert diff.max() < MAX_ABS and diff.mean() < MEAN_ABS, (diff.max(), diff.mean())


def test_the_other_framing_misses_the_nvidia_reference():
    """What the framing setting is for: jik876's frames are half a hop later and one fewer than NVIDIA's."""
    arrays, meta = reference("mel_nvidia.npz")
    got = ours("jik876", 8000.0)(signal(meta["signal"])).numpy()
    assert got.shape[2] == meta["frames"] - 1
    assert np.abs(got - arrays["log_mel"][:, :, :-1]).max() > 1.0
