"""The corpus check before training: audio missing, a folder, unreadable or truncated; clips shorter than one STFT
window, silent or with NaN/inf samples; transcripts without a letter or digit, or refused by ``check_text``."""

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
from utils.config import Config
from utils.data.audio import AudioConfig, MelSpectrogram
from utils.data.corpora import load_splits
from utils.data.corpus import BadClip, DataError, Utterance
from utils.data.sources import opened, parse
from utils.run import check_output_dir

SILENCE_PEAK = 1e-4
"""A clip none of whose samples exceeds this (full scale 1, about -80 dBFS: 3 steps of 16-bit PCM) is silent."""

_CACHE_VERSION = 3  # in every cache entry's key: an older check's entries are read again
_FIRST_BLOCK, _BLOCK = 2048, 65536  # frames read at a time: a small first block (nearly every clip's sound), then 3 s


def _loudest_until_sound(clip: sf.SoundFile, frames: int) -> float:
    """The peak of the open ``clip``'s next ``frames`` samples (full scale 1), read block by block: an integer file's
    until a sample is above :data:`SILENCE_PEAK`, a float file's to the end. DataError naming the first NaN or
    infinite sample."""
    peak, size, start = 0.0, _FIRST_BLOCK, 0
    whole = clip.subtype in ("FLOAT", "DOUBLE")
    while (whole or peak <= SILENCE_PEAK) and start < frames:
        block = clip.read(min(size, frames - start), dtype="float32", always_2d=True)
        if block.size == 0:
            break
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            raise DataError(f"holds NaN or infinite samples (the first at sample {start + int(np.argmin(finite))})")
        peak = max(peak, float(np.abs(block).max()))
        start += block.shape[0]
        size = _BLOCK
    return peak


def _inspect(source: str) -> dict:
    """What :func:`check_corpus` caches per clip: ``{"frames", "rate", "silent_peak"}`` (the peak of a silent clip,
    else ``None``) or ``{"error": reason}``."""
    path = parse(source)[0]
    what = "header"
    try:
        with opened(source) as (clip, frames):
            rate, what = clip.samplerate, "samples"
            peak = _loudest_until_sound(clip, frames)
    except DataError as err:  # "truncated wav file: PATH (data chunk declares ...)": the path is named apart
        return {"error": str(err).replace(f": {path}", "")}
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        return {"error": f"unreadable {what} ({str(err).splitlines()[0] if str(err) else type(err).__name__})"}
    return {"frames": frames, "rate": rate, "silent_peak": None if peak > SILENCE_PEAK else peak}


def _stat_key(source: str) -> Optional[str]:
    try:
        stat = parse(source)[0].stat()
    except OSError:
        return None
    return f"v{_CACHE_VERSION}:{stat.st_size}:{stat.st_mtime_ns}"


