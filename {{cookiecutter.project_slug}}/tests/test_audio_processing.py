"""Tests of utils/data/audio.py: mel framing and values, log compression, save_wav."""

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch
from pydantic import ValidationError

from utils.data.audio import AudioConfig, MelSpectrogram, dynamic_range_compression, save_wav

SR = 22050


def sine(freq_hz, seconds=1.0, amplitude=0.5, sr=SR):
    """(T,) float32 sine tensor."""
    t = torch.arange(int(seconds * sr), dtype=torch.float32) / sr
    return amplitude * torch.sin(2 * np.pi * freq_hz * t)


@pytest.fixture(scope="module")
def mel_fn():
    return MelSpectrogram(AudioConfig())


@pytest.mark.parametrize("framing, frames, frames_8192, shortest", [
    ("jik876", 86, 32, 385),  # pad (1024 - 256) // 2 = 384: (22050 + 768 - 1024) // 256 + 1 = 86, 8192 / 256 exactly
    ("nvidia", 87, 33, 513),  # pad 1024 // 2 = 512 (centred): 1 + 22050 // 256 = 87, 1 + 8192 // 256 = 33
])
def test_mel_shape_and_frame_count(framing, frames, frames_8192, shortest):
    mel_fn = MelSpectrogram(AudioConfig(mel_framing=framing))
    audio = torch.rand(3, 22050) * 2 - 1
    mel = mel_fn(audio)
    assert mel.shape == (3, 80, frames)
    assert mel.dtype == torch.float32
    assert mel_fn.num_frames(22050) == frames
    assert mel_fn(audio[0]).shape == (80, frames)
    assert mel_fn(torch.zeros(8192)).shape == (80, frames_8192)
    assert mel_fn.min_samples == shortest and mel_fn(torch.zeros(shortest)).shape[1] == mel_fn.num_frames(shortest)
    with pytest.raises(ValueError, match=f"at least {shortest} are needed .*{framing} framing"):
        mel_fn(torch.zeros(shortest - 1))
    for samples in (shortest, 1000, 4097, 6615):  # num_frames is what forward gives
        assert mel_fn(torch.zeros(samples)).shape[1] == mel_fn.num_frames(samples)


def test_an_unresolved_framing_is_jik876s_and_unknown_ones_are_refused():
    assert AudioConfig().mel_framing is None and AudioConfig().framing == "jik876"
    assert MelSpectrogram(AudioConfig()).pad == 384
    cfg = AudioConfig()
    cfg.mel_framing = "centre"  # the section refuses it when built; set afterwards, the module refuses it too
    with pytest.raises(ValueError, match="framing must be one of nvidia, jik876, got 'centre'"):
        MelSpectrogram(cfg)


def test_mel_batch_items_match_single_items(mel_fn):
    audio = torch.rand(2, 5000) * 2 - 1
    batch = mel_fn(audio)
    torch.testing.assert_close(batch[1], mel_fn(audio[1]))


@pytest.mark.parametrize("framing", ["jik876", "nvidia"])
def test_mel_matches_an_independent_librosa_computation(framing):
    audio = (torch.rand(6000) * 2 - 1) * 0.8
    if framing == "jik876":  # reflect pad (n_fft - hop) // 2, then uncentred frames
        pad = (1024 - 256) // 2
        padded, centred = np.pad(audio.numpy(), (pad, pad), mode="reflect"), False
    else:  # librosa's own centred frames, reflect-padded by n_fft // 2
        padded, centred = audio.numpy(), True
    magnitude = np.abs(librosa.stft(padded, n_fft=1024, hop_length=256, win_length=1024, window="hann",
                                    center=centred, pad_mode="reflect"))
    basis = librosa.filters.mel(sr=SR, n_fft=1024, n_mels=80, fmin=0.0, fmax=8000.0)
    expected = np.log(np.maximum(basis @ magnitude, 1e-5))
    mel = MelSpectrogram(AudioConfig(mel_framing=framing))(audio).numpy()
    assert mel.shape == expected.shape
    np.testing.assert_allclose(mel, expected, atol=1e-3)


@pytest.mark.parametrize("freq_hz", [440.0, 1000.0, 3000.0, 7000.0])
def test_mel_of_a_sine_peaks_at_the_band_centred_on_its_frequency(mel_fn, freq_hz):
    centres = librosa.mel_frequencies(n_mels=80 + 2, fmin=0.0, fmax=8000.0)[1:-1]
    expected_band = int(np.abs(centres - freq_hz).argmin())
    mel = mel_fn(sine(freq_hz))
    assert int(mel.mean(dim=1).argmax()) == expected_band


def test_silence_sits_at_the_log_floor(mel_fn):
    mel = mel_fn(torch.zeros(4096))
    torch.testing.assert_close(mel, torch.full_like(mel, float(np.log(1e-5))))


