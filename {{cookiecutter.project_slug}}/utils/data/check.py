"""The corpus check ``train.py`` runs before training: every clip readable, whole, long enough, not silent, with a
transcript.

A bad clip found at step 30 000 costs a crashed run (and the same crash again after every resume); found at start-up it
costs a line. :func:`check_corpus` reads every clip's header, and its samples only until one is not silent (the first
block, for any clip with sound in its first second or so) in integer (PCM) wavs, which cannot hold anything but numbers,
and all of its samples in float wavs, in parallel threads, and finds:

* clips whose wav is missing or is a folder, or whose header cannot be read (not a sound file, no permission);
* truncated wavs: a ``data`` chunk that promises more bytes than the file holds (an interrupted copy);
* clips shorter than ``min_samples`` at the training sampling rate (too short for one STFT window);
* silent clips: no sample above :data:`SILENCE_PEAK` of full scale (an all-zero recording), and NaN or infinite samples
  anywhere in a float wav;
* transcripts with no letter or digit (an emoji-only or empty row), and whatever the model's own check refuses
  (``ModelSpec.check_text``: a text-to-speech model refuses a transcript with no symbol of its table).

The corpus lines that name no usable clip (malformed lines, missing wavs) are found earlier, by
:func:`utils.data_utils.load_splits` with its ``bad`` list; ``train.py`` lists both together.

Any sample format soundfile reads is fine: 8-bit unsigned PCM, for one, is read as float in [-1, 1) like 16-bit PCM (its
128 is silence), so an 8-bit clip passes the check and trains.

What each clip's reading found is cached (:func:`default_cache_file`: outside the corpus and the run's output folder) by
path, size and modification time, so a second run over a large corpus reads only what changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import soundfile as sf
from tqdm import tqdm

from model import ModelSpec
from utils.checkpoint.files import atomic_write_bytes
from utils.config import Config, ConfigError
from utils.data.audio import MelSpectrogram, check_wav_not_truncated
from utils.data.corpus import BadClip, DataError, Utterance, load_splits
from utils.run import check_output_dir
from utils.run_log import one_line

__all__ = ["BadClip", "SILENCE_PEAK", "check_corpus", "default_cache_file", "describe"]

SILENCE_PEAK = 1e-4
"""A clip none of whose samples exceeds this (in full-scale units, about -80 dBFS: 3 steps of 16-bit PCM) is
silent: nothing to learn from, and a mel of only the floor value."""

_CACHE_VERSION = 3
"""Part of every cache entry's key: entries written by an older check (without the silence test, or reading a float
wav only up to its first sound) are read again."""

_FIRST_BLOCK, _BLOCK = 2048, 65536
"""Frames read at a time when looking for a sample that is not silent: a small first block (4 KB of 16-bit mono,
enough for nearly every recording), then larger ones (3 s at 22050 Hz)."""


def _loudest_until_sound(path: Path) -> float:
    """The peak of ``path``'s samples (full-scale units, all channels), read block by block. An integer (PCM) wav is read
    only until the first block holding a sample above :data:`SILENCE_PEAK` (for a clip with sound the result is then
    only known to be above it); a float wav is read to its end, since any of its samples may be NaN.

    Raises:
        DataError: a float wav holds NaN or infinite samples (the first one is named).
    """
    peak, size, start = 0.0, _FIRST_BLOCK, 0
    with sf.SoundFile(str(path)) as clip:
        whole = clip.subtype in ("FLOAT", "DOUBLE")
        while whole or peak <= SILENCE_PEAK:
            block = clip.read(size, dtype="float32", always_2d=True)
            if block.size == 0:
                break
            finite = np.isfinite(block).all(axis=1)
            if not finite.all():
                raise DataError(f"holds NaN or infinite samples (the first at sample {start + int(np.argmin(finite))})")
            peak = max(peak, float(np.abs(block).max()))
            start += block.shape[0]
            size = _BLOCK
    return peak


def _inspect(path: Path) -> dict:
    """``{"frames", "rate", "silent_peak"}`` of a sound file (``silent_peak``: its peak when it is silent, else ``None``),
    or ``{"error": reason}``: what :func:`check_corpus` caches per clip."""
    if path.is_dir():
        return {"error": "is a folder, not a wav file"}
    if not path.exists():
        return {"error": "wav not found"}
    try:
        check_wav_not_truncated(path)
        info = sf.info(str(path))
    except DataError as err:  # "truncated wav file: PATH (data chunk declares ...)": the path is named apart
        return {"error": str(err).replace(f": {path}", "")}
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        return {"error": f"unreadable header ({str(err).splitlines()[0] if str(err) else type(err).__name__})"}
    try:
        peak = _loudest_until_sound(path)
    except DataError as err:
        return {"error": str(err)}
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        return {"error": f"unreadable samples ({str(err).splitlines()[0] if str(err) else type(err).__name__})"}
    return {"frames": info.frames, "rate": info.samplerate, "silent_peak": None if peak > SILENCE_PEAK else peak}


def _stat_key(path: Path) -> Optional[str]:
    try:
        stat = path.stat()
    except OSError:
        return None
    return f"v{_CACHE_VERSION}:{stat.st_size}:{stat.st_mtime_ns}"


def default_cache_file(dataset_path: str | Path) -> Path:
    """``$XDG_CACHE_HOME/clip_headers/<hash of the corpus's absolute path>.json`` (``~/.cache`` by default)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(str(Path(dataset_path).resolve()).encode()).hexdigest()[:16]
    return root / "clip_headers" / f"{digest}.json"