def default_cache_file(dataset_path: str | Path) -> Path:
    """``$XDG_CACHE_HOME/clip_headers/<hash of the corpus's absolute path>.json`` (``~/.cache`` by default)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha1(str(Path(dataset_path).resolve()).encode()).hexdigest()[:16]
    return root / "clip_headers" / f"{digest}.json"


def check_corpus(utterances: Sequence[Utterance], audio_cfg: AudioConfig,
                 text_check: Optional[Callable[[str], Optional[str]]] = None, cache_file: Optional[Path] = None,
                 workers: Optional[int] = None, progress: bool = False) -> list[BadClip]:
    """The clips of ``utterances`` that cannot be trained on (:class:`BadClip`, the first reason found), in corpus
    order: headers read in threads (``workers``: default 4 per core, at most 32), samples until one is not silent (all
    of a float wav's, which may hold NaN), at least ``MelSpectrogram.min_samples`` of them; ``text_check``: the
    model's ``text -> reason or None``; ``cache_file``: what was read of each clip, by path, size and mtime."""
    sampling_rate, min_samples = audio_cfg.sampling_rate, MelSpectrogram(audio_cfg).min_samples
    cache = _read_cache(cache_file)
    keys = {utt.id: _stat_key(utt.audio) for utt in utterances}
    todo = [utt for utt in utterances if keys[utt.id] is None or cache.get(utt.audio, {}).get("key") != keys[utt.id]]
    with ThreadPoolExecutor(max_workers=workers or min(32, 4 * (os.cpu_count() or 1))) as pool:
        headers = pool.map(_inspect, [utt.audio for utt in todo])
        for utt, header in tqdm(zip(todo, headers), total=len(todo), desc="checking clips", unit="clip",
                                disable=not progress or len(todo) < 1000):
            cache[utt.audio] = {"key": keys[utt.id], **header}
    if cache_file is not None and todo:
        _write_cache(cache_file, cache)
    bad = []
    for utt in utterances:
        reason = _clip_problem(cache[utt.audio], sampling_rate, min_samples)
        if reason is None and not any(ch.isalnum() for ch in utt.text):
            reason = f"transcript {utt.text!r} has no letter or digit"
        if reason is None and text_check is not None:
            reason = text_check(utt.text)
        if reason is not None:
            bad.append(BadClip(utt.id, utt.audio, reason))
    return bad


def _read_cache(cache_file: Optional[Path]) -> dict:
    try:
        return json.loads(cache_file.read_text()) if cache_file is not None else {}
    except (OSError, json.JSONDecodeError):  # missing, a folder, damaged
        return {}


def _write_cache(cache_file: Path, cache: dict) -> None:
    tmp = cache_file.with_name(f".{cache_file.name}.tmp{os.getpid()}")
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    except OSError:  # a read-only home: no cache
        tmp.unlink(missing_ok=True)


def _clip_problem(header: dict, sampling_rate: int, min_samples: int) -> Optional[str]:
    if header.get("error") is not None:
        return header["error"]
    samples = header["frames"] * sampling_rate // header["rate"]
    if samples < min_samples:
        return f"too short: {samples} samples at {sampling_rate} Hz, fewer than {min_samples} (one STFT window)"
    if header["silent_peak"] is not None:
        return ("silent: every sample is zero" if header["silent_peak"] == 0 else
                f"silent: its loudest sample is {header['silent_peak']:.1e} of full scale, at most {SILENCE_PEAK:.0e}")
    return None


def describe(bad: Sequence[BadClip], shown: int = 20) -> str:
    """One line naming the first ``shown`` bad clips and how many there are: ``'SYN-0003' (path): reason; ...``."""
    named = "; ".join(f"'{clip.id}' ({clip.path}): {clip.reason}" for clip in bad[:shown])
    more = f"; and {len(bad) - shown} more" if len(bad) > shown else ""
    return f"{len(bad)} bad clip(s): {named}{more}"


def prepare_run(cfg: Config, spec: ModelSpec, output_dir: Path) -> list[str]:
    """Rank 0's checks before training: a ConfigError for an output folder that is not writable, a DataError naming
    bad corpus lines and clips, or with ``data.on_bad_clip=skip`` their ids for ``data.exclude``, listed in
    ``OUTPUT/skipped_clips.txt`` and named in a warning. The reader's notes (the layout ``auto`` found, what it did
    not read) are said first, a line each."""
    listed: list = []  # the corpus lines load_splits refused
    notes: list[str] = []
    check_output_dir(output_dir)
    train_utts, val_utts = load_splits(cfg.data, bad=listed, notes=notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    text_check = (lambda text: spec.training.check_text(text, cfg)) if spec.training.check_text is not None else None
    bad = listed + check_corpus([*train_utts, *val_utts], cfg.audio, text_check,
                                cache_file=default_cache_file(cfg.data.dataset_path), progress=True)
    if not bad:
        return []
    if cfg.data.on_bad_clip == "error":
        raise DataError(f"{describe(bad)} (in {cfg.data.dataset_path}); fix or remove them, or set "
                        "data.on_bad_clip=skip to train without them")
    listing = output_dir / "skipped_clips.txt"
    atomic_write_bytes(listing, "".join(f"{c.id}\t{c.path}\t{c.reason}\n" for c in bad).encode())
    print(f"warning: leaving out {len(bad)} bad clip(s), listed in {listing} ({describe(bad)})", file=sys.stderr,
          flush=True)
    return [clip.id for clip in bad]
