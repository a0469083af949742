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
MAX_ABS, MEAN_ABS = 1e-2, 1e-3
"""Log-mel tolerances (docs/manual.md states them): float32 rounding of the STFTs, in bins near the log floor. Measured
on the 2 s sweep (``mel_sweep.npz``): 5.8e-3 from NVIDIA's (its STFT is a convolution, ours an FFT), 0 from jik876's
(the same formula, computed on the same machine); on the 0.3 s chirp made on another machine, 3.8e-3 and 6.1e-3.
Without jik876's ``+ 1e-9`` under the square root the sweep's HiFi-GAN mel is 4.7e-2 off."""


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


def sweep(spec: dict) -> torch.Tensor:
    """``mel_sweep.npz``'s input from its ``meta["signal"]``: a chirp from ``f0`` to ``f1`` Hz, ``D`` seconds at ``sr``
    Hz, of amplitude 0.5 scaled by ``quiet[2]`` from ``quiet[0]`` to ``quiet[1]`` s and silent from ``silent[0]`` to
    ``silent[1]`` s; in float64, then float32 ``(1, N)``."""
    t = np.arange(round(spec["D"] * spec["sr"])) / spec["sr"]
    (quiet_from, quiet_to, level), (silent_from, silent_to) = spec["quiet"], spec["silent"]
    gain = np.where((t >= quiet_from) & (t < quiet_to), level, np.where((t >= silent_from) & (t < silent_to), 0.0, 1.0))
    x = 0.5 * gain * np.sin(2 * np.pi * (spec["f0"] * t + (spec["f1"] - spec["f0"]) * t ** 2 / (2 * spec["D"])))
    return torch.from_numpy(x.astype(np.float32))[None]


def ours(framing: str, fmax) -> MelSpectrogram:
    """The project's mel front end with the fixtures' settings (22050 Hz, n_fft 1024, hop 256, 80 mels, fmin 0)."""
    return MelSpectrogram(AudioConfig(mel_framing=framing, fmax=fmax or 11025.0))


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


@pytest.mark.parametrize("key, framing, fmax", [("nvidia", "nvidia", 8000.0), ("jik876", "jik876", 8000.0),
                                                ("jik876_loss", "jik876", None)])
def test_each_framing_is_within_the_manuals_bound_on_a_sweep_with_silence(key, framing, fmax):
    """The 2 s sweep, 50 Hz to 8 kHz, with near-silent (-64 dB) and silent stretches, where mels sit near the log
    floor: the bound the manual states."""
    arrays, meta = reference("mel_sweep.npz")
    audio = sweep(meta["signal"])
    assert tuple(audio.shape) == tuple(meta["input_shape"]) == (1, 44100)
    expected = arrays[key]
    got = ours(framing, fmax)(audio).numpy()
    assert got.shape == expected.shape == (1, 80, meta["frames"][framing])
    assert (expected < -11.5).any() and (expected > 0).any()  # the floor (silence) and loud bins
    diff = np.abs(got - expected)
    assert diff.max() < MAX_ABS and diff.mean() < MEAN_ABS, (diff.max(), diff.mean())


@pytest.mark.parametrize("fmax", [8000.0, None])
def test_hifigans_mel_is_jik876s_formula(fmax):
    """jik876's ``mel_spectrogram`` written out: reflect-pad ``(n_fft - hop) // 2``, uncentred STFT with a periodic
    Hann window, ``sqrt(re^2 + im^2 + 1e-9)``, librosa's Slaney mel basis, ``log(clamp(x, min=1e-5))``; on the sweep
    its near-silent frames are where the ``1e-9`` matters."""
    import librosa

    audio = sweep(reference("mel_sweep.npz")[1]["signal"])
    pad = (1024 - 256) // 2
    padded = torch.nn.functional.pad(audio[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(padded, 1024, hop_length=256, win_length=1024, window=torch.hann_window(1024), center=False,
                      return_complex=True)
    basis = torch.from_numpy(librosa.filters.mel(sr=22050, n_fft=1024, n_mels=80, fmin=0.0, fmax=fmax))
    expected = torch.log(torch.clamp(basis @ torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9), min=1e-5))
    without = torch.log(torch.clamp(basis @ spec.abs(), min=1e-5))
    assert (expected - without).abs().max() > 1e-2  # the signal tells the two apart
    got = ours("jik876", fmax)(audio)
    assert got.shape == expected.shape == (1, 80, 172)
    assert (got - expected).abs().max() <= 1e-6
