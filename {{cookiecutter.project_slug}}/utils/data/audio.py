"""Audio: the ``audio`` config section, log-mel spectrograms framed as each model's reference frames them (NVIDIA's
``TacotronSTFT``, jik876's ``mel_spectrogram``), and reading and writing wav files."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path
from typing import Optional, Union

import numpy as np
import soundfile as sf
import soxr
import torch
from pydantic import Field, model_validator
from torch import nn

from utils.config import Section, cross_check_error
from utils.data.corpus import DataError, PathLike
from utils.framing import UNRESOLVED_FRAMING, Framing


ArrayLike = Union[torch.Tensor, np.ndarray]


class AudioConfig(Section):
    """The ``audio`` section: signal settings shared by every model (NVIDIA's LJSpeech defaults)."""

    sampling_rate: int = Field(22050, gt=0)  # Hz
    n_fft: int = Field(1024, gt=0)  # samples
    hop_length: int = Field(256, gt=0)  # samples between frames
    win_length: int = Field(1024, gt=0)  # samples
    n_mels: int = Field(80, gt=0)
    fmin: float = Field(0.0, ge=0)  # Hz
    fmax: float = 8000.0  # Hz
    max_wav_value: float = Field(32768.0, gt=0)  # full scale of 16-bit PCM
    mel_framing: Optional[Framing] = None  # None: the model's reference (or data.mel_dir's), set by apply_recipe

    @property
    def framing(self) -> str:
        """``mel_framing``, or :data:`UNRESOLVED_FRAMING` when it is None."""
        return self.mel_framing or UNRESOLVED_FRAMING

    @model_validator(mode="after")
    def consistent(self) -> "AudioConfig":
        """The window and the hop fit in the FFT; ``fmin < fmax <= sampling_rate / 2`` (Nyquist)."""
        for key in ("win_length", "hop_length"):
            if getattr(self, key) > self.n_fft:
                raise cross_check_error(f"config key 'audio.{key}' ({getattr(self, key)}) must not exceed "
                                        f"audio.n_fft ({self.n_fft})", key, "n_fft")
        if not (self.fmin < self.fmax and 2 * self.fmax <= self.sampling_rate):
            raise cross_check_error(
                "config keys 'audio.fmin' and 'audio.fmax' must satisfy fmin < fmax <= sampling_rate / 2, "
                f"got fmin={self.fmin}, fmax={self.fmax}, sampling_rate={self.sampling_rate}",
                "fmin", "fmax", "sampling_rate")
        return self


def dynamic_range_compression(x: torch.Tensor, C: float = 1.0, clip_val: float = 1e-5) -> torch.Tensor:
    """Log-compress linear magnitudes (any shape): ``log(clamp(x, min=clip_val) * C)``, silence at ``log(1e-5) ~
    -11.5``. NVIDIA's reference (``audio_processing.dynamic_range_compression``)."""
    return torch.log(torch.clamp(x, min=clip_val) * C)


class MelSpectrogram(nn.Module):
    """Waveform -> log-mel spectrogram, framed as ``framing``'s reference frames it (``tests/test_parity_mel.py``).

    Audio ``(B, T)`` or ``(T,)`` float samples in [-1, 1] becomes ``(B, n_mels, frames)`` or ``(n_mels, frames)``
    (:meth:`num_frames`). ``"nvidia"``: NVIDIA's ``TacotronSTFT`` (their ``stft.py``), ``pad = n_fft // 2``
    (``1 + T // hop_length`` frames, frame ``k`` centred on sample ``k * hop_length``). ``"jik876"``:
    jik876's ``mel_spectrogram``, ``pad = (n_fft - hop_length) // 2`` (``T // hop_length`` frames for even
    ``n_fft - hop_length``, frame ``k`` centred on hop ``k``'s middle). Method: reflect-pad by ``pad``, ``torch.stft``
    (``center=False``, periodic Hann window), magnitude (jik876's ``sqrt(|X|^2 + 1e-9)``, NVIDIA's ``|X|``), Slaney mel
    filterbank (:func:`slaney_mel_filters`), ``log(clamp(mel, 1e-5))``. Raises ValueError for an unknown ``framing``.
    """

    def __init__(self, audio_cfg: AudioConfig):
        super().__init__()
        n_fft, hop_length, framing = audio_cfg.n_fft, audio_cfg.hop_length, audio_cfg.framing
        pads = {"nvidia": n_fft // 2, "jik876": (n_fft - hop_length) // 2}
        if framing not in pads:
            raise ValueError(f"MelSpectrogram: framing must be one of {', '.join(pads)}, got {framing!r}")
        self.n_fft, self.hop_length, self.win_length = n_fft, hop_length, audio_cfg.win_length
        self.framing, self.pad = framing, pads[framing]
        mel_basis = slaney_mel_filters(audio_cfg.sampling_rate, n_fft, audio_cfg.n_mels, audio_cfg.fmin, audio_cfg.fmax)
        self.register_buffer("mel_basis", torch.from_numpy(mel_basis).float())  # (n_mels, n_fft // 2 + 1)
        self.register_buffer("window", torch.hann_window(audio_cfg.win_length))

    @property
    def min_samples(self) -> int:
        """The fewest samples :meth:`forward` frames: ``max(n_fft - 2 * pad, pad + 1)`` (reflect pad needs > pad)."""
        return max(self.n_fft - 2 * self.pad, self.pad + 1)

    def num_frames(self, num_samples: int) -> int:
        """Frames produced for ``num_samples`` samples: ``(T + 2 * pad - n_fft) // hop_length + 1`` (see the class)."""
        return (num_samples + 2 * self.pad - self.n_fft) // self.hop_length + 1

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """Log-mel of ``audio``: ``(B, T)`` -> ``(B, n_mels, frames)``, ``(T,)`` -> ``(n_mels, frames)``. Raises
        ValueError if ``audio`` is not 1-D or 2-D, not floating point, or shorter than :attr:`min_samples`."""
        if audio.dim() not in (1, 2):
            raise ValueError(f"MelSpectrogram expects audio of shape (B, T) or (T,), got {tuple(audio.shape)}")
        if not audio.is_floating_point():
            raise ValueError(f"MelSpectrogram expects float audio in [-1, 1], got dtype {audio.dtype} "
                             "(divide integer PCM by max_wav_value first)")
        if audio.shape[-1] < self.min_samples:
            raise ValueError(f"MelSpectrogram: audio has {audio.shape[-1]} samples, at least {self.min_samples} are "
                             f"needed for n_fft={self.n_fft}, hop_length={self.hop_length} ({self.framing} framing)")
        squeeze = audio.dim() == 1
        batch = (audio.unsqueeze(0) if squeeze else audio).to(self.window.dtype)
        # F.pad's reflect mode wants a channel axis: (B, 1, T).
        padded = nn.functional.pad(batch.unsqueeze(1), (self.pad, self.pad), mode="reflect").squeeze(1)
        spec = torch.stft(padded, n_fft=self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                          window=self.window, center=False, return_complex=True)  # (B, n_fft // 2 + 1, frames)
        if self.framing == "jik876":  # its magnitude: sqrt(re^2 + im^2 + 1e-9)
            magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        else:
            magnitude = spec.abs()
        log_mel = dynamic_range_compression(torch.matmul(self.mel_basis, magnitude))  # (B, n_mels, frames)
        return log_mel.squeeze(0) if squeeze else log_mel


F_SP, MIN_LOG_HZ, LOGSTEP = 200.0 / 3, 1000.0, np.log(6.4) / 27.0  # Slaney's mel scale: linear, then logarithmic


def hz_to_mel(hz: ArrayLike) -> np.ndarray:
    """Slaney's mel scale (librosa's ``hz_to_mel(htk=False)``): ``hz / F_SP`` below 1 kHz, logarithmic above."""
    hz = np.asanyarray(hz, dtype=np.float64)
    above = MIN_LOG_HZ / F_SP + np.log(np.maximum(hz, MIN_LOG_HZ) / MIN_LOG_HZ) / LOGSTEP
    return np.where(hz >= MIN_LOG_HZ, above, hz / F_SP)


def slaney_mel_filters(sampling_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """float32 ``(n_mels, n_fft // 2 + 1)``: triangles on Slaney's mel scale from ``fmin`` to ``fmax`` Hz, each of area
    normalised (``norm="slaney"``); bit for bit ``librosa.filters.mel`` (whose import costs every process 2 s)."""
    mels = np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2)
    edges = np.where(mels >= MIN_LOG_HZ / F_SP, MIN_LOG_HZ * np.exp(LOGSTEP * (mels - MIN_LOG_HZ / F_SP)), F_SP * mels)
    ramps, widths = np.subtract.outer(edges, np.fft.rfftfreq(n=n_fft, d=1.0 / sampling_rate)), np.diff(edges)
    weights = np.maximum(0, np.minimum(-ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None])).astype(np.float32)
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights


def vocoder_mismatch(vocoder: AudioConfig, mels: AudioConfig) -> str:
    """The audio settings in which a vocoder's ``audio`` section differs from that of the mels it is to vocode, as
    ``"sampling_rate 16000, the mels' 22050; ..."`` (empty: none); the mel framing aside, as another framing shifts the
    frames by half a hop, which a vocoder does not notice."""
    theirs, ours = (audio.model_dump(exclude={"mel_framing"}) for audio in (vocoder, mels))
    return "; ".join(f"{key} {theirs[key]}, the mels' {value}" for key, value in ours.items() if theirs[key] != value)


def check_wav_output(path: Union[str, Path]) -> Path:
    """``path`` as a Path if :func:`save_wav` can write a wav there (checked before any work is done). Raises ValueError
    if ``path`` is an existing folder, or its name does not end in ``.wav``."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--output {path} is a folder; give a file name ending in .wav")
    if path.suffix.lower() != ".wav":
        got = f"'{path.suffix}'" if path.suffix else "no extension"
        raise ValueError(f"--output {path}: has {got}; this writes 16-bit PCM WAV only, give a name ending in .wav")
    return path


def save_wav(path: Union[str, Path], audio: ArrayLike, sampling_rate: int) -> Path:
    """Write ``audio`` (``(T,)`` float samples, tensor or array, clipped to [-1, 1]) as mono 16-bit PCM wav at
    ``sampling_rate`` Hz, creating parent folders; warn about :func:`audio_problems`. Returns ``path`` as a Path. Raises
    ValueError naming ``path`` if ``audio`` is not 1-D, is empty, or holds NaN/inf."""
    path = Path(path)
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().float().numpy()
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"save_wav {path}: expected mono audio of shape (T,), got {audio.shape}")
    if audio.size == 0:
        raise ValueError(f"save_wav {path}: audio is empty")
    if not np.isfinite(audio).all():
        raise ValueError(f"save_wav {path}: audio holds NaN or infinite values")
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(audio, -1.0, 1.0), sampling_rate, subtype="PCM_16")
    problems = audio_problems(audio)
    if problems:
        warnings.warn(f"{path} {'; '.join(problems)}: what an untrained or briefly trained model writes (see 'What "
                      "to expect' in README.md)")
    return path


CLIPPED_SHARE, DC_OFFSET, SILENT_PEAK = 0.01, 0.05, 1e-3
"""What :func:`audio_problems` calls clipped (share of samples at full scale), a DC offset (mean) and silent (peak)."""


def audio_problems(audio: ArrayLike) -> list[str]:
    """What is wrong with ``(T,)`` float samples (full scale 1.0, before clipping) as speech, or ``[]``: clipped, a DC
    offset, nearly silent, like noise (``["is 77% clipped (samples at full scale)", ...]``)."""
    audio = np.asarray(audio, dtype=np.float64)
    clipped, mean, peak = float(np.mean(np.abs(audio) >= 0.999)), float(np.mean(audio)), float(np.max(np.abs(audio)))
    found = [f"is {100 * clipped:.0f}% clipped (samples at full scale)"] if clipped > CLIPPED_SHARE else []
    found += [f"has a DC offset of {mean:.3f} (its mean; speech's is near 0)"] if abs(mean) > DC_OFFSET else []
    found += [f"is nearly silent (peak {peak:.0e})"] if peak < SILENT_PEAK else []
    flatness = spectral_flatness(audio - mean) if np.max(np.abs(audio - mean)) >= SILENT_PEAK else 0.0
    return found + ([f"sounds like noise (spectral flatness {flatness:.2f}; speech's is below {NOISE_FLATNESS})"]
                    if flatness > NOISE_FLATNESS else [])


NOISE_FLATNESS = 0.3
"""Above this :func:`spectral_flatness` is noise: white noise 0.56, an untrained vocoder's 0.50-0.56, speech <= 0.01."""


def spectral_flatness(audio: np.ndarray, frame: int = 1024, hop: int = 256) -> float:
    """Wiener entropy: the median, over the Hann-windowed ``frame``-sample frames of ``audio`` ``(T,)`` every ``hop``
    samples (at most 1000 frames) within 40 dB of the loudest, of the power spectrum's geometric over its arithmetic
    mean (DC left out): 0 for a tone, ``exp(-γ)`` = 0.56 for white noise."""
    audio = np.pad(audio, (0, max(0, frame - audio.size)))
    every = max(hop, audio.size // 1000)
    frames = np.lib.stride_tricks.sliding_window_view(audio, frame)[::every] * np.hanning(frame)
    power = np.abs(np.fft.rfft(frames, axis=1)[:, 1:]) ** 2 + 1e-20
    loud = power[power.sum(axis=1) >= 1e-4 * power.sum(axis=1).max()]
    return float(np.median(np.exp(np.log(loud).mean(axis=1)) / loud.mean(axis=1)))


def check_wav_not_truncated(path: Path) -> None:
    """Raise DataError if a RIFF/WAVE file's ``data`` chunk claims more bytes than the file holds (other formats pass):
    libsndfile silently reads what is there of a wav cut short (an interrupted copy)."""
    with open(path, "rb") as f:
        header = f.read(12)
        if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            return
        file_size = path.stat().st_size
        while True:
            chunk = f.read(8)
            if len(chunk) < 8:
                return
            chunk_id, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if chunk_id == b"data":
                available = file_size - f.tell()
                # 0 and 0xFFFFFFFF mark "length unknown" (streamed writers); nothing to compare then.
                if size not in (0, 0xFFFFFFFF) and size > available:
                    raise DataError(f"truncated wav file: {path} (data chunk declares {size} bytes, "
                                    f"the file holds {available})")
                return
            f.seek(size + (size % 2), 1)


def resampled_length(frames: int, file_rate: int, sampling_rate: int) -> int:
    """Samples :func:`resample` makes of ``frames`` at ``file_rate`` Hz: ``ceil(frames * (sampling_rate /
    file_rate))``, librosa's ``resample`` length (its float expression: the same count to the sample)."""
    return frames if file_rate == sampling_rate else int(np.ceil(frames * (float(sampling_rate) / file_rate)))


def resample(audio: np.ndarray, file_rate: int, sampling_rate: int) -> np.ndarray:
    """``(T,)`` float32 samples at ``file_rate`` Hz resampled to ``sampling_rate`` Hz: soxr at its "HQ" quality (a
    linear-phase windowed-sinc filter, 20-bit precision; soxr.sourceforge.net), cut or zero-padded to
    :func:`resampled_length`: ``librosa.resample(res_type="soxr_hq")``'s samples, bit for bit."""
    out = soxr.resample(audio, file_rate, sampling_rate, quality="soxr_hq")
    size = resampled_length(audio.shape[0], file_rate, sampling_rate)
    return np.pad(out, (0, max(0, size - out.shape[0])))[:size]


def decoding() -> dict[str, str]:
    """What decodes and resamples the corpus's audio, with versions: ``{"decoder": "soundfile 0.13.1 (libsndfile
    1.2.2)", "resampler": "soxr 0.5.0 (HQ)"}``. Each checkpoint records it: a library's next version may decode a
    clip otherwise (as ``datasets`` 4 did when it moved to torchcodec)."""
    return {"decoder": f"soundfile {sf.__version__} (libsndfile {sf.__libsndfile_version__})",
            "resampler": f"soxr {soxr.__version__} (HQ)"}


def read_clip(clip: sf.SoundFile, frames: int, sampling_rate: int, name: str) -> torch.Tensor:
    """``frames`` samples of the open ``clip`` from where it stands, as :func:`load_wav` gives a file's. Raises
    DataError naming ``name``: none read, or NaN/inf among them."""
    audio = clip.read(frames, dtype="float32", always_2d=True)  # (T, channels)
    if audio.shape[0] == 0:
        raise DataError(f"audio file has no samples: {name}")
    if not np.isfinite(audio).all():
        raise DataError(f"audio file holds NaN or infinite samples: {name}")
    audio = audio.mean(axis=1)
    if clip.samplerate != sampling_rate:
        audio = resample(audio, clip.samplerate, sampling_rate)
    return torch.from_numpy(np.ascontiguousarray(np.clip(audio, -1.0, 1.0).astype(np.float32)))


def load_wav(path: PathLike, sampling_rate: int) -> torch.Tensor:
    """A sound file as a float32 tensor ``(T,)`` of mono samples in [-1, 1] at ``sampling_rate`` Hz, decoded by
    soundfile (libsndfile: WAV, FLAC, Ogg, MP3): 16-bit PCM / 32768 (NVIDIA's ``load_wav_to_torch`` then ``/
    max_wav_value``), channels averaged, another rate resampled (:func:`resample`) and clipped. Raises DataError: a
    file missing, unreadable, cut short, empty or non-finite."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"wav file not found: {path}")
    try:
        check_wav_not_truncated(path)
        with sf.SoundFile(str(path)) as clip:
            return read_clip(clip, clip.frames, sampling_rate, str(path))
    except (sf.LibsndfileError, RuntimeError) as err:
        raise DataError(f"cannot read audio file {path}: {err}") from None
    except OSError as err:  # no permission, an I/O error of the disk or network file system
        raise DataError(f"cannot read audio file {path}: {err.strerror or err}") from None