def test_mel_rejects_bad_input(mel_fn):
    with pytest.raises(ValueError, match=r"\(B, T\) or \(T,\)"):
        mel_fn(torch.zeros(1, 1, 4096))
    with pytest.raises(ValueError, match="float audio"):
        mel_fn(torch.zeros(4096, dtype=torch.int16))
    with pytest.raises(ValueError, match="at least"):
        mel_fn(torch.zeros(100))


def test_mel_settings_are_checked_by_the_audio_section():
    with pytest.raises(ValidationError, match=r"'audio.win_length' \(1024\) must not exceed audio.n_fft \(512\)"):
        AudioConfig(n_fft=512)
    with pytest.raises(ValidationError, match="fmin < fmax <= sampling_rate / 2, got fmin=0.0, fmax=20000.0"):
        AudioConfig(fmax=20000.0)


def test_mel_uses_the_audio_settings():
    cfg = AudioConfig(sampling_rate=16000, n_fft=512, hop_length=128, win_length=400, n_mels=40, fmax=7600.0)
    mel_fn = MelSpectrogram(cfg)
    assert mel_fn.mel_basis.shape == (40, 257)
    assert mel_fn.window.shape == (400,)
    assert mel_fn(torch.zeros(16000)).shape == (40, (16000 + 2 * 192 - 512) // 128 + 1)


def test_dynamic_range_compression_floor():
    x = torch.tensor([1e-7, 1e-5, 0.01, 1.0, 123.0])
    compressed = dynamic_range_compression(x)
    torch.testing.assert_close(compressed[2:], torch.log(x[2:]))
    assert compressed[0] == compressed[1]  # clamped to the 1e-5 floor


def test_save_wav_writes_16_bit_mono_and_creates_folders(tmp_path):
    audio = sine(440.0, seconds=0.25)
    path = save_wav(tmp_path / "a" / "b" / "out.wav", audio, SR)
    info = sf.info(str(path))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (SR, 1, "PCM_16", len(audio))
    read, _ = sf.read(str(path), dtype="float32")
    np.testing.assert_allclose(read, audio.numpy(), atol=1.0 / 32768 + 1e-7)


def test_save_wav_clips_out_of_range_values(tmp_path):
    with pytest.warns(UserWarning, match="is 67% clipped"):
        path = save_wav(tmp_path / "loud.wav", np.array([2.0, -3.0, 0.5], dtype=np.float32), SR)
    read, _ = sf.read(str(path), dtype="float32")
    assert read[0] == pytest.approx(1.0, abs=1e-4) and read[1] == pytest.approx(-1.0, abs=1e-4)
    assert read[2] == pytest.approx(0.5, abs=1e-4)


@pytest.mark.parametrize("audio, message", [
    (np.array([0.1, np.nan], dtype=np.float32), "NaN"),
    (np.zeros(0, dtype=np.float32), "empty"),
    (np.zeros((2, 100), dtype=np.float32), r"\(T,\)"),
])
def test_save_wav_rejects_bad_audio(tmp_path, audio, message):
    path = tmp_path / "bad.wav"
    with pytest.raises(ValueError, match=message) as err:
        save_wav(path, audio, SR)
    assert str(path) in str(err.value)
    assert not path.exists()


def test_audio_that_no_trained_model_writes_is_named_and_speech_is_not():
    from utils.data.audio import audio_problems

    rng = np.random.default_rng(0)
    speech_like = (0.3 * sine(180.0, seconds=0.5).numpy() * np.hanning(SR // 2)).astype(np.float32)
    noise = "sounds like noise (spectral flatness 0.56; speech's is below 0.3)"
    assert audio_problems(speech_like) == []
    assert audio_problems(np.clip(3 * rng.standard_normal(SR), -1, 1)) == ["is 74% clipped (samples at full scale)",
                                                                           noise]
    assert audio_problems(0.171 + 0.013 * rng.standard_normal(SR)) == [  # an untrained HiFi-GAN's output
        "has a DC offset of 0.171 (its mean; speech's is near 0)", noise]
    assert audio_problems(np.full(SR, 2e-4)) == ["is nearly silent (peak 2e-04)"]
    assert audio_problems(0.1 * rng.standard_normal(SR)) == [noise]  # an untrained WaveGlow's hiss
    # Speech with its pauses and a breath of noise under it: its loud frames are harmonic.
    pauses = np.concatenate([speech_like, np.zeros(SR // 4, np.float32), speech_like])
    assert audio_problems(pauses + 0.003 * rng.standard_normal(pauses.size)) == []


def test_inference_output_that_sounds_untrained_is_warned_about_in_one_line(tmp_path):
    with pytest.warns(UserWarning) as caught:
        save_wav(tmp_path / "dc.wav", np.full(SR, 0.2, dtype=np.float32), SR)
    message = str(caught[0].message)
    assert message == (f"{tmp_path / 'dc.wav'} has a DC offset of 0.200 (its mean; speech's is near 0): what an "
                       "untrained or briefly trained model writes (see 'What to expect' in README.md)")