def check_corpus(utterances: Sequence[Utterance], sampling_rate: int, min_samples: int,
                 text_check: Optional[Callable[[str], Optional[str]]] = None, cache_file: Optional[Path] = None,
                 workers: Optional[int] = None, progress: bool = False) -> list[BadClip]:
    """Every clip of ``utterances`` that cannot be trained on, with the reason, in corpus order.

    Args:
        utterances: from :func:`utils.data_utils.load_splits` (both splits).
        sampling_rate: the training rate in Hz (a clip at another rate is resampled: its length is converted).
        min_samples: the fewest samples a clip may have at ``sampling_rate``.
        text_check: the model's own transcript check: ``text -> reason`` or ``None`` when the text is fine.
        cache_file: where what was read of each clip (header, silence) is cached (JSON; read if present, rewritten; a
            cache that cannot be written is left unwritten); ``None``: no cache.
        workers: reading threads (default: 4 per CPU core, at most 32).
        progress: show a progress bar.

    Returns:
        the bad clips (:class:`~utils.data_utils.BadClip`: id, wav path, reason); empty when all are fine. A clip has
        one reason, the first found in the order of the module's list.
    """
    cache = _read_cache(cache_file)
    keys = {utt.id: _stat_key(utt.wav_path) for utt in utterances}
    todo = [utt for utt in utterances if keys[utt.id] is None or cache.get(str(utt.wav_path), {}).get("key")
            != keys[utt.id]]
    threads = workers or min(32, 4 * (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        headers = pool.map(_inspect, [utt.wav_path for utt in todo])
        for utt, header in tqdm(zip(todo, headers), total=len(todo), desc="checking clips", unit="clip",
                                disable=not progress or len(todo) < 1000):
            cache[str(utt.wav_path)] = {"key": keys[utt.id], **header}
    if cache_file is not None and todo:
        _write_cache(cache_file, cache)
    bad = []
    for utt in utterances:
        reason = _clip_problem(cache[str(utt.wav_path)], sampling_rate, min_samples)
        if reason is None and not any(ch.isalnum() for ch in utt.text):
            reason = f"transcript {utt.text!r} has no letter or digit"
        if reason is None and text_check is not None:
            reason = text_check(utt.text)
        if reason is not None:
            bad.append(BadClip(utt.id, str(utt.wav_path), reason))
    return bad


def _read_cache(cache_file: Optional[Path]) -> dict:
    """What an earlier check read of each clip; empty without a cache file or for a damaged one (rebuilt, never
    trusted)."""
    if cache_file is None or not cache_file.is_file():
        return {}
    try:
        return json.loads(cache_file.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _write_cache(cache_file: Path, cache: dict) -> None:
    """Replace the cache file atomically; a folder that cannot be written (a read-only home) keeps none: the check
    still ran, the next run reads the headers again."""
    tmp = cache_file.with_name(f".{cache_file.name}.tmp{os.getpid()}")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    except OSError:
        tmp.unlink(missing_ok=True)


def _clip_problem(header: dict, sampling_rate: int, min_samples: int) -> Optional[str]:
    """Why a clip read as ``header`` (:func:`_inspect`) cannot be trained on: unreadable, too short, silent; or
    ``None``."""
    if header.get("error") is not None:
        return header["error"]
    samples = header["frames"] * sampling_rate // header["rate"]
    if samples < min_samples:
        return f"too short: {samples} samples at {sampling_rate} Hz, fewer than {min_samples} (one STFT window)"
    if header["silent_peak"] is not None:
        return ("silent: every sample is zero" if header["silent_peak"] == 0 else
                f"silent: its loudest sample is {header['silent_peak']:.1e} of full scale, at most "
                f"{SILENCE_PEAK:.0e}")
    return None


def describe(bad: Sequence[BadClip], shown: int = 20) -> str:
    """One line naming the first ``shown`` bad clips and how many there are: ``'SYN-0003' (path): reason; ...``."""
    named = "; ".join(f"'{clip.id}' ({clip.path}): {clip.reason}" for clip in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} bad clip(s): {named}{more}"


def prepare_run(cfg: Config, spec: ModelSpec, output_dir: Path) -> tuple[str, object]:
    """Rank 0's checks before any training time is spent: a writable output folder, then every clip of the corpus
    (:mod:`utils.data.check`). The outcome is ``("error", message)`` or ``("skip", ids to leave out)``, which rank 0
    broadcasts so that every rank acts on it.

    Bad clips are of two kinds, listed together (first the corpus lines, in file order, then the clips, in corpus
    order): corpus lines that name no usable clip (a malformed line, listed as ``metadata.csv:<line>``; a repeated id;
    an empty transcript; a wav that is missing or a folder: :func:`load_splits` with a ``bad`` list), and clips that
    cannot be trained on (unreadable, truncated, too short, silent, a transcript without a usable character:
    :func:`check_corpus`). With ``data.on_bad_clip=skip`` they are listed in ``OUTPUT/skipped_clips.txt`` (id, path,
    reason per line), a warning line says how many and names the first 20, and their ids are returned for
    ``data.exclude``; with ``error`` the message names the first 20 and how many there are.
    """
    listed: list = []  # the corpus lines load_splits refused (BadClip)
    try:
        check_output_dir(output_dir)
        train_utts, val_utts = load_splits(cfg.data, bad=listed)
    except (ConfigError, DataError) as err:
        return "error", one_line(err)
    text_check = (lambda text: spec.training.check_text(text, cfg)) if spec.training.check_text is not None else None
    bad = listed + check_corpus([*train_utts, *val_utts], cfg.audio.sampling_rate,
                                MelSpectrogram.from_config(cfg.audio).min_samples, text_check,
                                cache_file=default_cache_file(cfg.data.dataset_path), progress=True)
    if not bad:
        return "skip", []
    if cfg.data.on_bad_clip == "error":
        return "error", (f"{describe(bad)} (in {cfg.data.dataset_path}); fix or remove them, or set "
                         "data.on_bad_clip=skip to train without them")
    listing = output_dir / "skipped_clips.txt"
    atomic_write_bytes(listing, "".join(f"{c.id}\t{c.path}\t{c.reason}\n" for c in bad).encode())
    print(f"warning: leaving out {len(bad)} bad clip(s), listed in {listing} ({describe(bad)})", file=sys.stderr,
          flush=True)
    return "skip", [clip.id for clip in bad]
